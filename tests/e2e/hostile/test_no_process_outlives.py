"""No process outlives its turn: terminate, timeout, disconnect, SIGTERM-proof CLIs (contract §6).

Each turn's fake CLI starts a grandchild `sleep` in its process group. The probe finds
both by the `TRINITY_EXECUTION_ID` in their environment while the turn runs, and
afterwards requires each to be gone: neither alive (an orphan) nor a zombie.
"""

from __future__ import annotations

import json
import socket
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from tests.conftest import SecretRegistry
from tests.e2e.conftest import ProcessProbe, TurnServers, new_execution_id
from tests.support.server import CONTROLLER_TOKEN, ServerProcess

GRANDCHILD = "@spawn-grandchild 60"


def unique(prefix: str) -> str:
    """An execution id no concurrent test run shares (the probe finds processes by it)."""
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def post(server: ServerProcess, path: str, body: dict[str, Any]) -> httpx.Response:
    """POST with the controller token (one client per call: safe from threads)."""
    with server.client(timeout=90) as client:
        return client.post(path, json=body)


@pytest.fixture(scope="module")
def server(module_turn_servers: TurnServers, secret_registry: SecretRegistry) -> ServerProcess:
    """One server with the fake CLI."""
    return module_turn_servers.start(CLAUDE_CODE_OAUTH_TOKEN=secret_registry.new("hygiene"))


def finished_log(server: ServerProcess, execution_id: str) -> dict[str, Any]:
    """The `turn finished` log record of one execution (waits briefly for it)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        for line in server.log_text().splitlines():
            record = json.loads(line)
            if record.get("execution_id") == execution_id and record["message"].startswith(
                "turn finished"
            ):
                result: dict[str, Any] = record
                return result
        time.sleep(0.05)
    msg = f"no 'turn finished' record for {execution_id}"
    raise AssertionError(msg)


@pytest.mark.parametrize("ignores_sigterm", [False, True], ids=["obeys", "ignores-sigterm"])
def test_terminate_kills_the_whole_group(
    server: ServerProcess, processes: ProcessProbe, ignores_sigterm: bool
) -> None:
    """The route answers terminated, the turn answers 200 cancelled, nothing survives."""
    execution_id = unique(f"term-{int(ignores_sigterm)}")
    lines = ["@ignore-sigterm"] if ignores_sigterm else []
    message = "\n".join([*lines, GRANDCHILD, "@sleep 60"])
    with ThreadPoolExecutor(1) as pool:
        turn = pool.submit(
            post, server, "/api/task", {"message": message, "execution_id": execution_id}
        )
        marks = processes.wait_for(execution_id, comm="sleep")
        started = time.monotonic()
        with server.client() as client:
            stop = client.post(f"/api/executions/{execution_id}/terminate")
        assert stop.status_code == 200, stop.text
        assert stop.json() == {"status": "terminated"}
        response = turn.result()
    elapsed = time.monotonic() - started
    assert response.status_code == 200, response.text
    assert response.json()["status"] == "cancelled"
    assert response.json()["metadata"]["execution_id"] == execution_id
    assert processes.survivors(marks) == {}
    # SIGKILL follows SIGTERM after a grace of a few seconds, never a minute.
    assert elapsed < (10 if ignores_sigterm else 3)
    with server.client() as client:
        again = client.post(f"/api/executions/{execution_id}/terminate")
        assert again.json() == {"status": "already_finished"}
        missing = client.post("/api/executions/never-ran/terminate")
    assert missing.status_code == 404
    assert missing.json()["detail"]["error_code"] == "not_found"


def test_timeout_kills_the_whole_group(server: ServerProcess, processes: ProcessProbe) -> None:
    """Our deadline fires: 504 timeout, no process left."""
    timeout_id = unique("timeout")
    with ThreadPoolExecutor(1) as pool:
        turn = pool.submit(
            post,
            server,
            "/api/task",
            {
                "message": f"{GRANDCHILD}\n@sleep 60",
                "execution_id": timeout_id,
                "timeout_seconds": 2,
            },
        )
        marks = processes.wait_for(timeout_id, comm="sleep")
        response = turn.result()
    assert response.status_code == 504, response.text
    detail = response.json()["detail"]
    assert detail["error_code"] == "timeout"
    assert detail["retryable"] is False
    assert detail["switch_credential"] is False
    assert processes.survivors(marks) == {}


def test_a_client_that_disconnects_cancels_its_turn(
    server: ServerProcess, processes: ProcessProbe
) -> None:
    """Closing the connection mid-turn of a turn sent without an id (nobody could ask for
    its result) kills the group and finishes the turn."""
    before = {e["execution_id"] for e in server.get("/api/executions/running").json()["executions"]}
    body = json.dumps({"message": f"{GRANDCHILD}\n@sleep 60"}).encode()
    request = (
        b"POST /api/task HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        + f"X-Trinity-Agent-Token: {CONTROLLER_TOKEN}\r\n".encode()
        + f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as conn:
        conn.sendall(request)
        gone_id = new_execution_id(server, before)
        marks = processes.wait_for(gone_id, comm="sleep")
    assert processes.survivors(marks, within=10) == {}
    assert finished_log(server, gone_id)["message"].startswith("turn finished: outcome=cancelled")
    with server.client() as client:
        listing = client.get("/api/executions/running").json()
    assert gone_id not in {e["execution_id"] for e in listing["executions"]}
    assert gone_id in listing["recently_completed_ids"]


def test_a_cli_killed_by_a_signal_leaves_no_grandchild(
    server: ServerProcess, processes: ProcessProbe
) -> None:
    """The CLI dies of SIGKILL: 504 killed, its grandchild is killed and reaped too."""
    killed_id = unique("killed")
    with ThreadPoolExecutor(1) as pool:
        turn = pool.submit(
            post,
            server,
            "/api/task",
            {"message": f"{GRANDCHILD}\n@sleep 0.5\n@kill-self", "execution_id": killed_id},
        )
        marks = processes.wait_for(killed_id, comm="sleep")
        response = turn.result()
    assert response.status_code == 504, response.text
    assert response.json()["detail"]["error_code"] == "killed"
    assert processes.survivors(marks) == {}


def test_a_grandchild_holding_stdout_does_not_hang_a_finished_turn(
    server: ServerProcess, processes: ProcessProbe
) -> None:
    """The CLI answers and exits; the grandchild that inherited its pipes is killed."""
    held_id = unique("held")
    started = time.monotonic()
    with ThreadPoolExecutor(1) as pool:
        turn = pool.submit(
            post,
            server,
            "/api/task",
            {"message": "@spawn-grandchild 60 inherit\n@sleep 0.5", "execution_id": held_id},
        )
        marks = processes.wait_for(held_id, comm="sleep")
        response = turn.result()
    assert response.status_code == 200, response.text
    assert response.json()["status"] == "success"
    assert time.monotonic() - started < 10
    assert processes.survivors(marks) == {}
