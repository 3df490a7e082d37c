"""The ladder a turn may still try: `plan_rungs` as a table of named pools."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import pytest

from agent_server.controller.pool.rungs import (
    PoolView,
    TurnContext,
    first_subscription,
    plan_rungs,
)
from agent_server.controller.pool.state import (
    Assignment,
    CredentialInfo,
    Failure,
    PoolSnapshot,
    Reading,
    WindowUse,
)

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
MIN = timedelta(minutes=1)
POOL = (
    CredentialInfo("a", "subscription"),
    CredentialInfo("b", "subscription"),
    CredentialInfo("c", "subscription"),
    CredentialInfo("key", "api_key"),
    CredentialInfo("gw", "gateway"),
)


def failed(
    credential: str, kind: str, minutes_ago: float, reset_in: float | None = None
) -> Failure:
    resets_at = NOW + reset_in * MIN if reset_in is not None else None
    return Failure(credential, kind, NOW - minutes_ago * MIN, resets_at)  # type: ignore[arg-type]


def measured(
    credential: str, five: float, minutes_ago: float = 1, status: str = "allowed"
) -> Reading:
    window = WindowUse(five, NOW + 60 * MIN, status)
    return Reading(credential, NOW - minutes_ago * MIN, status, None, window, None)


@dataclass(frozen=True)
class Case:
    """One pool: what the store knows, and the turn."""

    failures: tuple[Failure, ...] = ()
    readings: tuple[Reading, ...] = ()
    assigned: str | None = "a"
    others_on: dict[str, int] = field(default_factory=dict)
    interactive: bool = False
    tried: frozenset[str] = frozenset()
    legacy: bool = False
    api_key_allowed: bool = True
    gateway_until: datetime | None = None
    assigned_at: datetime = NOW - timedelta(days=1)
    """Long before every failure of a case, unless the case says otherwise."""

    def plan(self) -> list[str]:
        by_credential: dict[str, dict[str, Failure]] = {}
        for failure in self.failures:
            by_credential.setdefault(failure.credential_id, {})[failure.kind] = failure
        assignments = {
            f"other-{credential}-{n}": Assignment(f"other-{credential}-{n}", credential, 1, NOW)
            for credential, count in self.others_on.items()
            for n in range(count)
        }
        if self.assigned:
            assignments["agent"] = Assignment("agent", self.assigned, 4, self.assigned_at)
        snapshot = PoolSnapshot(
            assignments=assignments,
            failures=by_credential,  # type: ignore[arg-type]
            readings={r.credential_id: r for r in self.readings},
            gateway_until={"agent": self.gateway_until} if self.gateway_until else {},
        )
        view = PoolView.of(POOL, snapshot, "agent", api_key_allowed=self.api_key_allowed)
        turn = TurnContext(NOW, self.interactive, self.tried, self.legacy)
        return [f"{rung.credential_id}:{rung.reason}" for rung in plan_rungs(view, turn)]


CASES = [
    pytest.param(
        Case(),
        ["a:assigned", "b:headroom", "c:headroom", "key:api_key", "gw:gateway"],
        id="a quiet pool: the assignment, the others by name, the key, the gateway",
    ),
    pytest.param(
        Case(readings=(measured("b", 0.91), measured("c", 0.12))),
        ["a:assigned", "c:headroom", "b:headroom", "key:api_key", "gw:gateway"],
        id="headroom ranks the emptier subscription first",
    ),
    pytest.param(
        Case(readings=(measured("c", 0.91),)),
        ["a:assigned", "c:headroom", "b:headroom", "key:api_key", "gw:gateway"],
        id="no reading ranks after a measured one",
    ),
    pytest.param(
        Case(readings=(measured("b", 0.31), measured("c", 0.38)), others_on={"b": 2}),
        ["a:assigned", "c:headroom", "b:headroom", "key:api_key", "gw:gateway"],
        id="in one band, fewer agents first",
    ),
    pytest.param(
        Case(failures=(failed("a", "rate_limit", 5, reset_in=60),)),
        ["b:headroom", "c:headroom", "key:api_key", "gw:gateway"],
        id="pre-dispatch: a rate-limited assignment is not tried first (autonomous: not at all)",
    ),
    pytest.param(
        Case(failures=(failed("a", "rate_limit", 5, reset_in=60),), interactive=True),
        ["b:headroom", "c:headroom", "key:api_key", "gw:gateway"],
        id="interactive: an assignment behind a known reset is no last resort either",
    ),
    pytest.param(
        Case(
            failures=(failed("a", "rate_limit", 5, reset_in=60 * 24),),
            assigned_at=NOW - 1 * MIN,
        ),
        ["a:assigned", "b:headroom", "c:headroom", "key:api_key", "gw:gateway"],
        id="an assignment made after its failure (an operator's choice) goes first, wall or not",
    ),
    pytest.param(
        Case(failures=(failed("a", "rate_limit", 5),), interactive=True),
        ["b:headroom", "c:headroom", "a:last_resort", "key:api_key", "gw:gateway"],
        id="interactive: a rate limit with no reset known is a last resort",
    ),
    pytest.param(
        Case(failures=(failed("b", "rate_limit", 3 * 60, reset_in=10 * 24 * 60),)),
        ["a:assigned", "c:headroom", "key:api_key", "gw:gateway"],
        id="a wall 10 days high is remembered past the skip window",
    ),
    pytest.param(
        Case(failures=(failed("b", "rate_limit", 40, reset_in=10 * 24 * 60),), interactive=True),
        ["a:assigned", "c:headroom", "key:api_key", "gw:gateway"],
        id="a walled credential is no last resort, however old its failure",
    ),
    pytest.param(
        Case(
            failures=(failed("b", "rate_limit", 40, reset_in=10 * 24 * 60),),
            readings=(measured("b", 0.2, minutes_ago=1),),
        ),
        ["a:assigned", "b:headroom", "c:headroom", "key:api_key", "gw:gateway"],
        id="a fresh reading that serves, taken after the refusal, brings the wall down",
    ),
    pytest.param(
        Case(failures=(failed("key", "rate_limit", 10, reset_in=60),)),
        ["a:assigned", "b:headroom", "c:headroom", "gw:gateway"],
        id="a key behind a known reset is not offered past its 5-minute refusal window",
    ),
    pytest.param(
        Case(readings=(measured("a", 1.0, status="rejected"),)),
        ["b:headroom", "c:headroom", "key:api_key", "gw:gateway"],
        id="pre-dispatch: a fresh refusing reading keeps the assignment off the ladder",
    ),
    pytest.param(
        Case(readings=(measured("b", 1.0, status="rejected"),)),
        ["a:assigned", "c:headroom", "key:api_key", "gw:gateway"],
        id="a fresh refusal is dropped from the ranking",
    ),
    pytest.param(
        Case(failures=(failed("b", "auth", 10), failed("c", "billing", 45))),
        ["a:assigned", "c:last_resort", "key:api_key", "gw:gateway"],
        id="autonomous: only skipped ones whose failure is 30 min old",
    ),
    pytest.param(
        Case(failures=(failed("b", "auth", 10), failed("c", "billing", 45)), interactive=True),
        ["a:assigned", "c:last_resort", "b:last_resort", "key:api_key", "gw:gateway"],
        id="interactive: any skipped one, the oldest failure first",
    ),
    pytest.param(
        Case(failures=(failed("b", "rate_limit", 30, reset_in=-5),)),
        ["a:assigned", "b:headroom", "c:headroom", "key:api_key", "gw:gateway"],
        id="readmitted when its window has reset",
    ),
    pytest.param(
        Case(failures=(failed("b", "auth", 10),), readings=(measured("b", 0.2, 5),)),
        ["a:assigned", "b:headroom", "c:headroom", "key:api_key", "gw:gateway"],
        id="readmitted by a fresh serving reading after its failure",
    ),
    pytest.param(
        Case(failures=(failed("b", "auth", 10),), readings=(measured("b", 0.2, 15),)),
        ["a:assigned", "c:headroom", "key:api_key", "gw:gateway"],
        id="a reading from before the failure readmits nothing",
    ),
    pytest.param(
        Case(tried=frozenset({"a", "b"})),
        ["c:headroom", "key:api_key", "gw:gateway"],
        id="a tried credential is never planned again",
    ),
    pytest.param(
        Case(api_key_allowed=False),
        ["a:assigned", "b:headroom", "c:headroom", "gw:gateway"],
        id="an agent that opted out of the key",
    ),
    pytest.param(
        Case(failures=(failed("key", "billing", 100),)),
        ["a:assigned", "b:headroom", "c:headroom", "gw:gateway"],
        id="the key refused for billing in the last 2 h",
    ),
    pytest.param(
        Case(failures=(failed("key", "rate_limit", 6),)),
        ["a:assigned", "b:headroom", "c:headroom", "key:api_key", "gw:gateway"],
        id="the key offered again 5 min after a 429",
    ),
    pytest.param(
        Case(legacy=True, tried=frozenset({"a"})),
        ["b:headroom", "c:headroom"],
        id="a legacy server gets subscriptions only",
    ),
    pytest.param(
        Case(gateway_until=NOW + 5 * MIN),
        ["gw:gateway", "a:assigned", "b:headroom", "c:headroom", "key:api_key"],
        id="in the gateway's cooldown the gateway goes first",
    ),
    pytest.param(
        Case(gateway_until=NOW - MIN),
        ["a:assigned", "b:headroom", "c:headroom", "key:api_key", "gw:gateway"],
        id="after the cooldown the subscriptions are probed first again",
    ),
    pytest.param(
        Case(assigned=None),
        ["a:headroom", "b:headroom", "c:headroom", "key:api_key", "gw:gateway"],
        id="no assignment yet: ranked like the rest",
    ),
    pytest.param(
        Case(
            failures=(
                failed("a", "rate_limit", 5, reset_in=60),
                failed("b", "rate_limit", 5, reset_in=90),
                failed("c", "auth", 5),
                failed("key", "billing", 5),
                failed("gw", "auth", 5),
            )
        ),
        [],
        id="everything exhausted: nothing left to try",
    ),
]


@pytest.mark.parametrize(("case", "expected"), CASES)
def test_plan_rungs(case: Case, expected: list[str]) -> None:
    """The rungs, in order, with the reason each is on the ladder."""
    assert case.plan() == expected


def test_a_thousand_credentials_plan_without_repeating_one() -> None:
    """Every credential appears at most once, and never one already tried."""
    infos = tuple(CredentialInfo(f"s{n:04d}", "subscription") for n in range(1000))
    readings = {i.id: measured(i.id, (hash(i.id) % 100) / 100) for i in infos[::3]}
    view = PoolView.of(infos, PoolSnapshot(readings=readings), "agent")
    tried = frozenset(i.id for i in infos[:10])
    rungs = plan_rungs(view, TurnContext(NOW, interactive=True, tried=tried))
    ids = [r.credential_id for r in rungs]
    assert len(ids) == len(set(ids)) == 990
    assert not tried & set(ids)


def _loaded(in_flight: dict[str, int], *, ended: int = 0) -> PoolSnapshot:
    """Every subscription at 40% with one agent; `in_flight` live leases each, and `ended`
    leases that ended a minute ago on every one."""
    readings = {i.id: measured(i.id, 0.4) for i in POOL[:3]}
    assignments = {
        f"agent-{i.id}": Assignment(f"agent-{i.id}", i.id, 1, NOW - 60 * MIN) for i in POOL[:3]
    }
    leases = {
        i.id: (NOW + 5 * MIN,) * in_flight.get(i.id, 0) + (NOW - MIN,) * ended for i in POOL[:3]
    }
    return PoolSnapshot(assignments=assignments, readings=readings, leases=leases)


def test_a_new_agent_goes_where_fewest_turns_are_in_flight() -> None:
    """Same band, one agent each: the new agent goes to c, the one with no turn running;
    leases that ended do not count as load."""
    snapshot = _loaded({"a": 2, "b": 1}, ended=4)
    view = PoolView.of(POOL, snapshot, "new", now=NOW)
    assert first_subscription(view, NOW) == "c"
    assert [s.in_flight for s in view.standings[:3]] == [2, 1, 0]


def test_a_moved_agent_is_ranked_by_turns_in_flight_too() -> None:
    """The agent on a is refused there: b and c rank by load, the quieter first."""
    snapshot = _loaded({"b": 3, "c": 1})
    view = PoolView.of(POOL, snapshot, "agent-a", now=NOW)
    rungs = plan_rungs(view, TurnContext(NOW, interactive=False, tried=frozenset({"a"})))
    assert [r.credential_id for r in rungs if r.reason == "headroom"] == ["c", "b"]
