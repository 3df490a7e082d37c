"""The walk, end to end: a real server on loopback running the pinned Claude Code CLI
against the Messages API stand-in, which answers by credential (`ratelimit…` a 429 with
its reset, `weekly…` the weekly wall, `badauth…` a 401, `nocredit…` billing, anything
else serves): a wall and a dead token walked past, a pool exhausted, and a hundred turns
over two exhausted subscriptions."""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from agent_server.controller.clock import utc_now
from agent_server.controller.events import WalkEvent, WalkPhase
from agent_server.controller.pool.state import Failure, ScheduledRetry
from agent_server.controller.retries import RetryScheduler
from agent_server.controller.stores.base import open_store
from agent_server.controller.turn import WalkTurn
from tests.support.messages_api import Headroom, MessagesApiStandIn, fingerprint
from tests.support.server import ServerProcess
from tests.support.walk_harness import (  # noqa: F401 - the *_fixture names are fixtures
    HOUR,
    Credentials,
    about,
    agent_fixture,
    anyio_backend_fixture,
    api_fixture,
    assert_quiet,
    attempts,
    cli_env_fixture,
    creds_fixture,
    make_pool,
    seen,
    walking,
)

pytestmark = [pytest.mark.realcli, pytest.mark.anyio, pytest.mark.timeout(240)]


