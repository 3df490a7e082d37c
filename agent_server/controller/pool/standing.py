"""How one credential stands now: pure predicates over its failures and its last reading.

Two questions are kept apart, as they answer different people:

- `throttled`: is its window full right now? (the operator's display)
- `failed_recently`: did it fail in the skip window, with no evidence since that it
  serves again? (the walk's skip list)

A wall is remembered until it falls: a credential refused with a known reset is
offered to no turn before that reset (`walled`), however long ago the refusal was,
unless a fresh reading since says it serves.

Readmission needs evidence: a fresh reading, taken after the failure, that says the
provider serves it; or the window that refused it (known at the failure, from the
failure's reset or a reading taken by then) having reset since. No evidence readmits
nothing: a credential that merely has not been tried again stays skipped.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta
from types import MappingProxyType
from typing import NamedTuple

from agent_server.controller.pool.state import (
    CredentialInfo,
    Failure,
    FailureKind,
    Reading,
    WindowUse,
)

SKIP_WINDOW = timedelta(hours=2)
"""A failure of any kind keeps a subscription off the ranked rungs this long."""
LAST_RESORT_AGE = timedelta(minutes=30)
"""An autonomous turn takes a skipped subscription only once its last failure is this old."""
REFUSAL_WINDOWS: dict[FailureKind, timedelta] = {
    "auth": timedelta(hours=2),
    "billing": timedelta(hours=2),
    "rate_limit": timedelta(minutes=5),
    "immediate_hard_limit": timedelta(hours=2),
}
"""The platform key (and the gateway) is not offered again this long after a refusal
(a rate limit whose reset the API said: until that reset, `refused_until`)."""
FRESH_READING = timedelta(minutes=15)
"""A reading this young speaks for the credential now (to refuse it, or readmit it)."""
USABLE_READING = timedelta(hours=5)
"""Ranking reads a reading up to this old; an older one says nothing of the 5 h window."""
SERVING = frozenset({"allowed", "allowed_warning"})


class Standing(NamedTuple):
    """One credential and what the store knows of it (a tuple: a pool makes a thousand)."""

    info: CredentialInfo
    failures: Mapping[FailureKind, Failure] = MappingProxyType({})
    reading: Reading | None = None
    agents: int = 0
    """How many agents are assigned to it."""
    in_flight: int = 0
    """How many turns run on it now, across the fleet (its leases)."""

    @property
    def last_failure(self) -> Failure | None:
        """Its latest failure of any kind."""
        if not self.failures:  # most credentials of a pool, on every rung: the quick way
            return None
        return max(self.failures.values(), key=lambda f: f.at)


def fresh(reading: Reading | None, now: datetime) -> Reading | None:
    """`reading` when it is young enough to speak for now (never one from the future)."""
    if reading is None or not timedelta(0) <= now - reading.at <= FRESH_READING:
        return None
    return reading


def refusing(reading: Reading, now: datetime) -> bool:
    """The reading says the provider refuses: rejected, and the reset it names is ahead."""
    if reading.status == "rejected":
        return reading.resets_at is None or reading.resets_at > now
    return any(
        w is not None and w.status == "rejected" and (w.resets_at is None or w.resets_at > now)
        for w in (reading.five_hour, reading.seven_day)
    )


def serving(reading: Reading, now: datetime) -> bool:
    """The reading says the provider serves the credential."""
    return reading.status in SERVING and not refusing(reading, now)


def blocking_reset(standing: Standing, failure: Failure) -> datetime | None:
    """When the window that refused `failure` resets: the failure's own reset, else the
    latest reset of a rejected window in a reading taken by the failure's instant."""
    if failure.kind != "rate_limit":
        return None
    if failure.resets_at is not None:
        return failure.resets_at
    reading = standing.reading
    if reading is None or reading.at > failure.at:
        return None
    resets = [
        w.resets_at
        for w in (reading.five_hour, reading.seven_day)
        if w is not None and w.status == "rejected" and w.resets_at is not None
    ]
    if reading.status == "rejected" and reading.resets_at is not None:
        resets.append(reading.resets_at)
    return max(resets, default=None)


