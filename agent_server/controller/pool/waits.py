"""When a waiting turn is worth trying again, and when an agent on the gateway tries its
subscriptions again: from every window the pool knows of (pure).

A credential is offered to a turn again (`offered_again`):

- behind a wall (a rate limit with a known reset): at that reset;
- the platform key or the gateway, refused: when its refusal windows have all passed
  (a 429's own reset when the API said one, else 5 minutes; 2 hours after auth or
  billing);
- a subscription in the skip list with no reset known: once its failure is
  `LAST_RESORT_AGE` old (an autonomous turn may take it then);
- a subscription whose fresh reading refuses: at the reading's reset.

The earliest of these over the pool is when the retry is due; the earliest over the
subscriptions is when an agent on the gateway tries them again.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta

from agent_server.controller.pool.standing import (
    LAST_RESORT_AGE,
    Standing,
    failed_recently,
    fresh,
    refused_until,
    refusing,
    walled,
)

UNKNOWN_RESET_WAIT = timedelta(minutes=30)
"""When a waiting turn retries if no window of the pool says when a credential is
offered again."""
GATEWAY_COOLDOWN = timedelta(minutes=15)
"""After the gateway served an agent, its turns go there first until a subscription is
known to be offered again; this long when none is known."""


def offered_again(standing: Standing, now: datetime) -> datetime | None:
    """When the credential is next offered to a turn, if that is known and ahead of `now`."""
    wall = walled(standing, now)
    if wall is not None:
        return wall
    if standing.info.kind != "subscription":
        ends = [refused_until(failure) for failure in standing.failures.values()]
        ahead = [end for end in ends if end > now]
        return max(ahead, default=None)
    reading = fresh(standing.reading, now)
    if reading is not None and refusing(reading, now):
        return reading.resets_at if reading.resets_at and reading.resets_at > now else None
    failure = standing.last_failure
    if failure is not None and failed_recently(standing, now):
        last_resort = failure.at + LAST_RESORT_AGE
        return last_resort if last_resort > now else None
    return None


def retry_at(standings: Iterable[Standing], now: datetime) -> datetime | None:
    """The first instant ahead at which any credential of the pool is offered again."""
    return min(
        (at for standing in standings if (at := offered_again(standing, now)) is not None),
        default=None,
    )


def switch_back_at(standings: Iterable[Standing], now: datetime) -> datetime:
    """When an agent the gateway served tries its subscriptions again: the first instant
    one is offered again (a capped one's reset), else `GATEWAY_COOLDOWN` from now."""
    subscriptions = (s for s in standings if s.info.kind == "subscription")
    return retry_at(subscriptions, now) or now + GATEWAY_COOLDOWN
