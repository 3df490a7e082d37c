"""Issue 33's promises, end to end: real agent-servers, the pinned Claude Code against the
Messages API stand-in, SQLite and a real Redis. Walls remembered for days, warden's
stabilization and the operator's hands, waiting turns that each run, a key-only wait of
minutes, `pool status --json`, and new agents spread over the accounts."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from agent_server.__main__ import main
from agent_server.controller import (
    ControllerError,
    RetryScheduler,
    ScheduledRetry,
    WalkEvent,
    WalkPhase,
    WalkResult,
    WalkTurn,
    utc_now,
)
from tests.support.messages_api import (
    KEY_RETRY_AFTER_S,
    MessagesApiStandIn,
    Scenario,
    fingerprint,
)
from tests.support.redis_server import RedisServer, redis_server  # noqa: F401 - a fixture
from tests.support.server import REPO, ServerProcess
from tests.support.walk_harness import (  # noqa: F401 - the *_fixture names are fixtures
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
    walking,
)

pytestmark = [pytest.mark.realcli, pytest.mark.anyio, pytest.mark.timeout(240)]
DAY = 24 * 3600


async def test_a_credential_walled_for_days_is_sent_no_turn_before_its_reset(
    agent: ServerProcess, api: MessagesApiStandIn, creds: Credentials, tmp_path: Path
) -> None:
    """a's weekly window is refused with a reset 3 days out: for the next days (past the
    skip window, the last-resort age, an interactive turn) the API never sees a again,
    while b refuses; the agent waits instead."""
    a, b = creds.new("weekly"), creds.new("good")
    api.reset_in(a, 3 * DAY)
    pool = make_pool(("a", "subscription", a), ("b", "subscription", b))
    start = utc_now()
    hours = [0.0]

    def clock() -> datetime:
        return start + timedelta(hours=hours[0])

    url = f"sqlite:///{tmp_path}/pool.db"
    async with walking(agent, pool, url, [], clock) as (walker, _):
        first = await walker.walk(WalkTurn("walled-bot", "hi"))
        api.on(b, Scenario.AUTH_401)
        before = len(api.message_requests)
        later = []
        for hours[0], interactive in ((1, False), (3, False), (30, True), (60, False)):
            later.append(await walker.walk(WalkTurn("walled-bot", "hi", interactive)))
    assert attempts(first) == [("a", "rate_limit"), ("b", None)]
    assert fingerprint(a) not in {r.fingerprint for r in api.message_requests[before:]}
    assert {r.outcome for r in later} == {"waiting_for_capacity"}
    assert all("a" not in [t.credential_id for t in r.trail] for r in later)
    reset = first.trail[0].resets_at
    assert reset is not None and about(reset, 3 * DAY)
    assert later[0].retry is not None
    assert later[0].retry.due_at <= reset


async def test_stabilization_and_the_operators_hands_on_redis(
    agent: ServerProcess,
    api: MessagesApiStandIn,
    creds: Credentials,
    redis_server: RedisServer,  # noqa: F811 - the fixture imported above
) -> None:
    """On a real Redis: a refusal switches to b (`switch_started`, `stabilizing`), the next
    turn served on b is `stabilized`; a refusal of c right after its commit is an
    `immediate_hard_limit`; `assign` puts the agent back on b though it failed, `clear`
    forgets c's failures, `stop` cancels a waiting turn."""
    a, b, c = creds.new("badauth"), creds.new("good"), creds.new("good")
    pool = make_pool(("a", "subscription", a), ("b", "subscription", b), ("c", "subscription", c))
    redis_server.flush(3)
    events: list[WalkEvent] = []
    async with walking(agent, pool, redis_server.url(3), events) as (walker, store):
        walker.stabilize_s = 60.0  # a window the real CLI's turns fit in on a busy machine
        switched = await walker.walk(WalkTurn("warden-bot", "hi"))
        steady = await walker.walk(WalkTurn("warden-bot", "hi"))
        api.on(b, Scenario.AUTH_401)
        await walker.clear("b")  # b's earlier record gone: only its new refusal counts
        moved = await walker.walk(WalkTurn("warden-bot", "hi"))
        api.on(c, Scenario.RATE_LIMIT_FIVE_HOUR)
        hard = await walker.walk(WalkTurn("warden-bot", "hi"))
        failures = (await store.snapshot()).failures
        api.on(b, Scenario.SUCCESS)
        assigned = await walker.assign("warden-bot", "b")
        by_hand = await walker.walk(WalkTurn("warden-bot", "hi"))
        await walker.clear("c")
        cleared = (await store.snapshot()).failures
        api.on(b, Scenario.AUTH_401)
        waiting = await walker.walk(WalkTurn("warden-bot", "hi", execution_id="stop-me"))
        stopped = await walker.stop("warden-bot")
        left = (await store.snapshot()).retries
    phases = [e.phase for e in events]
    assert attempts(switched) == [("a", "auth"), ("b", None)]
    assert phases.index(WalkPhase.SWITCH_STARTED) < phases.index(WalkPhase.STABILIZING)
    assert attempts(steady) == [("b", None)]
    assert WalkPhase.STABILIZED in phases
    assert attempts(moved) == [("b", "auth"), ("c", None)]
    assert attempts(hard)[:1] == [("c", "rate_limit")]
    assert set(failures["c"]) == {"rate_limit", "immediate_hard_limit"}
    assert assigned.credential_id == "b"
    assert attempts(by_hand) == [("b", None)]  # b failed minutes ago: the operator wins
    assert "c" not in cleared
    assert waiting.outcome == "waiting_for_capacity"
    assert stopped == 1  # the assignment superseded the earlier waiting turn
    assert left == {}
    assert_quiet(events, creds)


