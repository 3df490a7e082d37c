"""SIGTERM to the server with turns running (contract §1: AGENT_SERVER_SHUTDOWN_GRACE_S).

The server stops accepting, lets running turns finish within the grace, then kills
their process groups and exits: no CLI and no grandchild outlives it.
"""

from __future__ import annotations

import signal
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from tests.conftest import SecretRegistry
from tests.e2e.conftest import ProcessProbe, TurnServers, wait_listed
from tests.support.server import ServerProcess

KILL_GRACE_S = 3  # the runner's SIGTERM -> SIGKILL grace
SLACK_S = 3


def post(server: ServerProcess, body: dict[str, Any]) -> httpx.Response:
    """POST a task with the controller token."""
    with server.client(timeout=90) as client:
        return client.post("/api/task", json=body)


def sigterm(server: ServerProcess) -> float:
    """Send SIGTERM to the server; return when it was sent."""
    assert server.process is not None
    server.process.send_signal(signal.SIGTERM)
    return time.monotonic()


def exited_within(server: ServerProcess, seconds: float) -> float:
    """Wait for the server to exit; return how long after now it took."""
    assert server.process is not None
    started = time.monotonic()
    server.process.wait(seconds)
    return time.monotonic() - started


def test_a_turn_shorter_than_the_grace_finishes_and_answers(
    turn_servers: TurnServers, secret_registry: SecretRegistry
) -> None:
    """SIGTERM mid-turn: no new connection is accepted, the turn answers 200, then exit."""
    server = turn_servers.start(
        CLAUDE_CODE_OAUTH_TOKEN=secret_registry.new("drain_short"),
        AGENT_SERVER_SHUTDOWN_GRACE_S="10",
    )
    with ThreadPoolExecutor(1) as pool:
        turn = pool.submit(post, server, {"message": "@sleep 2", "execution_id": "short-1"})
        wait_listed(server, "short-1")
        sent = sigterm(server)
        time.sleep(0.5)
        with pytest.raises(httpx.TransportError):
            httpx.get(f"{server.base_url}/health", timeout=2)
        response = turn.result()
    assert response.status_code == 200, response.text
    assert response.json()["status"] == "success"
    exited_within(server, 15)
    assert time.monotonic() - sent < 10


def test_a_turn_longer_than_the_grace_is_killed_and_the_server_exits(
    turn_servers: TurnServers, secret_registry: SecretRegistry, processes: ProcessProbe
) -> None:
    """Past the grace the turn's process group is killed; the server exits, no orphan."""
    grace = 1
    long_id = f"long-{uuid.uuid4().hex[:12]}"  # the probe finds the turn's processes by it
    server = turn_servers.start(
        CLAUDE_CODE_OAUTH_TOKEN=secret_registry.new("drain_long"),
        AGENT_SERVER_SHUTDOWN_GRACE_S=str(grace),
    )
    with ThreadPoolExecutor(1) as pool:
        turn = pool.submit(
            post,
            server,
            {
                "message": "@ignore-sigterm\n@spawn-grandchild 60\n@sleep 60",
                "execution_id": long_id,
            },
        )
        marks = processes.wait_for(long_id, comm="sleep")
        sent = sigterm(server)
        survivors = processes.survivors(marks, within=grace + KILL_GRACE_S + SLACK_S)
        killed_after = time.monotonic() - sent
        exited_within(server, 30)
        exited_after = time.monotonic() - sent
        try:
            answer: httpx.Response | None = turn.result()
        except httpx.HTTPError:
            answer = None  # a killed turn may lose its connection with the server
    assert survivors == {}, f"turn processes outlived the grace by {killed_after - grace:.1f}s"
    assert exited_after < grace + KILL_GRACE_S + 2 * SLACK_S
    if answer is not None:  # only the terminate route makes a turn "cancelled"
        assert answer.status_code == 504, answer.text
        assert answer.json()["detail"]["error_code"] == "killed"


def test_the_last_log_lines_are_written_before_the_server_exits(
    turn_servers: TurnServers, secret_registry: SecretRegistry
) -> None:
    """Records wait for the event loop's next step; a SIGTERM's exit still writes them."""
    server = turn_servers.start(CLAUDE_CODE_OAUTH_TOKEN=secret_registry.new("drain_logs"))
    with server.client() as client:
        assert client.get("/health").status_code == 200
    sigterm(server)
    exited_within(server, 30)
    messages = [record["message"] for record in server.log_messages()]
    assert "Application shutdown complete." in messages
    assert messages[-1].startswith("Finished server process"), messages[-3:]
