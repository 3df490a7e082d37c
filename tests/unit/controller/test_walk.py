"""The walk over in-process servers (`httpx.MockTransport`): rungs, commit, legacy, exhausted.

Each scene's servers answer by the credential a turn carries (tests/support/mock_agent.py);
the store is SQLite in a temp dir. The same scenes on real servers and the real CLI are
tests/e2e/controller/.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from pydantic import SecretStr

from agent_server.controller import (
    Assignment,
    Failure,
    PoolCredential,
    PoolStore,
    UnknownAgent,
    Walker,
    WalkEvent,
    WalkPhase,
    WalkTurn,
    build_pool,
    open_store,
)
from tests.support.mock_agent import MockAgent, Verdict

pytestmark = pytest.mark.anyio
NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
A, B, C = "tsec-sub-a-0123456789", "tsec-sub-b-0123456789", "tsec-sub-c-0123456789"
KEY, GATEWAY = "tsec-key-0123456789", "tsec-gateway-0123456789"
POOL = build_pool(
    [
        PoolCredential("a", "subscription", SecretStr(A)),
        PoolCredential("b", "subscription", SecretStr(B)),
        PoolCredential("c", "subscription", SecretStr(C)),
        PoolCredential("key", "api_key", SecretStr(KEY)),
        PoolCredential("gw", "gateway", SecretStr(GATEWAY), "https://gw.example/anthropic"),
    ]
)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[PoolStore]:
    opened = await open_store(f"sqlite:///{tmp_path}/pool.sqlite3")
    await opened.register_credentials(POOL.infos)
    try:
        yield opened
    finally:
        await opened.close()


def _walker(store: PoolStore, agents: dict[str, MockAgent], events: list[WalkEvent]) -> Walker:
    clients = {name: agent.client() for name, agent in agents.items()}
    return Walker(clients, store, POOL, clock=lambda: NOW, hook=events.append)


async def _assign(store: PoolStore, agent: str, credential_id: str) -> Assignment:
    made = await store.compare_and_set_assignment(
        agent, credential_id, expected_generation=None, at=NOW - timedelta(days=1)
    )
    assert made is not None
    return made


async def test_the_ladder_is_climbed_and_the_server_that_served_is_committed(
    store: PoolStore,
) -> None:
    """a refuses (429), b (auth), c serves: c is committed in the store, then on the server."""
    server = MockAgent({A: Verdict("rate_limit", NOW + timedelta(hours=1)), B: Verdict("auth")})
    await _assign(store, "agent-1", "a")
    events: list[WalkEvent] = []
    result = await _walker(store, {"agent-1": server}, events).walk(WalkTurn("agent-1", "hi"))
    assert result.outcome == "served"
    assert [(t.credential_id, t.error_code) for t in result.trail] == [
        ("a", "rate_limit"),
        ("b", "auth"),
        ("c", None),
    ]
    assert server.ran() == [A, B, C]
    assert len({turn["execution_id"] for turn in server.turns}) == 1
    assert (result.served_by, result.committed) == ("c", True)
    assignment = await store.assignment("agent-1")
    assert assignment is not None
    assert (assignment.credential_id, assignment.generation) == ("c", 2)
    assert [(r["token"], r["expected_generation"]) for r in server.reloads] == [(C, 1)]
    failures = (await store.snapshot()).failures
    assert set(failures["a"]) == {"rate_limit"}
    assert set(failures["b"]) == {"auth"}
    assert WalkPhase.COMMITTED in [event.phase for event in events]
    said = json.dumps([event.as_json() for event in events])  # JSON-serialisable, no secret
    assert not [secret for secret in (A, B, C, KEY, GATEWAY) if secret in said]
    assert set(events[0].as_json()) == {
        "phase", "agent", "at", "credential", "error_code", "resets_at", "note",
    }  # fmt: skip


async def test_a_failed_recently_assignment_is_skipped_before_dispatch(store: PoolStore) -> None:
    """A second turn does not send to a, refused a minute ago, nor to b: c is first."""
    server = MockAgent({A: Verdict("rate_limit", NOW + timedelta(hours=1)), B: Verdict("auth")})
    walker = _walker(store, {"agent-1": server}, [])
    await walker.walk(WalkTurn("agent-1", "one"))
    await walker.walk(WalkTurn("agent-1", "two"))
    assert server.ran()[3:] == [C]


async def test_of_two_committers_one_wins_and_the_loser_changes_nothing(
    store: PoolStore,
) -> None:
    """A peer commits between the walk's read and its compare-and-set: `commit_lost`, and
    the loser's server is not reloaded."""
    await _assign(store, "agent-1", "a")

    class Racing:
        """The store, with a peer's commit landing just before the walk's."""

        def __getattr__(self, name: str) -> object:
            return getattr(store, name)

        async def compare_and_set_assignment(
            self, agent: str, credential_id: str, *, expected_generation: int | None, at: datetime
        ) -> Assignment | None:
            await store.compare_and_set_assignment(
                agent, "c", expected_generation=expected_generation, at=at
            )
            return await store.compare_and_set_assignment(
                agent, credential_id, expected_generation=expected_generation, at=at
            )

    server = MockAgent({A: Verdict("rate_limit", NOW + timedelta(hours=1))})
    events: list[WalkEvent] = []
    racing: PoolStore = Racing()  # type: ignore[assignment]
    walker = Walker(
        {"agent-1": server.client()}, racing, POOL, clock=lambda: NOW, hook=events.append
    )
    result = await walker.walk(WalkTurn("agent-1", "hi"))
    assert (result.served_by, result.committed) == ("b", False)
    assert server.reloads == []
    assignment = await store.assignment("agent-1")
    assert assignment is not None
    assert assignment.credential_id == "c"
    assert WalkPhase.COMMIT_LOST in [event.phase for event in events]


