"""The arithmetic under every CLI's reset wording: clock times, zones, spans, epochs.

A CLI names a reset as a wall-clock time (`8:32am (Europe/Berlin)`, `Dec 3, 7:32am`,
`Mon 12:00am`), a span from now (`2 days 3 hours`, `1h49m8s`) or an epoch. Each
adapter's reset parsers (`OutcomeHints.reset_parsers`) match their CLI's words and
hand the pieces here. A clock time already past rolls to its next occurrence (a CLI
names the next reset, never a past one); an explicit instant in the past is None.
"""

from __future__ import annotations

import math
import re
from datetime import UTC, date, datetime, time, timedelta, tzinfo
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

# Epoch values above this are milliseconds (1e11 s is the year 5138).
_MILLISECONDS_THRESHOLD = 100_000_000_000
# A leap-day reset (Feb 29) may need up to 8 years to recur.
_MAX_YEARS_AHEAD = 8

_MONTHS = {
    name: number
    for number, names in enumerate(
        (
            ("jan", "january"),
            ("feb", "february"),
            ("mar", "march"),
            ("apr", "april"),
            ("may",),
            ("jun", "june"),
            ("jul", "july"),
            ("aug", "august"),
            ("sep", "sept", "september"),
            ("oct", "october"),
            ("nov", "november"),
            ("dec", "december"),
        ),
        start=1,
    )
    for name in names
}
_WEEKDAYS = {
    name: number
    for number, names in enumerate(
        (
            ("mon", "monday"),
            ("tue", "tues", "tuesday"),
            ("wed", "wednesday"),
            ("thu", "thur", "thurs", "thursday"),
            ("fri", "friday"),
            ("sat", "saturday"),
            ("sun", "sunday"),
        )
    )
    for name in names
}

CLOCK = r"(?P<hour>\d{1,2})(?::(?P<minute>\d{2}))?\s*(?P<ampm>[ap]\.?m\.?)?"
"""A wall-clock time (`8`, `8:32`, `8:32am`): the groups `clock_match` reads."""
ZONE = r"(?:\s*\((?P<zone>[A-Za-z][A-Za-z0-9_+\-]*(?:/[A-Za-z0-9_+\-]+)*)\))?"
"""An optional IANA zone in parentheses, `(Europe/Berlin)`."""

_UNIT_SECONDS = {"day": 86400, "hour": 3600, "min": 60, "sec": 1, "h": 3600, "m": 60, "s": 1}


def span_seconds(parts: list[tuple[str, str]]) -> float:
    """The seconds of a span's (amount, unit) parts: `day|hour|min|sec` or `h|m|s`."""
    return sum(float(amount) * _UNIT_SECONDS[unit.lower()] for amount, unit in parts)


def from_epoch_value(value: object) -> datetime | None:
    """An epoch (seconds, or milliseconds when huge) from an int, float or digit string."""
    if isinstance(value, bool):
        return None
    seconds: float
    if isinstance(value, int | float) or (
        isinstance(value, str) and re.fullmatch(r"\s*\d{1,16}(?:\.\d+)?\s*", value)
    ):
        seconds = float(value)
    elif isinstance(value, str):
        return _from_iso(value)
    else:
        return None
    if not math.isfinite(seconds) or seconds <= 0:
        return None
    if seconds >= _MILLISECONDS_THRESHOLD:
        seconds /= 1000
    try:
        return datetime.fromtimestamp(seconds, UTC)
    except (OverflowError, OSError, ValueError):
        return None


def _from_iso(value: str) -> datetime | None:
    """An ISO-8601 instant with an offset (a naive one is ambiguous: None)."""
    try:
        parsed = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
    except ValueError:
        return None
    if parsed.tzinfo is None:
        return None
    return parsed.astimezone(UTC)


