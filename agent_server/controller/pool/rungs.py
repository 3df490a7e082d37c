"""The walk's ladder: which credentials a turn may still try, in order (pure).

1. the agent's assigned subscription, unless it is throttled or failed recently
   (pre-dispatch: the first attempt then goes to the next rung); but always when it was
   assigned after its last failure (an operator's choice, or a commit on a service);
2. the other subscriptions with no failure in the skip window, ranked by headroom
   (`standing.headroom_key`: bands of headroom, then fewest agents, then fewest turns
   in flight); a fresh refusal is dropped;
3. last resorts, from the skip list: an interactive turn takes any untried one, an
   autonomous one only those whose last failure is `LAST_RESORT_AGE` old; the oldest
   failure first;
4. the platform API key: when the pool has one, the agent did not opt out, and it was
   not refused inside its window;
5. the gateway, when every Claude credential is exhausted. After the gateway served an
   agent, it goes first for that agent until its cooldown ends; then the ladder
   probes the subscriptions again.

A credential behind a wall (refused with a known reset still ahead, `standing.walled`)
is on no rung at all until the reset. A legacy server (one that ignores overrides)
gets subscriptions only. A credential in
`tried` is never planned again, so every rung grows the tried set.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from types import MappingProxyType
from typing import Literal, NamedTuple

from agent_server.controller.pool.standing import (
    LAST_RESORT_AGE,
    Standing,
    failed_recently,
    fresh_refusal,
    headroom_key,
    refused_recently,
    throttled,
    walled,
)
from agent_server.controller.pool.state import (
    Assignment,
    CredentialInfo,
    CredentialKind,
    Failure,
    FailureKind,
    PoolSnapshot,
)

RungReason = Literal["assigned", "headroom", "last_resort", "api_key", "gateway"]
_NONE: Mapping[FailureKind, Failure] = MappingProxyType({})


class Rung(NamedTuple):
    """One attempt the walk may make: a credential, and why it is on the ladder."""

    credential_id: str
    kind: CredentialKind
    reason: RungReason


@dataclass(frozen=True)
class PoolView:
    """The pool as one agent's walk sees it."""

    standings: tuple[Standing, ...]
    """Every credential, in pool-file order."""
    assignment: Assignment | None
    api_key_allowed: bool = True
    """The agent did not opt out of the platform key."""
    gateway_until: datetime | None = None

    @classmethod
    def of(
        cls,
        infos: Iterable[CredentialInfo],
        snapshot: PoolSnapshot,
        agent: str,
        *,
        api_key_allowed: bool = True,
        now: datetime | None = None,
    ) -> PoolView:
        """The view of `agent` over the credentials `infos` from a store's snapshot; turns
        in flight are the leases not ended by `now` (None: every lease kept)."""
        agents = Counter(a.credential_id for a in snapshot.assignments.values())
        failures, readings = snapshot.failures, snapshot.readings
        standings = tuple(
            Standing(
                info,
                failures.get(info.id, _NONE),
                readings.get(info.id),
                agents[info.id],
                snapshot.in_flight(info.id, now),
            )
            for info in infos
        )
        return cls(
            standings,
            snapshot.assignments.get(agent),
            api_key_allowed,
            snapshot.gateway_until.get(agent),
        )


@dataclass(frozen=True)
class TurnContext:
    """What one walk knows of its turn so far."""

    now: datetime
    interactive: bool
    tried: frozenset[str] = frozenset()
    legacy: bool = False


def plan_rungs(view: PoolView, turn: TurnContext) -> list[Rung]:
    """Every rung the turn may still try, best first."""
    now, tried = turn.now, turn.tried
    assigned_id = view.assignment.credential_id if view.assignment else None
    first: list[Rung] = []
    healthy: list[Standing] = []
    skipped: list[Standing] = []
    key = gateway = None
    for standing in view.standings:  # one pass: a pool may hold a thousand credentials
        ident, kind = standing.info
        if ident in tried:
            continue
        if ident == assigned_id and _chosen_since(standing, view.assignment):
            first.append(Rung(ident, kind, "assigned"))
            continue
        if walled(standing, now) is not None:
            continue
        if kind == "api_key":
            key = key or standing
        elif kind == "gateway":
            gateway = gateway or standing
        elif ident == assigned_id and _worth_first(standing, now):
            first.append(Rung(ident, kind, "assigned"))
        elif failed_recently(standing, now):
            skipped.append(standing)
        elif not fresh_refusal(standing, now):
            healthy.append(standing)
    healthy.sort(key=lambda s: headroom_key(s, now))
    rungs = first + [Rung(s.info.id, s.info.kind, "headroom") for s in healthy]
    rungs += [Rung(s.info.id, s.info.kind, "last_resort") for s in _last_resorts(skipped, turn)]
    if turn.legacy:
        return rungs
    if key is not None and view.api_key_allowed and not refused_recently(key, now):
        rungs.append(_rung(key, "api_key"))
    if gateway is not None and not refused_recently(gateway, now):
        on_gateway = view.gateway_until is not None and now < view.gateway_until
        rungs.insert(0 if on_gateway else len(rungs), _rung(gateway, "gateway"))
    return rungs


def _chosen_since(standing: Standing, assignment: Assignment | None) -> bool:
    """The assignment was made after the credential's last failure: an operator chose it
    by hand, or the walk committed it on a service since. Either word is newer than the
    failure, so the skip list does not second-guess it."""
    failure = standing.last_failure
    if failure is None or assignment is None or assignment.generation <= 1:
        return False  # generation 1 is the pool's own first pick: nobody's word
    return failure.at < assignment.assigned_at


def first_subscription(view: PoolView, now: datetime) -> str:
    """A new agent's first subscription, by the ranking every turn uses (headroom bands,
    then fewest agents, then fewest turns in flight, then the id): new agents spread over
    the pool's accounts. One that is walled or failed recently comes only when no other
    is left."""
    subscriptions = [s for s in view.standings if s.info.kind == "subscription"]
    open_ = [s for s in subscriptions if walled(s, now) is None and not failed_recently(s, now)]
    return min(open_ or subscriptions, key=lambda s: headroom_key(s, now)).info.id


def _worth_first(standing: Standing, now: datetime) -> bool:
    return not throttled(standing, now) and not failed_recently(standing, now)


def _last_resorts(skipped: Sequence[Standing], turn: TurnContext) -> list[Standing]:
    """The skip list's candidates: the oldest failure first, then by headroom."""
    now = turn.now
    eligible = [
        s
        for s in skipped
        if turn.interactive or (f := s.last_failure) is None or now - f.at >= LAST_RESORT_AGE
    ]
    return sorted(eligible, key=lambda s: (_failed_at(s, now), headroom_key(s, now)))


def _failed_at(standing: Standing, now: datetime) -> datetime:
    failure = standing.last_failure
    return failure.at if failure is not None else now


def _rung(standing: Standing, reason: RungReason) -> Rung:
    return Rung(standing.info.id, standing.info.kind, reason)
