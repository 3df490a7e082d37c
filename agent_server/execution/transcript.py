"""The capped transcript of one turn: the raw stdout lines kept for `execution_log`.

A CLI may print without bound, so the transcript keeps lines only up to a byte
budget (`AGENT_SERVER_MAX_LOG_BYTES`) and a line budget (`MAX_LOG_LINES`). Every
line costs its bytes and `LINE_COST_BYTES` more (its newline and its bookkeeping:
an empty line is not free). Past either budget, lines are dropped and the
transcript says so (`truncated`), except the final result line: the controller
needs it on every record, so it is always kept, after whatever fitted.
"""

from __future__ import annotations

from typing import Any

LINE_COST_BYTES = 64
"""What a kept line costs beyond its bytes: its newline, its list slots, its object."""
MAX_LOG_LINES = 100_000
"""Lines a transcript keeps at most, whatever their size."""
MAX_LINE_BYTES = 1024 * 1024
"""A stdout line longer than this is dropped before anything reads it (its parse
alone would hold the event loop), and the transcript marked `truncated`. A real
result line (the model's whole reply) is far shorter."""
INLINE_ANSWER_BYTES = 256 * 1024
"""Up to this `Transcript.cost`, a turn's answer is built on the event loop, once its
CLI exited; past it, on a worker thread, so that no answer holds the
loop for more than a few milliseconds."""
PARSED_BUDGET = 64 * 1024
"""Bytes of lines whose parsed objects a transcript keeps (see `Transcript.append`)."""


class Transcript:
    """Raw stdout lines of one turn, kept up to `max_bytes` in total.

    Lines are kept in order until one does not fit; from then on every further
    line is dropped (the kept part stays a clean prefix, with no holes) and
    `truncated` is True. A result line that does not fit is kept anyway, after the
    prefix; a later over-budget result line replaces it, so memory stays bounded
    by `max_bytes` plus one line whatever the CLI prints. `size` counts line
    bytes; the budget counts each line's `LINE_COST_BYTES` too.
    """

    def __init__(self, max_bytes: int) -> None:
        """Start an empty transcript with a budget of `max_bytes` bytes."""
        if max_bytes < 0:
            msg = f"max_bytes must be >= 0, got {max_bytes}"
            raise ValueError(msg)
        self._max_bytes = max_bytes
        self._lines: list[bytes] = []
        self._parsed: list[dict[str, Any] | None] = []
        self._parsed_bytes = 0
        self._kept_bytes = 0
        self._cost = 0
        # Once one line overflowed, the budget is closed: keeping a later, smaller
        # line would leave a hole in the log that nobody could see.
        self._full = False
        self._late_result: bytes | None = None
        self._late_parsed: dict[str, Any] | None = None
        self._truncated = False

    def append(
        self, line: bytes, *, is_result: bool = False, parsed: dict[str, Any] | None = None
    ) -> None:
        """Keep `line` if it fits the budget, or always when it is the final result.

        `parsed` is the JSON object the line holds, when the parser read one: kept
        beside it, so the answer need not parse the line again. It is kept only for
        a line that is exactly its JSON (no whitespace around it), whose parse any
        reader gets the same, and only for the first `PARSED_BUDGET` bytes of lines
        (and the final result): a long turn's objects, alive until its answer, would
        make every garbage collection of the server walk them.
        """
        if parsed is not None and not (line[:1] == b"{" and line[-1:] == b"}"):
            parsed = None
        if parsed is not None and not is_result:
            if self._parsed_bytes + len(line) > PARSED_BUDGET:
                parsed = None
            else:
                self._parsed_bytes += len(line)
        cost = len(line) + LINE_COST_BYTES
        if (
            not self._full
            and self._cost + cost <= self._max_bytes
            and len(self._lines) < MAX_LOG_LINES
        ):
            self._lines.append(line)
            self._parsed.append(parsed)
            self._kept_bytes += len(line)
            self._cost += cost
            return
        self._full = True
        if not is_result:
            self._truncated = True
            return
        if self._late_result is not None:
            # Only the last result is "the final result"; the earlier one is dropped.
            self._truncated = True
        self._late_result = line
        self._late_parsed = parsed

    def lines(self) -> list[bytes]:
        """The kept lines in order (the over-budget result line, if any, last)."""
        if self._late_result is None:
            return list(self._lines)
        return [*self._lines, self._late_result]

    def entries(self) -> list[tuple[bytes, dict[str, Any] | None]]:
        """The kept lines as `lines()` orders them, each with its parsed object or None."""
        kept = list(zip(self._lines, self._parsed, strict=True))
        if self._late_result is not None:
            kept.append((self._late_result, self._late_parsed))
        return kept

    def skims(self, line: bytes) -> bool:
        """Take `line` without anything reading it, when nothing needs to: True if so.

        An empty (or blank) line holds no event and no secret: kept as it is. Once the
        budget is closed, a line that cannot be an event (no `{` first) is only
        dropped: a flood of junk costs a count, not a redaction, a parse and a live
        event each.
        """
        if not line.strip():
            self.append(line)
            return True
        if self._full and line.lstrip()[:1] != b"{":
            self._truncated = True
            return True
        return False

    def cut(self) -> None:
        """A line was dropped before it reached the transcript (over the line limit)."""
        self._truncated = True

    @property
    def truncated(self) -> bool:
        """True when at least one line was dropped."""
        return self._truncated

    @property
    def cost(self) -> int:
        """What the kept lines cost: their bytes and `LINE_COST_BYTES` each."""
        late = len(self._late_result) + LINE_COST_BYTES if self._late_result is not None else 0
        return self._cost + late

    @property
    def size(self) -> int:
        """Bytes of the kept lines (newlines not counted)."""
        late = len(self._late_result) if self._late_result is not None else 0
        return self._kept_bytes + late