def clock_match(match: re.Match[str], now: datetime, *, year: int | None) -> datetime | None:
    """Resolve a matched (month day | weekday)? clock (zone)? to its next instant."""
    clock = wall_clock(match["hour"], match["minute"], match["ampm"])
    if clock is None:
        return None
    # A bare number (`resets 5`) is not a clock: demand minutes or am/pm.
    if match["minute"] is None and match["ampm"] is None:
        return None
    zone = _zone(match["zone"])
    if zone is None:
        return None
    local_now = now.astimezone(zone)
    groups = match.groupdict()
    month_name = groups.get("month")
    weekday_name = groups.get("weekday")
    if month_name is not None:
        month = _MONTHS.get(month_name.lower())
        if month is None:
            return None
        return _next_month_day(month, int(match["day"]), clock, zone, local_now, year)
    if weekday_name is not None:
        weekday = _WEEKDAYS.get(weekday_name.lower())
        if weekday is None:
            # A word before the clock that is no weekday (`resets today 5pm`): no guess.
            return None
        return _next_weekday(weekday, clock, zone, local_now)
    return _next_daily(clock, zone, local_now)


def wall_clock(hour_text: str, minute_text: str | None, ampm: str | None) -> time | None:
    """A wall-clock time from `8`, `32`, `am`; None when out of range."""
    hour = int(hour_text)
    minute = int(minute_text) if minute_text is not None else 0
    if ampm is not None:
        if not 1 <= hour <= 12:
            return None
        is_pm = ampm.lower().startswith("p")
        hour = hour % 12 + (12 if is_pm else 0)
    if not (0 <= hour <= 23 and 0 <= minute <= 59):
        return None
    return time(hour, minute)


def _zone(name: str | None) -> tzinfo | None:
    """The named IANA zone (no name: UTC); None for a zone this machine does not know."""
    if name is None or name.upper() in {"UTC", "GMT", "Z"}:
        return UTC
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        return None


def _at(day: date, clock: time, zone: tzinfo) -> datetime:
    """The UTC instant of a wall-clock time on a local date in `zone`."""
    return datetime.combine(day, clock, zone).astimezone(UTC)


def _next_daily(clock: time, zone: tzinfo, local_now: datetime) -> datetime:
    """The next occurrence of a clock time: today, else tomorrow."""
    now = local_now.astimezone(UTC)
    for offset in range(3):  # three days covers any DST shift
        candidate = _at(local_now.date() + timedelta(days=offset), clock, zone)
        if candidate >= now:
            return candidate
    return _at(local_now.date() + timedelta(days=3), clock, zone)


def _next_weekday(weekday: int, clock: time, zone: tzinfo, local_now: datetime) -> datetime:
    """The next occurrence of a weekday and clock time: this week, else next week."""
    now = local_now.astimezone(UTC)
    ahead = (weekday - local_now.weekday()) % 7
    candidate = _at(local_now.date() + timedelta(days=ahead), clock, zone)
    if candidate >= now:
        return candidate
    return _at(local_now.date() + timedelta(days=ahead + 7), clock, zone)


def _next_month_day(
    month: int,
    day: int,
    clock: time,
    zone: tzinfo,
    local_now: datetime,
    year: int | None,
) -> datetime | None:
    """A month-day's next occurrence; with an explicit year, that instant or None if past."""
    now = local_now.astimezone(UTC)
    if year is not None:
        explicit = safe_date(year, month, day)
        if explicit is None:
            return None
        instant = _at(explicit, clock, zone)
        return instant if instant >= now else None
    for candidate_year in range(local_now.year, local_now.year + _MAX_YEARS_AHEAD + 1):
        candidate_day = safe_date(candidate_year, month, day)
        if candidate_day is None:
            continue
        instant = _at(candidate_day, clock, zone)
        if instant >= now:
            return instant
    return None


def safe_date(year: int, month: int, day: int) -> date | None:
    """`date(year, month, day)`, or None for an impossible date such as Feb 30."""
    try:
        return date(year, month, day)
    except ValueError:
        return None
