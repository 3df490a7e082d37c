"""`pool serve`, end to end: two instances (real subprocesses) on one real Redis in front
of a real agent-server running the pinned Claude Code against the Messages API
stand-in. A turn posted to either instance walks and commits; a retry and a
switch-back are each run once by the pair, also after one instance is SIGKILLed; the
ceiling of one turn a credential holds under 20 simultaneous turns; the agent's
heartbeat arrives; `/metrics` parses with prometheus-client."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from agent_server.controller.clock import utc_now
from agent_server.controller.pool.state import ScheduledRetry
from agent_server.controller.service.turns import TurnRequest
from agent_server.controller.stores.base import PoolStore, open_store
from tests.e2e.conftest import TurnServers
from tests.support.messages_api import MessagesApiStandIn
from tests.support.pool_service import PoolServiceProcess, write_pool_file
from tests.support.redis_server import RedisServer, redis_server  # noqa: F401 - a fixture
from tests.support.server import CONTROLLER_TOKEN, ServerProcess
from tests.support.walk_harness import (  # noqa: F401 - the *_fixture names are fixtures
    Credentials,
    anyio_backend_fixture,
    api_fixture,
    cli_env_fixture,
    creds_fixture,
)

pytestmark = [pytest.mark.realcli, pytest.mark.anyio, pytest.mark.timeout(120)]
AGENT = "agent-1"
_DB = iter(range(1, 16))


def _wait(check: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.1)
    msg = f"{what}: not within {timeout_s} s"
    raise AssertionError(msg)


def _metric(service: PoolServiceProcess, name: str, **labels: str) -> float:
    name = name if name.startswith("agent_pool_") else f"agent_pool_{name}"
    text = service.get("/metrics").text
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items())
    )


def _read_stream(service: PoolServiceProcess, said: list[str]) -> None:
    with httpx.stream("GET", f"{service.url}/v1/events", headers=service.headers, timeout=30) as r:
        for _ in r.iter_lines():
            pass
    said.append("ended")


class Pair:
    """Two instances over one pool file and one Redis database, and the agent's server."""

    def __init__(self, services: list[PoolServiceProcess], agent: ServerProcess, store: str):
        self.services, self.agent, self.store_url = services, agent, store

    def total(self, name: str) -> float:
        return sum(
            _metric(s, name) for s in self.services if s.process and s.process.poll() is None
        )


@pytest.fixture
def pair_factory(
    tmp_path: Path,
    redis_server: RedisServer,  # noqa: F811 - the fixture imported above
    turn_servers: TurnServers,
    cli_env: dict[str, str],
) -> Iterator[Callable[..., Pair]]:
    started: list[PoolServiceProcess] = []

    def make(credentials: list[tuple[str, str, str]], **limits: float) -> Pair:
        db = next(_DB)
        redis_server.flush(db)
        store_url = redis_server.url(db)
        services = [
            PoolServiceProcess(
                tmp_path / f"pool-{n}" / "pool.toml", store_url, tmp_path / f"svc-{n}"
            )
            for n in range(2)
        ]
        # The agent beats to the first instance, its controller token its heartbeat's bearer.
        agent = turn_servers.start(
            AGENT_NAME=AGENT,
            TRINITY_BACKEND_URL=services[0].url,
            TRINITY_MCP_API_KEY=CONTROLLER_TOKEN,
            **cli_env,
        )
        for n, service in enumerate(services):
            write_pool_file(
                tmp_path / f"pool-{n}", credentials,
                agents={AGENT: (agent.base_url, CONTROLLER_TOKEN)}, limits=limits or None,
            )  # fmt: skip
            started.append(service.start())
        return Pair(services, agent, store_url)

    try:
        yield make
    finally:
        for service in started:
            service.kill()


