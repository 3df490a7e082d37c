"""Claude Code's `rate_limit_info`, read into a `RateLimitReading` the controller can trust.

The CLI reports it in a `rate_limit_event` on every turn whose API answers carry the
unified rate-limit headers, a success included (contract §6.5): the headroom of the
credential's five-hour and seven-day windows, at no cost of a request. It is CLI
output, so it is hostile: only the keys below are read, each of its own type and
range, and everything else is dropped. A status or window name outside the known
words reads `other`; an instant is an epoch in seconds within `_EPOCH_RANGE`.
"""

from __future__ import annotations

import math
import re
from datetime import UTC, datetime
from typing import Any, get_args

from agent_server.runtimes.events import as_float, one_of
from agent_server.wire.turns import RateLimitReading, RateLimitStatus, RateLimitWindow

__all__ = ["read_rate_limit"]

RATE_LIMIT_STATUSES = frozenset(s for s in get_args(RateLimitStatus) if s != "other")
RATE_LIMIT_WINDOWS = frozenset(
    {"five_hour", "seven_day", "seven_day_opus", "seven_day_sonnet", "overage"}
)
"""`rateLimitType` values reported as they are (anything else is `other`)."""
_EPOCH_RANGE = (1_000_000_000, 100_000_000_000)
"""2001 to the year 5138, in seconds: anything else is not an instant the CLI meant."""
_MAX_UTILIZATION = 100.0
"""A fraction of the window: far past 1 is nonsense, not a reading."""
_REASON = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


def read_rate_limit(info: object) -> RateLimitReading | None:
    """The reading in one `rate_limit_info`, or None when it holds nothing usable."""
    if not isinstance(info, dict):
        return None
    windows = info.get("unifiedWindows")
    windows = windows if isinstance(windows, dict) else {}
    reading = RateLimitReading(
        status=_status(info.get("status")),
        rate_limit_type=one_of(info.get("rateLimitType"), RATE_LIMIT_WINDOWS),
        resets_at=_instant(info.get("resetsAt")),
        utilization=_fraction(info.get("utilization")),
        surpassed_threshold=_fraction(info.get("surpassedThreshold")),
        is_using_overage=_bool(info.get("isUsingOverage")),
        overage_status=_status(info.get("overageStatus")),
        overage_resets_at=_instant(info.get("overageResetsAt")),
        overage_disabled_reason=_reason(info.get("overageDisabledReason")),
        five_hour=_window(windows.get("five_hour")),
        seven_day=_window(windows.get("seven_day")),
    )
    return reading if reading != _EMPTY else None


_EMPTY = RateLimitReading()


def _window(value: object) -> RateLimitWindow | None:
    if not isinstance(value, dict):
        return None
    window = RateLimitWindow(
        utilization=_fraction(value.get("utilization")),
        resets_at=_instant(value.get("resetsAt")),
        status=_status(value.get("status")),
    )
    return window if window != _EMPTY_WINDOW else None


_EMPTY_WINDOW = RateLimitWindow()


def _status(value: object) -> Any:
    return one_of(value, RATE_LIMIT_STATUSES)


def _fraction(value: object) -> float | None:
    number = as_float(value)
    if number is None or not 0.0 <= number <= _MAX_UTILIZATION:
        return None
    return number


def _instant(value: object) -> str | None:
    """An epoch in seconds as ISO 8601 UTC (`…Z`, rounded up to the second)."""
    seconds = as_float(value)
    if seconds is None or not _EPOCH_RANGE[0] <= seconds < _EPOCH_RANGE[1]:
        return None
    instant = datetime.fromtimestamp(math.ceil(seconds), UTC)
    return f"{instant:%Y-%m-%dT%H:%M:%S}Z"


def _bool(value: object) -> bool | None:
    return value if isinstance(value, bool) else None


def _reason(value: object) -> str | None:
    return value if isinstance(value, str) and _REASON.fullmatch(value) else None
