"""The walk's other rungs and its peers, end to end on the pinned Claude Code CLI: the
platform key and the gateway serve without touching the assignment, a legacy server is
walked once, and two controller processes racing on one Redis leave one winner."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
from datetime import timedelta
from pathlib import Path

import pytest

from agent_server.controller.clock import utc_now
from agent_server.controller.events import WalkEvent, WalkPhase
from agent_server.controller.stores.base import open_store
from agent_server.controller.turn import WalkTurn
from tests.e2e.conftest import TurnServers
from tests.support.legacy_proxy import LegacyProxy
from tests.support.messages_api import GATEWAY_PREFIX, MessagesApiStandIn, Scenario, fingerprint
from tests.support.redis_server import RedisServer, redis_server  # noqa: F401 - a fixture
from tests.support.server import AGENT_SERVER, CONTROLLER_TOKEN, ServerProcess
from tests.support.walk_harness import (  # noqa: F401 - the *_fixture names are fixtures
    Credentials,
    agent_fixture,
    anyio_backend_fixture,
    api_fixture,
    assert_quiet,
    attempts,
    cli_env_fixture,
    creds_fixture,
    make_pool,
    reloads,
    seen,
    walking,
)

pytestmark = [pytest.mark.realcli, pytest.mark.anyio, pytest.mark.timeout(240)]


async def test_the_key_and_the_gateway_serve_and_change_no_assignment(
    agent: ServerProcess, api: MessagesApiStandIn, creds: Credentials, tmp_path: Path
) -> None:
    """Both subscriptions refuse: the key serves one agent, the gateway (on its own route)
    another that opted out of the key; neither changes an assignment or the server's
    credential; the gateway goes first during its cooldown, and once a subscription
    serves again after it, the agent switches back."""
    a, b, key, gw = (
        creds.new("ratelimit"),
        creds.new("badauth"),
        creds.new("good"),
        creds.new("good"),
    )
    entries = [("a", "subscription", a), ("b", "subscription", b), ("key", "api_key", key)]
    pool = make_pool(*entries, ("gw", "gateway", gw), gateway_url=api.gateway_url, opt_out="gw-bot")
    url = f"sqlite:///{tmp_path}/pool.db"
    server_before, reloads_before = agent.status()["fingerprint"], reloads(agent)
    events: list[WalkEvent] = []
    async with walking(agent, pool, url, events) as (walker, store):
        by_key = await walker.walk(WalkTurn("key-bot", "hi"))
        before = len(api.message_requests)
        by_gateway = await walker.walk(WalkTurn("gw-bot", "hi"))
        gateway_request = api.message_requests[before]
        again = await walker.walk(WalkTurn("gw-bot", "hi"))
        snapshot = await store.snapshot()
    assert attempts(by_key) == [("a", "rate_limit"), ("b", "auth"), ("key", None)]
    assert (by_key.served_by, by_key.committed) == ("key", False)
    # a and b failed moments ago (for key-bot): gw-bot goes straight to the gateway.
    assert attempts(by_gateway) == [("gw", None)]
    assert (by_gateway.served_by, by_gateway.committed) == ("gw", False)
    assert gateway_request.path == f"{GATEWAY_PREFIX}/v1/messages"
    assert (gateway_request.credential_kind, gateway_request.fingerprint) == (
        "bearer",
        fingerprint(gw),
    )
    assert attempts(again) == [("gw", None)]
    # gw-bot, new, lands by the ranking: both refused, b has fewer agents than a.
    assert {n: x.credential_id for n, x in snapshot.assignments.items()} == {
        "key-bot": "a",
        "gw-bot": "b",
    }
    assert {x.generation for x in snapshot.assignments.values()} == {1}
    assert "gw-bot" in snapshot.gateway_until
    assert agent.status()["fingerprint"] == server_before
    assert reloads(agent) == reloads_before

    # Past the cooldown (and the skip window), a serves again: the probe switches back.
    api.on(a, Scenario.SUCCESS)
    later = utc_now() + timedelta(hours=3)
    async with walking(agent, pool, url, events, lambda: later) as (walker, store):
        back = await walker.walk(WalkTurn("gw-bot", "hi"))
        cooled = (await store.snapshot()).gateway_until
    # b (gw-bot's assignment) is out of the skip window and still refuses; a serves.
    assert attempts(back) == [("b", "auth"), ("a", None)]
    assert (back.served_by, back.committed) == ("a", True)
    assert "gw-bot" not in cooled
    assert [e.agent for e in events if e.phase is WalkPhase.SWITCHED_BACK] == ["gw-bot"]
    assert_quiet(events, creds)


async def test_a_legacy_server_is_walked_once(
    module_turn_servers: TurnServers,
    cli_env: dict[str, str],
    api: MessagesApiStandIn,
    creds: Credentials,
    tmp_path: Path,
) -> None:
    """A server that ignores overrides and never names one: its own credential failed, one
    subscription is applied with reload-token and the turn sent once more; no key rung."""
    a, c, key = creds.new("ratelimit"), creds.new("good"), creds.new("good")
    server = module_turn_servers.start(**cli_env, CLAUDE_CODE_OAUTH_TOKEN=a)
    pool = make_pool(("a", "subscription", a), ("c", "subscription", c), ("key", "api_key", key))
    events: list[WalkEvent] = []
    before = len(api.message_requests)
    with LegacyProxy(server.base_url) as proxy:
        async with walking(proxy.base_url, pool, f"sqlite:///{tmp_path}/p.db", events) as (
            walker,
            store,
        ):
            result = await walker.walk(WalkTurn("old-bot", "hi"))
            assignment = await store.assignment("old-bot")
    assert result.legacy is True
    assert attempts(result) == [("a", "rate_limit"), ("c", None)]
    assert (result.served_by, result.committed) == ("c", True)
    assert seen(api, before) == [fingerprint(a), fingerprint(c)]
    assert proxy.forwarded_overrides == 1
    assert server.status()["fingerprint"] == f"sha256:{fingerprint(c)}"
    assert assignment is not None
    assert (assignment.credential_id, assignment.generation) == ("c", 2)
    assert_quiet(events, creds)


async def test_a_legacy_servers_own_unknown_token_is_nobodys_fault(
    module_turn_servers: TurnServers,
    cli_env: dict[str, str],
    api: MessagesApiStandIn,
    creds: Credentials,
    tmp_path: Path,
) -> None:
    """The old server holds a token the pool does not know, and it is refused: nobody is
    blamed (the server's fingerprint names no credential of the pool; an `unattributed`
    event says so), and the turn is served on the subscription applied next."""
    stranger, a = creds.new("badauth"), creds.new("good")
    server = module_turn_servers.start(**cli_env, CLAUDE_CODE_OAUTH_TOKEN=stranger)
    pool = make_pool(("a", "subscription", a))
    events: list[WalkEvent] = []
    with LegacyProxy(server.base_url) as proxy:
        async with walking(proxy.base_url, pool, f"sqlite:///{tmp_path}/p.db", events) as (
            walker,
            store,
        ):
            result = await walker.walk(WalkTurn("old-bot", "hi"))
            failures = (await store.snapshot()).failures
    assert attempts(result) == [(None, "auth"), ("a", None)]
    assert result.served_by == "a"
    assert failures == {}
    assert WalkPhase.UNATTRIBUTED in [event.phase for event in events]
    assert_quiet(events, creds)


def test_two_controller_processes_racing_on_one_redis_leave_one_winner(
    agent: ServerProcess,
    creds: Credentials,
    redis_server: RedisServer,  # noqa: F811 - the fixture imported above
    tmp_path: Path,
) -> None:
    """Two `agent-server pool walk` processes run the same agent's turn at once on one
    Redis: both are served by b, exactly one commits it, the server is reloaded once."""
    a, b = creds.new("ratelimit"), creds.new("good")
    pool_file = tmp_path / "pool.toml"
    pool_file.write_text(
        '[[credential]]\nid = "a"\nkind = "subscription"\nsecret_env = "RACE_A"\n'
        '[[credential]]\nid = "b"\nkind = "subscription"\nsecret_env = "RACE_B"\n'
    )
    token_file = tmp_path / "agent-token"
    token_file.write_text(CONTROLLER_TOKEN)
    token_file.chmod(0o600)
    redis_server.flush(6)
    store_url = redis_server.url(6)
    environ = {"PATH": os.environ.get("PATH", ""), "HOME": str(tmp_path), "RACE_A": a, "RACE_B": b}
    argv = [
        str(AGENT_SERVER), "pool", "walk", "--pool", str(pool_file), "--store", store_url,
        "--agent-url", agent.base_url, "--agent-token-file", str(token_file),
        "--agent-name", "racer", "--message", "hi", "--json",
    ]  # fmt: skip
    reloads_before = reloads(agent)
    racers = [
        subprocess.Popen(argv, env=environ, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        for _ in range(2)
    ]
    outputs = [racer.communicate(timeout=180) for racer in racers]
    said = "".join(out.decode() + err.decode() for out, err in outputs)
    assert [racer.returncode for racer in racers] == [0, 0], said
    results = [json.loads(out) for out, _ in outputs]
    assert [r["served_by"] for r in results] == ["b", "b"]
    assert sorted(r["committed"] for r in results) == [False, True]
    after = reloads(agent)
    assert after.get("changed", 0) - reloads_before.get("changed", 0) == 1
    assert sum(after.values()) - sum(reloads_before.values()) == 1
    assert agent.status()["fingerprint"] == f"sha256:{fingerprint(b)}"

    async def assignment() -> tuple[str, int] | None:
        store = await open_store(store_url)
        try:
            found = await store.assignment("racer")
        finally:
            await store.close()
        return (found.credential_id, found.generation) if found else None

    assert asyncio.run(assignment()) == ("b", 2)
    assert not [value for value in creds.values if value in said]
