"""The controller's time: its own wall clock, and instants as aware datetimes only.

Every window of the walk (the skip window, the last-resort age, the key's refusal
windows, a reading's age) is measured on the controller's clock and compared as
datetimes, never as strings: an ISO text from the server is parsed once, here, and
a store keeps instants as integer microseconds since the epoch.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta

Clock = Callable[[], datetime]
"""What the walk asks for `now`: injectable, so its decisions are tested with tables."""
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def utc_now() -> datetime:
    """The controller's wall clock, aware, in UTC."""
    return datetime.now(UTC)


def to_micros(instant: datetime) -> int:
    """An aware instant as integer microseconds since the epoch (how stores keep it)."""
    return (instant - EPOCH) // timedelta(microseconds=1)


def from_micros(micros: int) -> datetime:
    """Integer microseconds since the epoch as an aware UTC instant."""
    return EPOCH + timedelta(microseconds=micros)
