"""What the API answered one request of a turn, as the broker saw it (contract §7).

The broker records each exchange at the moment its answer starts (status and the
headers a verdict reads), and, for a refusal, the facts of its body's first bytes
(the API's error type, code and message, `error_body`). Nothing the CLI prints
reaches this record: it is the one source of a credential's fate and of its headroom.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass, field

from agent_server.broker.error_body import MAX_BODY_BYTES, ErrorBody, read_error

ERROR_BODY_BYTES = MAX_BODY_BYTES
"""How much of a refusal's body the verdict reads: the API's errors are a few hundred bytes."""
RATE_LIMIT_PREFIX = "anthropic-ratelimit-unified-"
_KEPT_HEADERS = ("retry-after",)


@dataclass
class Exchange:
    """One request through the broker and the answer it got (status None: no answer)."""

    status: int | None
    headers: Mapping[str, str] = field(default_factory=dict)
    """The unified rate-limit headers and `retry-after`, lower-cased; nothing else."""
    error_type: str | None = None
    """The API's `error.type` of a refusal (`rate_limit_error`, `not_found_error`, …)."""
    error_message: str | None = None
    """The API's `error.message` of a refusal, at most 500 characters."""
    at: float = 0.0
    """When its answer started (epoch seconds)."""
    rung: int = 0
    """The credential of the turn's ladder it went out with (0: the turn's own)."""
    error: ErrorBody = field(default_factory=ErrorBody)
    """All a refusal's body says (`error_body`: its code, reason, retry); empty until read."""

    @property
    def served(self) -> bool:
        """True when the API answered with a success."""
        return self.status is not None and 200 <= self.status < 300

    def read_error_body(self, body: bytes) -> None:
        """Take what a refusal's body says, if it is the API's JSON error."""
        error = read_error(body)
        if error is not None:
            self.error, self.error_type, self.error_message = error, error.type, error.message


def kept_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """The headers of an answer that a verdict or a reading reads (lower-cased names)."""
    kept = {}
    for name, value in headers.items():
        lowered = name.lower()
        if lowered.startswith(RATE_LIMIT_PREFIX) or lowered in _KEPT_HEADERS:
            kept[lowered] = value[:128]
    return kept


class TurnExchanges:
    """Every exchange of one turn, in the order their answers started (thread-safe)."""

    MAX_KEPT = 256
    """A CLI retrying for hours keeps only its latest exchanges: the verdict reads the last."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._exchanges: list[Exchange] = []
        self.count = 0
        """How many requests reached the API through the broker in all."""

    def add(self, exchange: Exchange) -> None:
        """Record one exchange (its refusal's body may still be filled in after)."""
        with self._lock:
            self.count += 1
            self._exchanges.append(exchange)
            if len(self._exchanges) > self.MAX_KEPT:
                del self._exchanges[0]

    def all(self) -> list[Exchange]:
        """A copy of the kept exchanges, oldest first."""
        with self._lock:
            return list(self._exchanges)

    @property
    def last(self) -> Exchange | None:
        """The exchange whose answer started last, or None when the CLI made none."""
        with self._lock:
            return self._exchanges[-1] if self._exchanges else None
