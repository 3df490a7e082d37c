"""When Gemini CLI says a rate limit resets, in its words and its API's.

`Your quota will reset after 1h49m8s.` (the CLI's), and the Gemini API's own
`Please retry in 43.2s.` (`Suggested retry after 43s.`), both from now.
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta

from agent_server.runtimes.base import ResetParser
from agent_server.runtimes.reset_clock import span_seconds

__all__ = ["RESET_PARSERS"]

_RESET_AFTER = re.compile(
    r"reset after\s+(?P<span>(?:\d+(?:\.\d+)?\s*[hms]\s*)+)(?![a-z])", re.IGNORECASE
)
_COMPACT_PART = re.compile(r"(\d+(?:\.\d+)?)\s*([hms])", re.IGNORECASE)
_RETRY_IN = re.compile(
    r"(?:please retry in|suggested retry after)\s+(?P<amount>\d{1,9}(?:\.\d+)?)\s*(?P<unit>ms|s)\b",
    re.IGNORECASE,
)


def _reset_after(text: str, now: datetime) -> datetime | None:
    """`Your quota will reset after 1h49m8s.`, relative to `now`."""
    match = _RESET_AFTER.search(text)
    if match is None:
        return None
    return now + timedelta(seconds=span_seconds(_COMPACT_PART.findall(match["span"])))


def _retry_in(text: str, now: datetime) -> datetime | None:
    """The API's `Please retry in 43.2s.`, relative to `now`."""
    match = _RETRY_IN.search(text)
    if match is None:
        return None
    seconds = float(match["amount"]) / (1000 if match["unit"].lower() == "ms" else 1)
    return now + timedelta(seconds=seconds)


RESET_PARSERS: tuple[ResetParser, ...] = (_reset_after, _retry_in)
"""Gemini CLI's reset wordings, its own before its API's."""