def readmitted(standing: Standing, now: datetime) -> bool:
    """Evidence since its last failure says it serves again (True when it never failed)."""
    failure = standing.last_failure
    if failure is None:
        return True
    reading = fresh(standing.reading, now)
    if reading is not None and reading.at > failure.at and serving(reading, now):
        return True
    reset = blocking_reset(standing, failure)
    return reset is not None and failure.at < reset <= now


def walled(standing: Standing, now: datetime) -> datetime | None:
    """The reset of the wall it stands behind: refused with a known reset still ahead,
    and no fresh reading since that says it serves. A walled credential is offered to no
    turn (not first, not ranked, not as a last resort) before that reset."""
    limit = standing.failures.get("rate_limit")
    if limit is None:
        return None
    reset = blocking_reset(standing, limit)
    if reset is None or not limit.at < reset or reset <= now:
        return None
    reading = fresh(standing.reading, now)
    if reading is not None and reading.at > limit.at and serving(reading, now):
        return None
    return reset


def failed_recently(standing: Standing, now: datetime) -> bool:
    """The skip question: a failure of any kind in the skip window, not readmitted since."""
    failure = standing.last_failure
    if failure is None or now - failure.at >= SKIP_WINDOW:
        return False
    return not readmitted(standing, now)


def throttled(standing: Standing, now: datetime) -> bool:
    """The display question, and pre-dispatch's: its window is full right now (a fresh
    refusing reading, else a rate limit inside its window; never auth or billing)."""
    reading = fresh(standing.reading, now)
    limit = standing.failures.get("rate_limit")
    if reading is not None and (limit is None or reading.at > limit.at):
        return refusing(reading, now)
    if limit is None:
        return False
    reset = blocking_reset(standing, limit)
    if reset is not None:
        return limit.at < reset and now < reset
    return now - limit.at < SKIP_WINDOW and not readmitted(standing, now)


def fresh_refusal(standing: Standing, now: datetime) -> bool:
    """A fresh reading refuses it: dropped from ranking."""
    if standing.reading is None:
        return False
    reading = fresh(standing.reading, now)
    return reading is not None and refusing(reading, now)


def window_use(window: WindowUse | None, now: datetime) -> float | None:
    """How full a window is now: empty once past its reset; None when it is unmeasured."""
    if window is None or window.utilization is None:
        return None
    return 0.0 if window.resets_at is not None and window.resets_at <= now else window.utilization


def fullness(reading: Reading | None, now: datetime) -> float | None:
    """The fuller of its two windows (`window_use`); None when no usable reading
    measures either."""
    if reading is None or not timedelta(0) <= now - reading.at <= USABLE_READING:
        return None
    uses = [window_use(w, now) for w in (reading.five_hour, reading.seven_day)]
    return max((use for use in uses if use is not None), default=None)


def headroom_key(standing: Standing, now: datetime) -> tuple[int, int, int, int, str]:
    """Ranking: measured with room first, then unmeasured, then measured full (a window
    at or over 100%); within each, the fuller window in 10-point bands, then fewest
    agents, then fewest turns in flight, then the id."""
    full = None if standing.reading is None else fullness(standing.reading, now)
    band = 0 if full is None else min(int(full * 10 + 1e-9), 10)
    group = 1 if full is None else (2 if full >= 1.0 else 0)
    return (group, band, standing.agents, standing.in_flight, standing.info.id)


def refused_until(failure: Failure) -> datetime:
    """When the platform key (or the gateway) is offered again after `failure`: a rate
    limit's own reset when the API said one (a per-minute limit's `retry-after`: seconds),
    else its kind's window."""
    if failure.kind == "rate_limit" and failure.resets_at is not None:
        return failure.resets_at
    return failure.at + REFUSAL_WINDOWS[failure.kind]


def refused_recently(standing: Standing, now: datetime) -> bool:
    """The platform key's (and the gateway's) question: refused, and not offered again yet."""
    return any(now < refused_until(failure) for failure in standing.failures.values())