async def test_two_waiting_turns_of_one_agent_both_run(
    agent: ServerProcess, api: MessagesApiStandIn, creds: Credentials, tmp_path: Path
) -> None:
    """Both turns of an agent wait for a's reset (seconds away); each keeps its retry, and
    when a serves again both run, each once."""
    a = creds.new("ratelimit")
    api.reset_in(a, 3)
    pool = make_pool(("a", "subscription", a))
    url = f"sqlite:///{tmp_path}/pool.db"
    results: list[WalkResult] = []
    async with walking(agent, pool, url, []) as (walker, store):
        one = await walker.walk(WalkTurn("twin-bot", "one", execution_id="twin-1"))
        two = await walker.walk(WalkTurn("twin-bot", "two", execution_id="twin-2"))
        assert set((await store.snapshot()).retries) == {"twin-1", "twin-2"}
        api.on(a, Scenario.SUCCESS)

        async def run(retry: ScheduledRetry) -> WalkResult:
            turn = WalkTurn("twin-bot", "again", execution_id=retry.turn_ref, rerun=True)
            results.append(await walker.walk(turn))
            return results[-1]

        scheduler = RetryScheduler(store, run)
        try:
            await scheduler.arm_all()
            for _ in range(900):
                if len(results) == 2:
                    break
                await asyncio.sleep(0.1)
            left = (await store.snapshot()).retries
        finally:
            await scheduler.close()
    assert (one.outcome, two.outcome) == ("waiting_for_capacity", "waiting_for_capacity")
    assert sorted(r.execution_id for r in results) == ["twin-1", "twin-2"]
    assert {r.outcome for r in results} == {"served"}
    assert left == {}


