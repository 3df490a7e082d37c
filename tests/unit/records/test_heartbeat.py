"""The heartbeat sender against a real loopback receiver."""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Any

import pytest
from pydantic import SecretStr
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from agent_server.metrics import Metrics
from agent_server.records.heartbeat import (
    SUMMARY_CHARS,
    Heartbeat,
    RunningTurn,
    heartbeat_url,
)
from tests.support.thread_server import ThreadServer

pytestmark = pytest.mark.timeout(20)


class Receiver(ThreadServer):
    def __init__(self) -> None:
        self.bodies: list[tuple[str | None, dict[str, Any]]] = []
        self.got = threading.Event()

        async def beat(request: Request) -> JSONResponse:
            self.bodies.append(
                (request.headers.get("authorization"), json.loads(await request.body()))
            )
            self.got.set()
            return JSONResponse({"ok": True})

        super().__init__(
            Starlette(routes=[Route("/api/agents/{name}/heartbeat", beat, methods=["POST"])]),
            "heartbeat-receiver",
        )


def test_heartbeat_reports_running_turns_bounded_and_redacted() -> None:
    turn = RunningTurn("e1", "Bash\x1b[2J", "echo sk-SECRET " + "x" * 300, "2026-01-01T00:00:00Z")

    async def run(url: str) -> None:
        beat = Heartbeat(
            url, SecretStr("k"), lambda: [turn], lambda s: s.replace("sk-SECRET", "***"), 0.05
        )
        beat.start()
        await asyncio.to_thread(receiver.got.wait, 5)
        await beat.stop()

    with Receiver() as receiver:
        asyncio.run(run(heartbeat_url(receiver.base_url, "agent")))
    bearer, body = receiver.bodies[0]
    assert bearer == "Bearer k"
    assert body["active_executions"] == 1
    (execution,) = body["executions"]
    assert execution["execution_id"] == "e1"
    assert execution["tool"] == "Bash [2J"
    assert "sk-SECRET" not in execution["summary"]
    assert execution["summary"].startswith("echo *** ")
    assert len(execution["summary"]) == SUMMARY_CHARS


def test_a_receiver_that_is_down_is_silent_and_stops_quickly() -> None:
    """Every beat fails, counted as `failed` (none as `sent`); stopping takes under 2 s."""
    metrics = Metrics()

    async def run() -> Heartbeat:
        beat = Heartbeat(
            "http://127.0.0.1:9/api/agents/a/heartbeat", SecretStr("k"), list, str, 0.01, metrics
        )
        beat.start()
        await asyncio.sleep(0.3)
        await asyncio.wait_for(beat.stop(), 2)
        return beat

    failures = asyncio.run(run()).failures
    assert failures >= 1
    counted = metrics.registry.get_sample_value
    assert counted("agent_server_heartbeats_total", {"result": "failed"}) == failures
    assert counted("agent_server_heartbeats_total", {"result": "sent"}) is None