async def test_a_legacy_server_is_walked_once_by_reload(store: PoolStore) -> None:
    """A server that ignores overrides ran its own a: b is committed by reload-token, and
    the turn is sent once more without an override."""
    server = MockAgent({A: Verdict("rate_limit", NOW + timedelta(hours=1))}, held=A, legacy=True)
    await _assign(store, "agent-1", "a")
    result = await _walker(store, {"agent-1": server}, []).walk(WalkTurn("agent-1", "hi"))
    assert result.outcome == "served"
    assert result.legacy
    assert (result.served_by, result.committed) == ("b", True)
    assert server.ran() == [A, B]
    assert server.turns[1].get("auth_override") is None
    assert [r["token"] for r in server.reloads] == [B]


async def test_every_credential_exhausted_waits_for_the_earliest_reset(store: PoolStore) -> None:
    """Every subscription capped, the key and the gateway refused: one retry, due at the
    earliest reset any of them named."""
    verdicts = {
        A: Verdict("rate_limit", NOW + timedelta(hours=3)),
        B: Verdict("rate_limit", NOW + timedelta(hours=1)),
        C: Verdict("rate_limit", NOW + timedelta(hours=2)),
        KEY: Verdict("billing"),
        GATEWAY: Verdict("auth"),
    }
    server = MockAgent(verdicts)
    await _assign(store, "agent-1", "a")
    result = await _walker(store, {"agent-1": server}, []).walk(
        WalkTurn("agent-1", "hi", execution_id="job-1")
    )
    assert result.outcome == "waiting_for_capacity"
    assert [t.credential_id for t in result.trail] == ["a", "b", "c", "key", "gw"]
    assert result.earliest_reset == NOW + timedelta(hours=1)
    assert result.retry is not None
    assert result.retry.due_at == NOW + timedelta(hours=1)
    assert result.retry.turn_ref == "job-1"
    assert result.trail_text() == (
        "a (rate limit) -> b (rate limit) -> c (rate limit) -> platform API key (billing)"
        " -> gateway gw (auth)"
    )


