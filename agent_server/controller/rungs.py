"""The walk's ladder: which credentials a turn may still try, in order (pure).

1. the agent's assigned subscription, unless it is throttled or failed recently
   (pre-dispatch: the first attempt then goes to the next rung);
2. the other subscriptions with no failure in the skip window, ranked by headroom
   (`standing.headroom_key`); a fresh refusal is dropped;
3. last resorts, from the skip list: an interactive turn takes any untried one, an
   autonomous one only those whose last failure is `LAST_RESORT_AGE` old; the oldest
   failure first;
4. the platform API key: when the pool has one, the agent did not opt out, and it was
   not refused inside its window;
5. the gateway, when every Claude credential is exhausted. After the gateway served an
   agent, it goes first for that agent until its cooldown ends; then the ladder
   probes the subscriptions again.

A legacy server (one that ignores overrides) gets subscriptions only. A credential in
`tried` is never planned again, so every rung grows the tried set.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from agent_server.controller.pool_state import (
    Assignment,
    CredentialInfo,
    CredentialKind,
    PoolSnapshot,
)
from agent_server.controller.standing import (
    LAST_RESORT_AGE,
    Standing,
    failed_recently,
    fresh_refusal,
    headroom_key,
    refused_recently,
    throttled,
)

RungReason = Literal["assigned", "headroom", "last_resort", "api_key", "gateway"]


@dataclass(frozen=True)
class Rung:
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
    ) -> PoolView:
        """The view of `agent` over the credentials `infos` from a store's snapshot."""
        agents = Counter(a.credential_id for a in snapshot.assignments.values())
        standings = tuple(
            Standing(
                info,
                snapshot.failures.get(info.id, {}),
                snapshot.readings.get(info.id),
                agents[info.id],
            )
            for info in infos
        )
        return cls(
            standings,
            snapshot.assignments.get(agent),
            api_key_allowed,
            snapshot.gateway_until.get(agent),
        )

    def standing(self, credential_id: str) -> Standing | None:
        """The standing of one credential of the pool."""
        return next((s for s in self.standings if s.info.id == credential_id), None)


@dataclass(frozen=True)
class TurnContext:
    """What one walk knows of its turn so far."""

    now: datetime
    interactive: bool
    tried: frozenset[str] = frozenset()
    legacy: bool = False


def plan_rungs(view: PoolView, turn: TurnContext) -> list[Rung]:
    """Every rung the turn may still try, best first."""
    now = turn.now
    untried = [s for s in view.standings if s.info.id not in turn.tried]
    subscriptions = [s for s in untried if s.info.kind == "subscription"]
    assigned_id = view.assignment.credential_id if view.assignment else None
    rungs: list[Rung] = []
    for standing in subscriptions:
        if standing.info.id == assigned_id and _worth_first(standing, now):
            rungs.append(_rung(standing, "assigned"))
    others = [s for s in subscriptions if not rungs or s.info.id != assigned_id]
    skipped = [s for s in others if failed_recently(s, now)]
    ranked = sorted(
        (s for s in others if s not in skipped and not fresh_refusal(s, now)),
        key=lambda s: headroom_key(s, now),
    )
    rungs += [_rung(s, "headroom") for s in ranked]
    rungs += [_rung(s, "last_resort") for s in _last_resorts(skipped, turn)]
    if turn.legacy:
        return rungs
    key = _one(untried, "api_key")
    if key is not None and view.api_key_allowed and not refused_recently(key, now):
        rungs.append(_rung(key, "api_key"))
    gateway = _one(untried, "gateway")
    if gateway is not None and not refused_recently(gateway, now):
        on_gateway = view.gateway_until is not None and now < view.gateway_until
        rungs.insert(0 if on_gateway else len(rungs), _rung(gateway, "gateway"))
    return rungs


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


def _one(standings: Sequence[Standing], kind: CredentialKind) -> Standing | None:
    return next((s for s in standings if s.info.kind == kind), None)


def _rung(standing: Standing, reason: RungReason) -> Rung:
    return Rung(standing.info.id, standing.info.kind, reason)
