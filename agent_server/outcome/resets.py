"""When a rate-limited credential serves again: one pure parser for every CLI's wording.

The structured `rate_limit_info.resetsAt` (epoch seconds) is authoritative. Without
it, the reset is read from the CLI's own error text:

- Claude Code: `resets 8:32am (UTC)`, `resets Dec 3, 7:32am (Europe/Berlin)`,
  `resets Mon 12:00am`, `usage limit reached|<epoch>`, `regain access on
  2025-12-03 at 07:32 UTC`;
- Codex: `try again at 3:29 PM.`, `try again at Dec 3rd, 2025 3:29 PM.`,
  `try again in 2 days 3 hours 4 minutes.`;
- Gemini CLI: `Your quota will reset after 1h49m8s.`, and the Gemini API's own
  `Please retry in 43.2s.` (`Suggested retry after 43s.`).

A clock time already past rolls to its next occurrence (the CLI names the next
reset, never a past one). An absolute instant in the past is stale and gives None:
the controller must never see an invented reset, and never one before `now`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, date, datetime, time, timedelta, tzinfo
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

__all__ = ["parse_resets_at"]

# Epoch values above this are milliseconds (1e11 s is the year 5138).
_MILLISECONDS_THRESHOLD = 100_000_000_000
# Texts are scanned only this far: error texts are short, and regexes stay cheap.
_MAX_TEXT_CHARS = 4096
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

_CLOCK = r"(?P<hour>\d{1,2})(?::(?P<minute>\d{2}))?\s*(?P<ampm>[ap]\.?m\.?)?"
_ZONE = r"(?:\s*\((?P<zone>[A-Za-z][A-Za-z0-9_+\-]*(?:/[A-Za-z0-9_+\-]+)*)\))?"

_EPOCH_SUFFIX = re.compile(r"limit reached\|(?P<epoch>\d{1,16})", re.IGNORECASE)
_REGAIN_ACCESS = re.compile(
    r"regain access on (?P<year>\d{4})-(?P<month>\d{1,2})-(?P<day>\d{1,2})"
    r"(?:\s+at\s+(?P<hour>\d{1,2}):(?P<minute>\d{2}))?\s*UTC",
    re.IGNORECASE,
)
_RESETS = re.compile(
    r"\bresets?\s+(?:at\s+|on\s+)?"
    r"(?:(?P<month>[A-Za-z]{3,9})\.?\s+(?P<day>\d{1,2})(?:st|nd|rd|th)?,?\s+(?:at\s+)?"
    r"|(?P<weekday>[A-Za-z]{3,9}),?\s+(?:at\s+)?)?" + _CLOCK + _ZONE,
    re.IGNORECASE,
)
_TRY_AGAIN_AT = re.compile(
    r"try again at\s+"
    r"(?:(?P<month>[A-Za-z]{3,9})\.?\s+(?P<day>\d{1,2})(?:st|nd|rd|th)?,?\s+"
    r"(?:(?P<year>\d{4}),?\s+)?(?:at\s+)?)?" + _CLOCK + _ZONE,
    re.IGNORECASE,
)
_TRY_AGAIN_IN = re.compile(
    r"try again in\s+(?P<span>(?:\d+\s*(?:days?|hours?|minutes?|mins?|seconds?|secs?)"
    r"[\s,]*(?:and\s+)?)+)",
    re.IGNORECASE,
)
_SPAN_PART = re.compile(r"(\d+)\s*(day|hour|min|sec)", re.IGNORECASE)
_RESET_AFTER = re.compile(
    r"reset after\s+(?P<span>(?:\d+(?:\.\d+)?\s*[hms]\s*)+)(?![a-z])", re.IGNORECASE
)
_COMPACT_PART = re.compile(r"(\d+(?:\.\d+)?)\s*([hms])", re.IGNORECASE)
_RETRY_IN = re.compile(
    r"(?:please retry in|suggested retry after)\s+(?P<amount>\d{1,9}(?:\.\d+)?)\s*(?P<unit>ms|s)\b",
    re.IGNORECASE,
)

_UNIT_SECONDS = {"day": 86400, "hour": 3600, "min": 60, "sec": 1, "h": 3600, "m": 60, "s": 1}


def parse_resets_at(
    rate_limit_info: Mapping[str, Any] | None,
    texts: Sequence[str],
    now: datetime,
) -> datetime | None:
    """The instant (aware, UTC) a rate limit resets, or None when it is not known.

    `rate_limit_info["resetsAt"]` wins; otherwise the first text that names a reset.
    Never raises, never returns an instant before `now`.
    """
    try:
        now_utc = _as_utc(now)
        if rate_limit_info is not None and "resetsAt" in rate_limit_info:
            structured = _from_epoch_value(rate_limit_info.get("resetsAt"))
            if structured is not None:
                # A parseable structured reset is authoritative, even when stale:
                # rolling the text's clock time forward would invent a reset.
                return structured if structured >= now_utc else None
        for text in texts:
            if isinstance(text, str):
                found = _from_text(text[:_MAX_TEXT_CHARS], now_utc)
                if found is not None:
                    return found
    except (ArithmeticError, ValueError, TypeError, LookupError, OSError):
        # Defence in depth: a reset is a hint; a parser bug must not fail a turn.
        return None
    return None


def _as_utc(now: datetime) -> datetime:
    """`now` as an aware UTC datetime; a naive value is taken as UTC."""
    if now.tzinfo is None or now.utcoffset() is None:
        return now.replace(tzinfo=UTC)
    return now.astimezone(UTC)


def _from_epoch_value(value: object) -> datetime | None:
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


def _from_text(text: str, now: datetime) -> datetime | None:
    """The first reset instant any known wording in `text` names, or None."""
    parsers: tuple[Callable[[str, datetime], datetime | None], ...] = (
        _epoch_suffix,
        _regain_access,
        _resets_clock,
        _try_again_at,
        _try_again_in,
        _reset_after,
        _retry_in,
    )
    for parse in parsers:
        found = parse(text, now)
        if found is not None and found >= now:
            return found
    return None


def _epoch_suffix(text: str, now: datetime) -> datetime | None:
    """`usage limit reached|1764745920`: the legacy machine-readable suffix."""
    match = _EPOCH_SUFFIX.search(text)
    if match is None:
        return None
    instant = _from_epoch_value(int(match["epoch"]))
    return instant if instant is not None and instant >= now else None


def _regain_access(text: str, now: datetime) -> datetime | None:
    """`regain access on 2025-12-03 at 07:32 UTC`: an absolute date, stale when past."""
    match = _REGAIN_ACCESS.search(text)
    if match is None:
        return None
    clock = _clock(match["hour"] or "0", match["minute"], None)
    day = _safe_date(int(match["year"]), int(match["month"]), int(match["day"]))
    if clock is None or day is None:
        return None
    instant = datetime.combine(day, clock, UTC)
    return instant if instant >= now else None


def _resets_clock(text: str, now: datetime) -> datetime | None:
    """`resets 8:32am`, `resets Dec 3, 7:32am`, `resets Mon 12:00am`, with an optional zone."""
    for match in _RESETS.finditer(text):
        found = _clock_match(match, now, year=None)
        if found is not None:
            return found
    return None


def _try_again_at(text: str, now: datetime) -> datetime | None:
    """Codex: `try again at 3:29 PM.` (the CLI's local time; containers run in UTC)."""
    for match in _TRY_AGAIN_AT.finditer(text):
        year = int(match["year"]) if match["year"] else None
        found = _clock_match(match, now, year=year)
        if found is not None:
            return found
    return None


def _try_again_in(text: str, now: datetime) -> datetime | None:
    """Codex: `try again in 2 days 3 hours 4 minutes.`, relative to `now`."""
    match = _TRY_AGAIN_IN.search(text)
    if match is None:
        return None
    seconds = sum(
        int(amount) * _UNIT_SECONDS[unit.lower()]
        for amount, unit in _SPAN_PART.findall(match["span"])
    )
    return now + timedelta(seconds=seconds)


def _reset_after(text: str, now: datetime) -> datetime | None:
    """Gemini CLI: `Your quota will reset after 1h49m8s.`, relative to `now`."""
    match = _RESET_AFTER.search(text)
    if match is None:
        return None
    seconds = sum(
        float(amount) * _UNIT_SECONDS[unit.lower()]
        for amount, unit in _COMPACT_PART.findall(match["span"])
    )
    return now + timedelta(seconds=seconds)


def _retry_in(text: str, now: datetime) -> datetime | None:
    """The Gemini API: `Please retry in 43.2s.`, relative to `now`."""
    match = _RETRY_IN.search(text)
    if match is None:
        return None
    seconds = float(match["amount"]) / (1000 if match["unit"].lower() == "ms" else 1)
    return now + timedelta(seconds=seconds)


def _clock_match(match: re.Match[str], now: datetime, *, year: int | None) -> datetime | None:
    """Resolve a matched (month day | weekday)? clock (zone)? to its next instant."""
    clock = _clock(match["hour"], match["minute"], match["ampm"])
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


def _clock(hour_text: str, minute_text: str | None, ampm: str | None) -> time | None:
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
        explicit = _safe_date(year, month, day)
        if explicit is None:
            return None
        instant = _at(explicit, clock, zone)
        return instant if instant >= now else None
    for candidate_year in range(local_now.year, local_now.year + _MAX_YEARS_AHEAD + 1):
        candidate_day = _safe_date(candidate_year, month, day)
        if candidate_day is None:
            continue
        instant = _at(candidate_day, clock, zone)
        if instant >= now:
            return instant
    return None


def _safe_date(year: int, month: int, day: int) -> date | None:
    """`date(year, month, day)`, or None for an impossible date such as Feb 30."""
    try:
        return date(year, month, day)
    except ValueError:
        return None