def test_a_turn_walks_on_either_instance_and_the_heartbeat_arrives(
    pair_factory: Callable[..., Pair], creds: Credentials
) -> None:
    """On the first instance a is rate limited and b serves and is committed; on the
    second the next turn goes to b; both show the whole pool; the agent's heartbeat
    reaches the first within two beats; both /metrics parse."""
    a, b = creds.new("ratelimit"), creds.new("good")
    pair = pair_factory([("a", "subscription", a), ("b", "subscription", b)])
    one, two = pair.services
    first = one.post(f"/v1/agents/{AGENT}/turns", json={"message": "hi", "execution_id": "t-1"})
    assert first.status_code == 200, first.text
    said = first.json()
    assert (said["outcome"], said["served_by"]) == ("served", "b")
    assert [step["credential"] for step in said["trail"]][-1] == "b"
    second = two.post(f"/v1/agents/{AGENT}/turns", json={"message": "again"})
    assert (second.json()["outcome"], second.json()["served_by"]) == ("served", "b")
    views = [s.get("/v1/pool").json() for s in pair.services]
    for view in views:
        assert [(x["agent"], x["credential"]) for x in view["assignments"]] == [(AGENT, "b")]
        failed = {row["credential"]: row["last_failure"] for row in view["credentials"]}
        assert failed["a"]["kind"] == "rate_limit"

    def beat() -> bool:
        agents = one.get("/v1/pool").json()["agents"]
        return any(x["agent"] == AGENT and x["heartbeat"] for x in agents)

    with httpx.stream("GET", f"{one.url}/v1/events", headers=one.headers, timeout=12) as stream:
        assert stream.headers["content-type"].startswith("text/event-stream")
        kind = next(line for line in stream.iter_lines() if line.startswith("event: "))
    assert kind == "event: heartbeat"  # a beat pushed to the stream as it arrives
    _wait(beat, 12, "the agent's heartbeat")
    for service in pair.services:  # the beat reached one; both show it (from the store)
        shown = next(x for x in service.get("/v1/pool").json()["agents"] if x["agent"] == AGENT)
        assert shown["heartbeat"]["uptime_s"] > 0
    assert _metric(one, "agent_pool_agent_heartbeat_age_seconds", agent=AGENT) < 12
    assert _metric(one, "agent_pool_walks_total", outcome="served") == 1
    assert _metric(two, "agent_pool_walks_total", outcome="served") == 1
    # SIGTERM with an event stream open: the stream is ended at once (not held for the
    # drain), the shutdown is graceful, then the signal ends the process (as uvicorn does).
    ended: list[str] = []
    reader = threading.Thread(target=_read_stream, args=(two, ended), daemon=True)
    reader.start()
    time.sleep(0.5)
    began = time.monotonic()
    assert two.stop() == -signal.SIGTERM
    assert time.monotonic() - began < 3, "the open stream held the shutdown"
    reader.join(5)
    assert ended == ["ended"]
    assert "Traceback" not in two.log_text()


async def _seed(store_url: str, turn: str, *, due_in_s: float) -> None:
    """A waiting turn of the agent (its request kept) and a passed gateway cooldown. The
    retry is due well after the next sweep: its walk, served by a subscription, would end
    the cooldown itself, leaving the switch-back nothing to do."""
    store: PoolStore = await open_store(store_url)
    now = utc_now()
    try:
        request = TurnRequest(message=f"retry {turn}", timeout_s=120)
        retry = ScheduledRetry(
            AGENT, f"r-{turn}", now + timedelta(seconds=due_in_s), None, turn, now,
            request=request.model_dump_json(by_alias=True),
        )  # fmt: skip
        await store.schedule_retry(retry)
        await store.set_gateway_until(AGENT, now - timedelta(seconds=1))
    finally:
        await store.close()


async def _settled(store_url: str) -> bool:
    store = await open_store(store_url)
    try:
        snapshot = await store.snapshot()
    finally:
        await store.close()
    return not snapshot.retries and not snapshot.gateway_until