async def test_a_walker_serves_a_fleet_each_turn_on_its_agents_server(store: PoolStore) -> None:
    """Two agents, two servers, one walker: each turn, commit and assignment reaches the
    server of the agent it names, never the other's."""
    one, two = MockAgent({}), MockAgent({A: Verdict("auth")})
    await _assign(store, "agent-1", "a")
    await _assign(store, "agent-2", "a")
    walker = _walker(store, {"agent-1": one, "agent-2": two}, [])
    await walker.walk(WalkTurn("agent-1", "hi"))
    await walker.walk(WalkTurn("agent-2", "hi"))
    assert (one.ran(), two.ran()) == ([A], [A, B])
    assert (one.reloads, [r["token"] for r in two.reloads]) == ([], [B])
    await walker.assign("agent-1", "c")
    assert [r["token"] for r in one.reloads] == [C]
    assert len(two.reloads) == 1


async def test_a_turn_of_an_agent_without_a_client_raises(store: PoolStore) -> None:
    """No client for the agent a turn names: `UnknownAgent`, and nothing is sent."""
    walker = _walker(store, {"agent-1": MockAgent({})}, [])
    with pytest.raises(UnknownAgent, match="agent-9"):
        await walker.walk(WalkTurn("agent-9", "hi"))
    callable_walker = Walker(lambda name: MockAgent({}).client(), store, POOL)
    assert (await callable_walker.walk(WalkTurn("agent-9", "hi"))).outcome == "served"


async def test_a_wall_days_high_is_sent_no_turn_before_it_falls(store: PoolStore) -> None:
    """b refused with a reset 3 days out: hours later (past the skip window and the
    last-resort age) no turn, autonomous or interactive, is sent to b; after the reset
    one is."""
    server = MockAgent({B: Verdict("rate_limit", NOW + timedelta(days=3))})
    await _assign(store, "agent-1", "b")
    clock = [NOW]
    walker = Walker({"agent-1": server.client()}, store, POOL, clock=lambda: clock[0])
    await walker.walk(WalkTurn("agent-1", "first"))
    assert server.ran() == [B, A]
    await _assign_again(store, "agent-1", "b")
    for hours in (1, 3, 30, 71):
        clock[0] = NOW + timedelta(hours=hours)
        await walker.walk(WalkTurn("agent-1", "later", interactive=hours == 30))
    assert B not in server.ran()[2:]
    server.verdicts.clear()
    clock[0] = NOW + timedelta(days=3, minutes=1)
    await _assign_again(store, "agent-1", "b")
    await walker.walk(WalkTurn("agent-1", "after the reset"))
    assert server.ran()[-1] == B


async def test_a_reset_past_its_window_is_bounded_by_the_window(store: PoolStore) -> None:
    """A five-hour window said to reset in a year (what the agent printed) is kept as at
    most five hours ahead."""
    server = MockAgent({A: Verdict("rate_limit", NOW + timedelta(days=365))})
    await _assign(store, "agent-1", "a")
    result = await _walker(store, {"agent-1": server}, []).walk(WalkTurn("agent-1", "hi"))
    assert result.trail[0].resets_at == NOW + timedelta(hours=5)
    failure = (await store.snapshot()).failures["a"]["rate_limit"]
    assert failure.resets_at == NOW + timedelta(hours=5)


async def _assign_again(store: PoolStore, agent: str, credential_id: str) -> None:
    current = await store.assignment(agent)
    expected = current.generation if current else None
    await store.compare_and_set_assignment(
        agent, credential_id, expected_generation=expected, at=NOW - timedelta(days=1)
    )