async def test_a_key_only_wait_is_its_retry_after_and_status_shows_it(
    agent: ServerProcess,
    api: MessagesApiStandIn,
    creds: Credentials,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The subscription is walled for 10 days and the key answers a 429 (a per-minute
    limit, its `retry-after` seconds): the retry is due when the API said, not in days;
    `pool status --json` shows the waiting turn and its due time."""
    a, key = creds.new("ratelimit"), creds.new("good")
    api.reset_in(a, 10 * DAY)
    api.on(key, Scenario.RATE_LIMIT_API_KEY)
    pool = make_pool(("a", "subscription", a), ("key", "api_key", key))
    url = f"sqlite:///{tmp_path}/pool.db"
    async with walking(agent, pool, url, []) as (walker, _):
        result = await walker.walk(WalkTurn("key-bot", "hi", execution_id="key-wait"))
    assert attempts(result) == [("a", "rate_limit"), ("key", "rate_limit")]
    assert result.retry is not None
    assert about(result.retry.due_at, KEY_RETRY_AFTER_S)
    pool_file = tmp_path / "pool.toml"
    pool_file.write_text(
        '[[credential]]\nid = "a"\nkind = "subscription"\nsecret_env = "STATUS_A"\n'
        '[[credential]]\nid = "key"\nkind = "api_key"\nsecret_env = "STATUS_KEY"\n'
    )
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("STATUS_A", a)
        patch.setenv("STATUS_KEY", key)
        argv = ["pool", "status", "--pool", str(pool_file), "--store", url, "--json"]
        assert await asyncio.to_thread(main, argv) == 0
    status = json.loads(capsys.readouterr().out)
    assert [(w["agent"], w["turn"]) for w in status["waiting"]] == [("key-bot", "key-wait")]
    assert status["waiting"][0]["due_at"] == result.as_json()["retry_at"]
    states = {row["credential"]: row["state"] for row in status["credentials"]}
    assert states["a"] == "throttled"
    assert a not in json.dumps(status) and key not in json.dumps(status)


async def test_the_gateway_cooldown_is_in_status_and_ends_at_the_known_reset(
    agent: ServerProcess, api: MessagesApiStandIn, creds: Credentials, tmp_path: Path
) -> None:
    """The subscription is capped 20 s and the gateway serves: the agent's cooldown ends at
    that reset, not 15 minutes out."""
    a, gw = creds.new("ratelimit"), creds.new("good")
    api.reset_in(a, 20)
    pool = make_pool(("a", "subscription", a), ("gw", "gateway", gw), gateway_url=api.gateway_url)
    url = f"sqlite:///{tmp_path}/pool.db"
    async with walking(agent, pool, url, []) as (walker, store):
        result = await walker.walk(WalkTurn("gw-bot", "hi"))
        cooldown = (await store.snapshot()).gateway_until["gw-bot"]
    assert attempts(result) == [("a", "rate_limit"), ("gw", None)]
    assert about(cooldown, 20)


async def test_two_new_agents_land_on_different_subscriptions(
    agent: ServerProcess, creds: Credentials, tmp_path: Path
) -> None:
    """Both subscriptions have headroom: the second new agent is not put on the first's."""
    a, b = creds.new("good"), creds.new("good")
    pool = make_pool(("a", "subscription", a), ("b", "subscription", b))
    url = f"sqlite:///{tmp_path}/pool.db"
    async with walking(agent, pool, url, []) as (walker, store):
        await walker.walk(WalkTurn("new-1", "hi"))
        await walker.walk(WalkTurn("new-2", "hi"))
        snapshot = await store.snapshot()
    landed = {snapshot.assignments[n].credential_id for n in ("new-1", "new-2")}
    assert landed == {"a", "b"}


async def test_a_controller_killed_mid_retry_runs_the_turn_once_after_a_restart(
    agent: ServerProcess, api: MessagesApiStandIn, creds: Credentials, tmp_path: Path
) -> None:
    """A controller process claims a due retry and is killed (SIGKILL) while its walk's
    turn runs on the server. The restarted controller arms the claim for its lease's end
    and re-runs the turn by its execution id: the server already served it, so it is
    read back from the retained result, and the API sees the turn once."""
    a = creds.new("ratelimit")
    api.reset_in(a, 2)
    pool = make_pool(("a", "subscription", a))
    url = f"sqlite:///{tmp_path}/pool.db"
    async with walking(agent, pool, url, []) as (walker, _):
        waited = await walker.walk(WalkTurn("crash-bot", "hi", execution_id="crash-1"))
    assert waited.outcome == "waiting_for_capacity"
    api.hold()
    api.on(a, Scenario.SLOW)
    before = len(api.message_requests)
    environ = {**os.environ, "PYTHONPATH": str(REPO), "RETRY_CONTROLLER_A": a}
    argv = [sys.executable, "-m", "tests.support.retry_controller", url, agent.base_url]
    doomed = subprocess.Popen([*argv, "crash-bot", "4"], env=environ, stdout=subprocess.DEVNULL)
    try:
        api.wait_for_requests(before + 1, timeout=60)  # its walk's turn reached the API
    finally:
        doomed.kill()
        doomed.wait(timeout=10)
    api.release()
    async with walking(agent, pool, url, []) as (walker, store):
        for _ in range(300):  # the server finishes the turn the dead controller sent
            with contextlib.suppress(ControllerError):
                if (await walker.client_of("crash-bot").result("crash-1")).status == "success":
                    break
            await asyncio.sleep(0.1)
        claimed = (await store.snapshot()).retries["crash-1"]
        assert claimed.claimed_until is not None
        results: list[WalkResult] = []

        async def run(retry: ScheduledRetry) -> WalkResult:
            turn = WalkTurn("crash-bot", "again", execution_id=retry.turn_ref, rerun=True)
            results.append(await walker.walk(turn))
            return results[-1]

        restarted = RetryScheduler(store, run)
        try:
            assert await restarted.arm_all() == 1
            for _ in range(300):
                if results:
                    break
                await asyncio.sleep(0.1)
            await asyncio.sleep(0.5)
            left = (await store.snapshot()).retries
        finally:
            await restarted.close()
    assert [(r.outcome, r.served_by) for r in results] == [("served", "a")]
    assert results[0].answer is not None
    assert len(api.message_requests) == before + 1  # the turn reached the API once
    assert left == {}
