"""The heartbeat of a live server (contract §8) arriving at a real loopback receiver.

A real `agent-server serve` with the fake CLI, `TRINITY_BACKEND_URL` at a receiver on
127.0.0.1 and the interval shortened by `AGENT_SERVER_HEARTBEAT_INTERVAL_S`: while a
turn runs a tool, every beat names it; the beats keep their interval; `/metrics`
counts them.
"""

from __future__ import annotations

import itertools
import json
import statistics
import threading
import time
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from tests.conftest import SecretRegistry
from tests.e2e.conftest import TurnServers
from tests.support.thread_server import ThreadServer

pytestmark = pytest.mark.timeout(60)
INTERVAL_S = 0.5
AGENT = "beating-agent"


class HeartbeatReceiver(ThreadServer):
    """Trinity's heartbeat endpoint: records each beat with its arrival instant."""

    def __init__(self) -> None:
        self.beats: list[tuple[float, str | None, str, dict[str, Any]]] = []
        self.lock = threading.Lock()

        async def beat(request: Request) -> JSONResponse:
            body = json.loads(await request.body())
            bearer, name = request.headers.get("authorization"), request.path_params["name"]
            seen = (time.monotonic(), bearer, name, body)
            with self.lock:
                self.beats.append(seen)
            return JSONResponse({"ok": True})

        routes = [Route("/api/agents/{name}/heartbeat", beat, methods=["POST"])]
        super().__init__(Starlette(routes=routes), "heartbeat-receiver")

    def wait_for(self, found: Any, timeout: float) -> dict[str, Any]:
        """The first beat's body for which `found(body)` holds, within `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                for _, _, _, body in self.beats:
                    if found(body):
                        return body
            time.sleep(0.05)
        pytest.fail(f"no such heartbeat in {timeout} s; got {len(self.beats)}")


def _tools(body: dict[str, Any]) -> list[tuple[str | None, str | None]]:
    return [(e["tool"], e["summary"]) for e in body["executions"]]


def test_beats_arrive_on_time_naming_the_running_turns_tool(
    turn_servers: TurnServers, secret_registry: SecretRegistry
) -> None:
    """A turn calls Bash and sleeps: the beats name Bash and its command while it runs,
    none once it ended; they come every 0.5 s with the bearer; /metrics counts them."""
    key = secret_registry.new("heartbeat_key")
    with HeartbeatReceiver() as receiver:
        server = turn_servers.start(
            AGENT_NAME=AGENT,
            TRINITY_BACKEND_URL=receiver.base_url,
            TRINITY_MCP_API_KEY=key,
            AGENT_SERVER_HEARTBEAT_INTERVAL_S=str(INTERVAL_S),
        )
        answers: list[int] = []
        message = "@tool Bash make test-heartbeat\n@sleep 3"

        def run_turn() -> None:
            with server.client(timeout=30) as client:
                answers.append(client.post("/api/task", json={"message": message}).status_code)

        turn = threading.Thread(target=run_turn, name="heartbeat-turn")
        turn.start()
        running = receiver.wait_for(lambda b: ("Bash", "make test-heartbeat") in _tools(b), 15)
        turn.join(30)
        assert answers == [200]
        assert running["active_executions"] == 1
        (execution,) = running["executions"]
        assert execution["execution_id"] and execution["since"]
        receiver.wait_for(lambda b: b["active_executions"] == 0 and b["uptime_s"] > 3, 10)
        metrics = server.request("GET", "/metrics", token="").text
    instants = [at for at, _, _, _ in receiver.beats]
    gaps = [later - earlier for earlier, later in itertools.pairwise(instants)]
    assert len(gaps) >= 5
    assert 0.8 * INTERVAL_S <= statistics.median(gaps) <= 2 * INTERVAL_S
    assert {(bearer, name) for _, bearer, name, _ in receiver.beats} == {(f"Bearer {key}", AGENT)}
    sent = {
        sample.labels["result"]: sample.value
        for family in text_string_to_metric_families(metrics)
        for sample in family.samples
        if sample.name == "agent_server_heartbeats_total"
    }
    assert sent.get("sent", 0) >= len(gaps)