async def test_a_legacy_servers_unknown_token_is_nobodys_fault(store: PoolStore) -> None:
    """The old server holds a token the pool does not know and is refused: no credential
    is blamed (an `unattributed` event says so); the best subscription is then applied
    and the turn served on it, which the server's fingerprint names."""
    stranger = "tsec-stranger-0123456789"
    server = MockAgent({stranger: Verdict("auth")}, held=stranger, legacy=True)
    await _assign(store, "agent-1", "a")
    events: list[WalkEvent] = []
    result = await _walker(store, {"agent-1": server}, events).walk(WalkTurn("agent-1", "hi"))
    assert (await store.snapshot()).failures == {}
    assert [(t.credential_id, t.error_code) for t in result.trail] == [(None, "auth"), ("a", None)]
    assert result.trail_text() == "the server's own credential (auth) -> a (served)"
    assert result.served_by == "a"
    assert WalkPhase.UNATTRIBUTED in [event.phase for event in events]


async def test_a_legacy_server_that_serves_an_unknown_token_names_nobody(
    store: PoolStore,
) -> None:
    """Served on the old server's own unknown token: `served_by` is None, not a guess, and
    nothing is committed."""
    server = MockAgent({}, held="tsec-stranger-0123456789", legacy=True)
    await _assign(store, "agent-1", "a")
    result = await _walker(store, {"agent-1": server}, []).walk(WalkTurn("agent-1", "hi"))
    assert result.outcome == "served"
    assert (result.served_by, result.committed, result.legacy) == (None, False, True)
    assert server.reloads == []


async def test_a_new_commit_stabilizes_or_is_refused_as_an_immediate_hard_limit(
    store: PoolStore,
) -> None:
    """warden's phases: the walk leaves a (`switch_started`), commits b (`stabilizing`); a
    turn started after the commit served on b within the window is `stabilized`; when b
    refuses inside the window instead, that is an `immediate_hard_limit` and the walk
    advances to c."""
    server = MockAgent({A: Verdict("auth")})
    await _assign(store, "agent-1", "a")
    clock = [NOW]
    events: list[WalkEvent] = []
    walker = Walker(
        {"agent-1": server.client()}, store, POOL, clock=lambda: clock[0], hook=events.append
    )
    await walker.walk(WalkTurn("agent-1", "one"))
    phases = [event.phase for event in events]
    assert phases.index(WalkPhase.SWITCH_STARTED) < phases.index(WalkPhase.STABILIZING)
    clock[0] = NOW + timedelta(seconds=3)
    await walker.walk(WalkTurn("agent-1", "two"))
    assert events[-1].phase is WalkPhase.SERVED
    assert WalkPhase.STABILIZED in [event.phase for event in events[len(phases) :]]

    server.verdicts[B] = Verdict("rate_limit", NOW + timedelta(hours=1))
    clock[0] = NOW + timedelta(seconds=6)
    result = await walker.walk(WalkTurn("agent-1", "three"))
    assert [(t.credential_id, t.error_code) for t in result.trail] == [
        ("b", "rate_limit"),
        ("c", None),
    ]
    assert set((await store.snapshot()).failures["b"]) == {"rate_limit", "immediate_hard_limit"}


async def test_no_hard_limit_once_the_window_passed(store: PoolStore) -> None:
    """A refusal after the stabilization window is an ordinary one."""
    server = MockAgent({A: Verdict("auth")})
    await _assign(store, "agent-1", "a")
    clock = [NOW]
    walker = Walker({"agent-1": server.client()}, store, POOL, clock=lambda: clock[0])
    await walker.walk(WalkTurn("agent-1", "one"))
    server.verdicts[B] = Verdict("auth")
    clock[0] = NOW + timedelta(seconds=11)
    await walker.walk(WalkTurn("agent-1", "two"))
    assert set((await store.snapshot()).failures["b"]) == {"auth"}