async def test_a_turn_walks_past_a_wall_and_a_dead_token_to_the_one_that_serves(
    agent: ServerProcess,
    api: MessagesApiStandIn,
    creds: Credentials,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A rate-limited (with a reset), B dead, C serving: C serves and is committed on the
    server and in the store, A and B are recorded with their kinds, and the next turn
    goes straight to C."""
    a, b, c = creds.new("ratelimit"), creds.new("badauth"), creds.new("good")
    api.headroom(c, Headroom(five_hour=0.4, seven_day=0.2))
    pool = make_pool(("a", "subscription", a), ("b", "subscription", b), ("c", "subscription", c))
    events: list[WalkEvent] = []
    before = len(api.message_requests)
    async with walking(agent, pool, f"sqlite:///{tmp_path}/pool.db", events) as (walker, store):
        first = await walker.walk(WalkTurn("agent-abc", "hi"))
        snapshot = await store.snapshot()
        between = len(api.message_requests)
        second = await walker.walk(WalkTurn("agent-abc", "hi again"))
        assignment = await store.assignment("agent-abc")
    assert first.outcome == "served", first.as_json()
    assert attempts(first) == [("a", "rate_limit"), ("b", "auth"), ("c", None)]
    assert (first.served_by, first.committed, first.status) == ("c", True, 200)
    assert about(first.trail[0].resets_at, HOUR)
    assert seen(api, before)[:3] == [fingerprint(a), fingerprint(b), fingerprint(c)]
    assert len(api.message_requests) - between == 1
    assert agent.status()["fingerprint"] == f"sha256:{fingerprint(c)}"
    assert assignment is not None
    assert (assignment.credential_id, assignment.generation) == ("c", 2)
    assert set(snapshot.failures["a"]) == {"rate_limit"}
    assert about(snapshot.failures["a"]["rate_limit"].resets_at, HOUR)
    assert set(snapshot.failures["b"]) == {"auth"}
    assert snapshot.readings["c"].five_hour is not None
    assert snapshot.readings["c"].five_hour.utilization == 0.4
    assert attempts(second) == [("c", None)]
    assert (second.served_by, second.committed) == ("c", False)
    assert seen(api, between) == [fingerprint(c)]
    phases = [e.phase for e in events]
    assert phases.count(WalkPhase.ATTEMPT_FAILED) == 2
    assert phases.count(WalkPhase.COMMITTED) == 1
    assert_quiet(events, creds, caplog.text)


async def test_no_rung_is_sent_without_time_for_it(
    agent: ServerProcess, api: MessagesApiStandIn, creds: Credentials, tmp_path: Path
) -> None:
    """A turn with less time than the floor plus the settle margin sends nothing."""
    pool = make_pool(("a", "subscription", creds.new("good")))
    before = len(api.message_requests)
    async with walking(agent, pool, f"sqlite:///{tmp_path}/pool.db", []) as (walker, _):
        result = await walker.walk(WalkTurn("agent-hurried", "hi", timeout_s=20))
    assert (result.outcome, result.trail, result.status) == ("out_of_time", (), None)
    assert seen(api, before) == []


async def test_all_exhausted_waits_for_capacity_with_one_retry_across_a_restart(
    agent: ServerProcess, api: MessagesApiStandIn, creds: Credentials, tmp_path: Path
) -> None:
    """Every rung refused: the trail, the earliest reset, and one retry, which a restarted
    controller neither duplicates nor runs twice."""
    a, b, key, gw = (
        creds.new("ratelimit"),
        creds.new("weekly"),
        creds.new("nocredit"),
        creds.new("badauth"),
    )
    api.reset_in(b, HOUR // 2)
    entries = [("a", "subscription", a), ("b", "subscription", b), ("key", "api_key", key)]
    pool = make_pool(*entries, ("gw", "gateway", gw), gateway_url=api.gateway_url)
    url = f"sqlite:///{tmp_path}/pool.db"
    events: list[WalkEvent] = []
    async with walking(agent, pool, url, events) as (walker, _):
        result = await walker.walk(WalkTurn("agent-dry", "hi"))
    assert result.outcome == "waiting_for_capacity", result.as_json()
    assert attempts(result) == [
        ("a", "rate_limit"),
        ("b", "rate_limit"),
        ("key", "billing"),
        ("gw", "auth"),
    ]
    assert result.trail_text() == (
        "a (rate limit) -> b (rate limit) -> platform API key (billing) -> gateway gw (auth)"
    )
    assert about(result.earliest_reset, HOUR // 2)
    assert result.earliest_reset == result.trail[1].resets_at
    assert result.retry is not None
    assert result.retry.due_at == result.earliest_reset
    assert [e.note for e in events if e.phase is WalkPhase.WAITING_FOR_CAPACITY] == [
        result.trail_text()
    ]

    # The controller restarts: a new walker on the same store walks the same turn again.
    before = len(api.message_requests)
    turn_ref = result.execution_id
    async with walking(agent, pool, url, []) as (walker, store):
        again = await walker.walk(WalkTurn("agent-dry", "hi", execution_id=turn_ref))
        retries = (await store.snapshot()).retries
    assert (again.outcome, again.trail) == ("waiting_for_capacity", ())
    assert seen(api, before) == []
    assert list(retries) == [turn_ref]  # the turn's one retry, replaced
    assert again.retry is not None
    assert retries[turn_ref].retry_id == again.retry.retry_id

    # Two controller processes arm the retry the store holds, each twice: it runs once.
    runs: list[ScheduledRetry] = []

    async def run(retry: ScheduledRetry) -> None:
        runs.append(retry)

    later = result.retry.due_at + timedelta(seconds=1)
    stores = [await open_store(url), await open_store(url)]
    schedulers = [RetryScheduler(s, run, clock=lambda: later) for s in stores]
    try:
        held = (await stores[0].snapshot()).retries[turn_ref]
        for scheduler in schedulers + schedulers:
            scheduler.arm(held)
        assert [s.armed for s in schedulers] == [{turn_ref: held.retry_id}] * 2
        for _ in range(300):
            if runs:
                break
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.2)
    finally:
        for scheduler in schedulers:
            await scheduler.close()
        for opened in stores:
            await opened.close()
    assert [r.retry_id for r in runs] == [again.retry.retry_id]


async def test_a_hundred_turns_over_two_exhausted_subscriptions_never_flip_the_assignment(
    agent: ServerProcess, api: MessagesApiStandIn, creds: Credentials, tmp_path: Path
) -> None:
    """Both subscriptions keep refusing while the controller's clock runs 99 minutes past
    their failures, their last-resort age and their resets, with an interactive turn every
    25: nothing serves, so nothing is committed and the assignment never moves."""
    a, b = creds.new("ratelimit"), creds.new("weekly")
    pool = make_pool(("a", "subscription", a), ("b", "subscription", b))
    start = utc_now()
    minutes = [0]
    events: list[WalkEvent] = []
    generation = agent.status()["generation"]
    before = len(api.message_requests)

    def clock() -> datetime:
        return start + timedelta(minutes=minutes[0])

    url = f"sqlite:///{tmp_path}/pool.db"
    async with walking(agent, pool, url, events, clock) as (walker, store):
        results = []
        for turn in range(100):
            minutes[0] = turn
            interactive = turn % 25 == 24
            results.append(await walker.walk(WalkTurn("agent-pingpong", "hi", interactive)))
        assignment = await store.assignment("agent-pingpong")
        retries = (await store.snapshot()).retries
    tried = [attempt for result in results for attempt in result.trail]
    assert {r.outcome for r in results} == {"waiting_for_capacity"}
    assert {(t.credential_id, t.error_code) for t in tried} == {
        ("a", "rate_limit"),
        ("b", "rate_limit"),
    }
    assert 6 <= len(tried) <= 30, [len(r.trail) for r in results]
    assert set(seen(api, before)) == {fingerprint(a), fingerprint(b)}
    assert assignment is not None
    assert (assignment.credential_id, assignment.generation) == ("a", 1)
    assert not [e for e in events if e.phase in (WalkPhase.COMMITTED, WalkPhase.COMMIT_LOST)]
    assert agent.status()["generation"] == generation
    assert {retry.agent for retry in retries.values()} == {"agent-pingpong"}
    assert len(retries) == 100  # each waiting turn keeps its own retry
    assert_quiet(events, creds)


async def test_a_manual_assignment_supersedes_the_wait(
    agent: ServerProcess, creds: Credentials, tmp_path: Path
) -> None:
    """An agent waiting for capacity is assigned by hand: the server and the store take the
    new subscription (a new generation), and the scheduled retry is gone."""
    a, b = creds.new("ratelimit"), creds.new("good")
    pool = make_pool(("a", "subscription", a), ("b", "subscription", b))
    events: list[WalkEvent] = []
    async with walking(agent, pool, f"sqlite:///{tmp_path}/pool.db", events) as (walker, store):
        await store.record(failure=Failure("b", "auth", utc_now() - timedelta(minutes=10)))
        waiting = await walker.walk(WalkTurn("agent-held", "hi"))
        assigned = await walker.assign("agent-held", "b")
        retries = (await store.snapshot()).retries
    assert waiting.outcome == "waiting_for_capacity"
    assert attempts(waiting) == [("a", "rate_limit")]
    assert (assigned.credential_id, assigned.generation) == ("b", 2)
    assert retries == {}
    assert agent.status()["fingerprint"] == f"sha256:{fingerprint(b)}"
    phases = [e.phase for e in events]
    assert phases[-2:] == [WalkPhase.ASSIGNED, WalkPhase.SUPERSEDED]
