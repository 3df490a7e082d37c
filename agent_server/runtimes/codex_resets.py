"""When Codex says a rate limit resets, in its own words.

`try again at 3:29 PM.`, `try again at Dec 3rd, 2025 3:29 PM.` (the CLI's local time;
containers run in UTC) and `try again in 2 days 3 hours 4 minutes.`, from now.
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta

from agent_server.runtimes.base import ResetParser
from agent_server.runtimes.reset_clock import CLOCK, ZONE, clock_match, span_seconds

__all__ = ["RESET_PARSERS"]

_TRY_AGAIN_AT = re.compile(
    r"try again at\s+"
    r"(?:(?P<month>[A-Za-z]{3,9})\.?\s+(?P<day>\d{1,2})(?:st|nd|rd|th)?,?\s+"
    r"(?:(?P<year>\d{4}),?\s+)?(?:at\s+)?)?" + CLOCK + ZONE,
    re.IGNORECASE,
)
_TRY_AGAIN_IN = re.compile(
    r"try again in\s+(?P<span>(?:\d+\s*(?:days?|hours?|minutes?|mins?|seconds?|secs?)"
    r"[\s,]*(?:and\s+)?)+)",
    re.IGNORECASE,
)
_SPAN_PART = re.compile(r"(\d+)\s*(day|hour|min|sec)", re.IGNORECASE)


def _try_again_at(text: str, now: datetime) -> datetime | None:
    """`try again at 3:29 PM.`, `try again at Dec 3rd, 2025 3:29 PM.`."""
    for match in _TRY_AGAIN_AT.finditer(text):
        year = int(match["year"]) if match["year"] else None
        found = clock_match(match, now, year=year)
        if found is not None:
            return found
    return None


def _try_again_in(text: str, now: datetime) -> datetime | None:
    """`try again in 2 days 3 hours 4 minutes.`, relative to `now`."""
    match = _TRY_AGAIN_IN.search(text)
    if match is None:
        return None
    return now + timedelta(seconds=span_seconds(_SPAN_PART.findall(match["span"])))


RESET_PARSERS: tuple[ResetParser, ...] = (_try_again_at, _try_again_in)
"""Codex's reset wordings, an instant before a span."""