async def test_an_operators_assignment_is_not_second_guessed(store: PoolStore) -> None:
    """b failed a minute ago; the operator assigns it by hand: the next autonomous turn
    goes to b first. `clear` forgets a credential's failures (a rotated token)."""
    server = MockAgent({B: Verdict("auth")})
    await _assign(store, "agent-1", "b")
    clock = [NOW]
    walker = Walker({"agent-1": server.client()}, store, POOL, clock=lambda: clock[0])
    await walker.walk(WalkTurn("agent-1", "one"))  # b refuses; a serves and is committed
    server.verdicts.clear()
    clock[0] = NOW + timedelta(minutes=1)
    await walker.assign("agent-1", "b")
    clock[0] = NOW + timedelta(minutes=2)
    result = await walker.walk(WalkTurn("agent-1", "two"))
    assert [t.credential_id for t in result.trail] == ["b"]
    await walker.clear("b")
    assert "b" not in (await store.snapshot()).failures


async def test_stop_cancels_waiting_turns_and_a_walk_in_flight(store: PoolStore) -> None:
    """Two waiting turns of one agent are cancelled by `stop`; a walk in flight is
    superseded: its late answer commits nothing."""
    every = {s: Verdict("rate_limit", NOW + timedelta(hours=1)) for s in (A, B, C, KEY, GATEWAY)}
    server = MockAgent(every)
    await _assign(store, "agent-1", "a")
    walker = _walker(store, {"agent-1": server}, [])
    first = await walker.walk(WalkTurn("agent-1", "one", execution_id="job-1"))
    second = await walker.walk(WalkTurn("agent-1", "two", execution_id="job-2"))
    assert first.retry is not None and second.retry is not None
    waiting = (await store.snapshot()).retries
    assert set(waiting) == {"job-1", "job-2"}
    assert await walker.stop("agent-1") == 2
    assert (await store.snapshot()).retries == {}

    server.verdicts = {A: Verdict("auth")}
    await walker.clear("a")
    original = server._turn

    def stop_meanwhile(body: dict[str, object]) -> object:
        answer = original(body)  # type: ignore[arg-type]
        walker._stops["agent-1"] += 1  # as `stop` does, while the turn runs
        return answer

    server._turn = stop_meanwhile  # type: ignore[assignment,method-assign]
    result = await walker.walk(WalkTurn("agent-1", "three"))
    assert result.outcome == "stopped"
    assert server.reloads == []
    assignment = await store.assignment("agent-1")
    assert assignment is not None and assignment.credential_id == "a"


async def test_a_rerun_turn_the_server_served_is_read_back_not_run_again(
    store: PoolStore,
) -> None:
    """`rerun=True`: the server retained the turn as served, so its answer is read back and
    no turn is sent; a turn it never ran is walked as usual."""
    server = MockAgent({})
    await _assign(store, "agent-1", "a")
    walker = _walker(store, {"agent-1": server}, [])
    await walker.walk(WalkTurn("agent-1", "hi", execution_id="job-1"))
    again = await walker.walk(WalkTurn("agent-1", "hi", execution_id="job-1", rerun=True))
    assert (again.outcome, again.served_by) == ("served", "a")
    assert again.answer is not None and again.answer.response == "done"
    assert len(server.turns) == 1
    fresh = await walker.walk(WalkTurn("agent-1", "hi", execution_id="job-2", rerun=True))
    assert fresh.outcome == "served"
    assert len(server.turns) == 2


def _capped(*idents: str) -> list[PoolCredential]:
    secrets = {"a": A, "b": B, "c": C}
    return [
        PoolCredential(i, "subscription", SecretStr(secrets[i]), max_concurrent_turns=1)
        for i in idents
    ]