def test_a_retry_and_a_switch_back_run_once_also_after_a_kill(
    pair_factory: Callable[..., Pair], creds: Credentials
) -> None:
    """Seeded in Redis, a due retry and a passed cooldown are each run by exactly one of
    the two instances; after the first is SIGKILLed, the second runs the next ones."""
    a = creds.new("good")
    pair = pair_factory([("a", "subscription", a)], probe_spacing_seconds=1)
    one, two = pair.services

    def settled() -> bool:
        return asyncio.run(_settled(pair.store_url))

    asyncio.run(_seed(pair.store_url, "t-7", due_in_s=4))
    _wait(settled, 60, "the retry and the switch-back")
    assert pair.total("agent_pool_retries_run_total") == 1
    assert pair.total("agent_pool_probes_run_total") == 1
    answer = httpx.get(
        f"{pair.agent.base_url}/api/executions/t-7/result",
        headers={"X-Trinity-Agent-Token": CONTROLLER_TOKEN},
        timeout=10,
    )
    assert answer.status_code == 200, answer.text
    before = [_metric(two, name) for name in ("retries_run_total", "probes_run_total")]
    one.kill()
    time.sleep(1.1)  # past the probe spacing
    asyncio.run(_seed(pair.store_url, "t-8", due_in_s=4))
    _wait(settled, 60, "the retry and the switch-back after the kill")
    after = [_metric(two, name) for name in ("retries_run_total", "probes_run_total")]
    assert [n - m for n, m in zip(after, before, strict=True)] == [1, 1]


def test_the_ceiling_holds_under_twenty_simultaneous_turns(
    pair_factory: Callable[..., Pair], creds: Credentials, api: MessagesApiStandIn
) -> None:
    """A ceiling of one turn a credential: of 20 async turns posted at once over both
    instances, two run (held at the stand-in) and 18 wait for capacity; no credential
    ever has two turns in flight."""
    a, b = creds.new("slow"), creds.new("slow")
    pair = pair_factory(
        [("a", "subscription", a), ("b", "subscription", b)], max_concurrent_turns=1
    )
    api.hold()
    try:
        for n in range(20):
            service = pair.services[n % 2]
            body = {"message": f"turn {n}", "execution_id": f"c-{n}", "async": True}
            assert service.post(f"/v1/agents/{AGENT}/turns", json=body).status_code == 202
        peak: dict[str, int] = {}

        def waiting_18() -> bool:
            view = pair.services[0].get("/v1/pool").json()
            for row in view["credentials"]:
                peak[row["credential"]] = max(peak.get(row["credential"], 0), row["in_flight"])
            return len(view["waiting"]) == 18

        _wait(waiting_18, 60, "18 turns waiting")
    finally:
        api.release()

    def done() -> bool:
        states = [
            pair.services[n % 2].get(f"/v1/turns/c-{n}").json().get("state") for n in range(20)
        ]
        return states.count("done") == 20

    _wait(done, 60, "every turn's end")
    outcomes = [
        pair.services[n % 2].get(f"/v1/turns/c-{n}").json()["result"]["outcome"] for n in range(20)
    ]
    assert sorted(outcomes).count("served") == 2
    assert outcomes.count("waiting_for_capacity") == 18
    assert peak == {"a": 1, "b": 1}  # each seen at its ceiling, never past it
    assert pair.total("agent_pool_walks_total") == 20


async def _retries(store_url: str) -> dict[str, ScheduledRetry]:
    store = await open_store(store_url)
    try:
        return dict((await store.snapshot()).retries)
    finally:
        await store.close()


def test_a_pool_walk_that_waits_leaves_its_turn_for_the_service(
    pair_factory: Callable[..., Pair], creds: Credentials, tmp_path: Path
) -> None:
    """`pool walk` on the pair's store exits 3 (every subscription rate limited); its
    retry keeps the turn's request, so the service can run it when it is due."""
    a = creds.new("ratelimit")
    pair = pair_factory([("a", "subscription", a)])
    token = tmp_path / "agent-token"
    token.write_text(CONTROLLER_TOKEN)
    argv = [
        sys.executable, "-m", "agent_server", "pool", "walk",
        "--pool", str(pair.services[0].pool_file), "--store", pair.store_url,
        "--agent-name", AGENT, "--agent-url", pair.agent.base_url,
        "--agent-token-file", str(token), "--message", "wait for me",
        "--execution-id", "cli-1", "--timeout", "120",
    ]  # fmt: skip
    env = {**pair.services[0].env}
    walked = subprocess.run(argv, env=env, capture_output=True, timeout=90, check=False)
    assert walked.returncode == 3, walked.stderr
    retry = asyncio.run(_retries(pair.store_url))["cli-1"]
    assert retry.request is not None
    assert TurnRequest.model_validate_json(retry.request).message == "wait for me"
