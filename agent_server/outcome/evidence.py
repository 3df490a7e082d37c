"""The structured facts rows 5-10 read, and what says a process was killed (contract §7).

The vocabularies are the runtime's own: which codes name which row, which error
texts do (`OutcomeHints.error_codes`, `text_markers`, each adapter's). What is here
belongs to no CLI: the structured facts gathered from the normalised stream, and the
shell's and kernel's words for a killed process.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from agent_server.runtimes.stream import TurnStream

SIGNAL_EXIT_CODES = frozenset({130, 137, 143})
# `Killed` is the shell's exact word for SIGKILL; a lower-case "killed" is just prose.
OOM_TEXT = re.compile(
    r"(?-i:\bKilled\b)|out of memory|\boom[- ]?kill|cannot allocate memory|bad_alloc",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class Evidence:
    """The structured facts, lower-cased, that rows 5-10 read."""

    codes: frozenset[str]
    status: int | None

    @classmethod
    def of_stream(cls, stream: TurnStream, exit_status: int | None = None) -> Evidence:
        """The stream's own codes and status (else the HTTP status the CLI's exit code
        carries); else the last api_retry's reason."""
        status = stream.api_error_status
        primary = cls(
            codes=_lowered([*stream.error_codes, stream.api_error, stream.api_error_type]),
            status=status if status is not None else exit_status,
        )
        if primary.codes or primary.status is not None or not stream.api_retries:
            return primary
        # The result says nothing itself: the last retry's reason is why it failed.
        last = stream.api_retries[-1]
        status = last.get("error_status")
        error = last.get("error")
        return cls(
            codes=_lowered([error if isinstance(error, str) else None]),
            status=status if isinstance(status, int) and not isinstance(status, bool) else None,
        )


def _lowered(values: Iterable[str | None]) -> frozenset[str]:
    return frozenset(value.lower() for value in values if value)