async def test_a_credential_at_its_ceiling_is_passed_over_not_waited_for(
    store: PoolStore,
) -> None:
    """a's one slot is leased elsewhere: the turn is never sent to a, b serves, an
    `at_ceiling` event says why, and b's lease is released when the turn ends."""
    pool = build_pool(_capped("a", "b"))
    await _assign(store, "agent-1", "a")
    later = NOW + timedelta(minutes=10)
    assert await store.acquire_lease("a", "elsewhere", ceiling=1, at=NOW, until=later)
    server = MockAgent({})
    events: list[WalkEvent] = []
    walker = Walker(
        {"agent-1": server.client()}, store, pool, clock=lambda: NOW, hook=events.append
    )
    result = await walker.walk(WalkTurn("agent-1", "hi"))
    assert (result.outcome, result.served_by) == ("served", "b")
    assert server.ran() == [B]
    skipped = [e for e in events if e.phase == WalkPhase.AT_CEILING]
    assert [(e.credential_id, e.note) for e in skipped] == [("a", "at ceiling (1 turns in flight)")]
    assert await store.acquire_lease("b", "next", ceiling=1, at=NOW, until=later)


async def test_an_agent_keeps_its_subscription_when_it_was_only_at_its_ceiling(
    store: PoolStore,
) -> None:
    """Affinity: a was full, not refusing; b serves this turn, but the agent stays on a
    (nothing committed, no reload) and its next turn goes to a again once a has room."""
    pool = build_pool(_capped("a", "b"))
    made = await _assign(store, "agent-1", "a")
    later = NOW + timedelta(minutes=10)
    assert await store.acquire_lease("a", "elsewhere", ceiling=1, at=NOW, until=later)
    server = MockAgent({})
    walker = Walker({"agent-1": server.client()}, store, pool, clock=lambda: NOW)
    result = await walker.walk(WalkTurn("agent-1", "hi"))
    assert (result.served_by, result.committed) == ("b", False)
    assert await store.assignment("agent-1") == made
    assert server.reloads == []
    await store.release_lease("a", "elsewhere")
    again = await walker.walk(WalkTurn("agent-1", "again"))
    assert (again.served_by, server.ran()) == ("a", [B, A])


async def test_every_credential_at_its_ceiling_waits_for_capacity(store: PoolStore) -> None:
    """Every slot is leased: nothing is sent; the turn waits as when nothing can serve."""
    pool = build_pool(_capped("a", "b"))
    await _assign(store, "agent-1", "a")
    for ident in ("a", "b"):
        until = NOW + timedelta(minutes=10)
        assert await store.acquire_lease(ident, "elsewhere", ceiling=1, at=NOW, until=until)
    server = MockAgent({})
    walker = Walker({"agent-1": server.client()}, store, pool, clock=lambda: NOW)
    result = await walker.walk(WalkTurn("agent-1", "hi"))
    assert result.outcome == "waiting_for_capacity"
    assert server.ran() == []
    assert result.retry is not None


async def test_a_failed_credential_probed_too_recently_is_passed_over(store: PoolStore) -> None:
    """a and b refused minutes ago: an interactive turn may probe them as last resorts,
    but a was probed just now elsewhere, so only b is sent the turn (a is not blamed)."""
    pool = build_pool(_capped("a", "b"))
    await _assign(store, "agent-1", "a")
    for ident, age in (("a", 2), ("b", 1)):  # the oldest failure is the first last resort
        failed = Failure(ident, "auth", NOW - timedelta(minutes=age), None, None)
        await store.record(failure=failed)
    assert await store.claim_probe("a", at=NOW, spacing=timedelta(seconds=1))
    server = MockAgent({})
    events: list[WalkEvent] = []
    walker = Walker(
        {"agent-1": server.client()}, store, pool, clock=lambda: NOW, hook=events.append
    )
    result = await walker.walk(WalkTurn("agent-1", "hi", interactive=True))
    assert (result.outcome, result.served_by) == ("served", "b")
    assert server.ran() == [B]
    spaced = [e.credential_id for e in events if e.phase == WalkPhase.PROBE_SPACED]
    assert spaced == ["a"]
    assert not await store.claim_probe("b", at=NOW, spacing=timedelta(seconds=1))
