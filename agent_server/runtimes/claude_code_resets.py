"""When Claude Code says a rate limit resets, in its own words.

`resets 8:32am (UTC)`, `resets Dec 3, 7:32am (Europe/Berlin)`, `resets Mon 12:00am`,
the legacy `usage limit reached|<epoch>`, and `regain access on 2025-12-03 at 07:32
UTC`. Its structured `rate_limit_info.resetsAt` wins over all of them (`outcome.resets`).
"""

from __future__ import annotations

import re
from datetime import UTC, datetime

from agent_server.runtimes.base import ResetParser
from agent_server.runtimes.reset_clock import (
    CLOCK,
    ZONE,
    clock_match,
    from_epoch_value,
    safe_date,
    wall_clock,
)

__all__ = ["RESET_PARSERS"]

_EPOCH_SUFFIX = re.compile(r"limit reached\|(?P<epoch>\d{1,16})", re.IGNORECASE)
_REGAIN_ACCESS = re.compile(
    r"regain access on (?P<year>\d{4})-(?P<month>\d{1,2})-(?P<day>\d{1,2})"
    r"(?:\s+at\s+(?P<hour>\d{1,2}):(?P<minute>\d{2}))?\s*UTC",
    re.IGNORECASE,
)
_RESETS = re.compile(
    r"\bresets?\s+(?:at\s+|on\s+)?"
    r"(?:(?P<month>[A-Za-z]{3,9})\.?\s+(?P<day>\d{1,2})(?:st|nd|rd|th)?,?\s+(?:at\s+)?"
    r"|(?P<weekday>[A-Za-z]{3,9}),?\s+(?:at\s+)?)?" + CLOCK + ZONE,
    re.IGNORECASE,
)


def _epoch_suffix(text: str, now: datetime) -> datetime | None:
    """`usage limit reached|1764745920`: the legacy machine-readable suffix."""
    match = _EPOCH_SUFFIX.search(text)
    if match is None:
        return None
    instant = from_epoch_value(int(match["epoch"]))
    return instant if instant is not None and instant >= now else None


def _regain_access(text: str, now: datetime) -> datetime | None:
    """`regain access on 2025-12-03 at 07:32 UTC`: an absolute date, stale when past."""
    match = _REGAIN_ACCESS.search(text)
    if match is None:
        return None
    clock = wall_clock(match["hour"] or "0", match["minute"], None)
    day = safe_date(int(match["year"]), int(match["month"]), int(match["day"]))
    if clock is None or day is None:
        return None
    instant = datetime.combine(day, clock, UTC)
    return instant if instant >= now else None


def _resets_clock(text: str, now: datetime) -> datetime | None:
    """`resets 8:32am`, `resets Dec 3, 7:32am`, `resets Mon 12:00am`, with an optional zone."""
    for match in _RESETS.finditer(text):
        found = clock_match(match, now, year=None)
        if found is not None:
            return found
    return None


RESET_PARSERS: tuple[ResetParser, ...] = (_epoch_suffix, _regain_access, _resets_clock)
"""Claude Code's reset wordings, most explicit first."""
