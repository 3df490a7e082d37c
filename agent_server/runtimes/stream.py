"""What a runtime's output stream said, normalised across runtimes.

Each runtime adapter parses its own event stream (Claude Code stream-json, Codex
`exec --json`, Gemini CLI stream-json) incrementally into one `TurnStream`. The
outcome classifier and the answer read only this, never raw events, so one
classification table serves every runtime.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from agent_server.wire.turns import RateLimitReading

MAX_ASSISTANT_TEXT_CHARS = 1_048_576
"""The model's prose kept for the answer when no result text came: bounded all the same."""


@dataclass
class TurnStream:
    """The facts of one turn's stream that the answer and the classifier need.

    Fields are filled while the stream is read; absent facts stay None/empty.
    `error_texts` holds text seen on ERROR channels only (an `is_error` result, an
    API-error assistant message, a runtime's error event): never the model's prose
    or tool output, which may legitimately mention "401" or "rate limit".
    """

    session_id: str | None = None
    model: str | None = None
    permission_mode: str | None = None
    api_key_source: str | None = None

    # The final result (Claude `result` event, Codex `turn.completed`, Gemini `result`).
    has_result: bool = False
    is_error: bool = False
    result_text: str | None = None
    subtype: str | None = None
    terminal_reason: str | None = None

    # Structured API-error facts, from the result or an API-error assistant event.
    api_error_status: int | None = None
    api_error: str | None = None
    api_error_type: str | None = None
    error_codes: list[str] = field(default_factory=list)
    """Assistant `error` values, e.g. `rate_limit`, `authentication_failed`."""

    rate_limit_info: dict[str, Any] | None = None
    """The last `rate_limit_info` whose status is `rejected`."""
    rate_limit: RateLimitReading | None = None
    """The turn's last rate-limit reading, whatever its status (contract §6.5)."""

    api_retries: list[dict[str, Any]] = field(default_factory=list)
    error_texts: list[str] = field(default_factory=list)

    assistant_text: list[str] = field(default_factory=list)
    """The model's own prose, in order: a clean prefix of at most
    `MAX_ASSISTANT_TEXT_CHARS` characters (see `add_assistant_text`)."""
    _assistant_chars: int = field(default=0, repr=False)
    _assistant_full: bool = field(default=False, repr=False)

    num_turns: int | None = None
    cost_usd: float | None = None
    duration_ms: int | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    """The turn's totals, as its result reports them."""

    # What the last model call sent: how full the context window is.
    call_input_tokens: int | None = None
    cache_read_tokens: int | None = None
    cache_creation_tokens: int | None = None
    context_window: int | None = None
    """The model's window as the CLI reports it (Claude Code's `modelUsage`)."""

    def add_assistant_text(self, text: str) -> None:
        """Keep one piece of the model's prose while the cap allows.

        The first piece that does not fit closes the budget: later pieces are dropped
        too, so what is kept is always the beginning of the reply, with no holes.
        """
        if self._assistant_full or not text:
            return
        if self._assistant_chars + len(text) > MAX_ASSISTANT_TEXT_CHARS:
            self._assistant_full = True
            return
        self._assistant_chars += len(text)
        self.assistant_text.append(text)
