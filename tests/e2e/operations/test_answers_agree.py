"""What a newcomer and a controller read first (issue 27): answers that agree with each other.

A real server with the fake CLI: a result asked for right after its answer is that
answer's record, every time; while an id runs again, `/result` is a 404 (never the
previous run's record), whose body has one code field; a turn stuck in its CLI's own
retries shows so in the running list.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from tests.e2e.conftest import TurnServers, wait_listed
from tests.support.server import ServerProcess

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def server(module_turn_servers: TurnServers) -> ServerProcess:
    """One server for the module."""
    return module_turn_servers.start()


def test_every_answer_is_read_back_at_once(server: ServerProcess) -> None:
    """200 answers, sync and named, 8 at a time: a GET of each one's result right after
    it returns that answer's record (its response, its session, its status)."""

    def turn_then_read(index: int) -> tuple[dict[str, Any], httpx.Response]:
        execution_id = f"raw-{index}"
        with server.client(timeout=60) as client:
            answer = client.post(
                "/api/task", json={"message": f"turn {index}", "execution_id": execution_id}
            )
            record = client.get(f"/api/executions/{execution_id}/result")
        assert answer.status_code == 200, answer.text
        body: dict[str, Any] = answer.json()
        return body, record

    with ThreadPoolExecutor(8) as pool:
        pairs = list(pool.map(turn_then_read, range(200)))
    for body, record in pairs:
        assert record.status_code == 200, record.text
        kept = record.json()
        assert kept["status"] == "success"
        assert kept["response"] == body["response"]
        assert kept["session_id"] == body["session_id"]
        assert kept["execution_id"] == body["metadata"]["execution_id"]


def test_a_running_id_has_no_result_not_even_its_last_runs(server: ServerProcess) -> None:
    """A walk re-issues one id on every rung: while it runs again, its result is a 404
    with one code field, and the new run's record once it ends."""
    execution_id = "rerun-1"
    with server.client(timeout=60) as client:
        first = client.post("/api/task", json={"message": "first", "execution_id": execution_id})
        assert first.status_code == 200
        assert client.get(f"/api/executions/{execution_id}/result").status_code == 200
        with ThreadPoolExecutor(1) as pool:
            second = pool.submit(
                client.post,
                "/api/task",
                json={"message": "@sleep 2\nsecond", "execution_id": execution_id},
            )
            wait_listed(server, execution_id)
            during = client.get(f"/api/executions/{execution_id}/result")
            assert second.result(timeout=60).status_code == 200
        after = client.get(f"/api/executions/{execution_id}/result")
    assert during.status_code == 404
    detail = during.json()["detail"]
    assert detail["code"] == "no_retained_result"
    assert "error_code" not in detail  # one code field (contract §6.6)
    assert "running" in detail["message"]
    assert after.status_code == 200
    assert "second" in after.json()["response"]


def test_a_failures_envelope_says_why_its_two_codes_differ(turn_servers: TurnServers) -> None:
    """The record's `error_code` is Trinity's callback vocabulary, `detail.error_code`
    the same code as the synchronous answer's."""
    # The transcript was recorded in the CLI's default permission mode: serve in it.
    server = turn_servers.start(AGENT_SERVER_PERMISSION_MODE="default")
    with server.client(timeout=60) as client:
        answer = client.post(
            "/api/task",
            json={"message": "@scenario server_error_500", "execution_id": "vocabulary-1"},
        )
        record = client.get("/api/executions/vocabulary-1/result").json()
    ours = answer.json()["detail"]["error_code"]
    assert ours == "upstream_unavailable"
    assert record["detail"]["error_code"] == ours
    assert record["error_code"] == "network"


def test_a_turn_stuck_in_its_clis_retries_shows_it(server: ServerProcess) -> None:
    """The running list names the CLI's last event (`system/api_retry`) and its age."""
    with ThreadPoolExecutor(1) as pool:
        answer = pool.submit(
            server.post,
            "/api/task",
            json={"message": "@api-retry 1\n@api-retry 2\n@sleep 3", "execution_id": "retry-1"},
        )
        deadline = time.monotonic() + 20
        row: dict[str, Any] = {}
        while time.monotonic() < deadline:
            listing = wait_listed(server, "retry-1")
            row = next(e for e in listing["executions"] if e["execution_id"] == "retry-1")
            if row["last_event"] == "system/api_retry" and row["last_event_age_s"] >= 1:
                break
            time.sleep(0.1)
        assert answer.result(timeout=60).status_code == 200
    assert row["last_event"] == "system/api_retry"
    assert row["last_event_age_s"] >= 1
    assert row["last_event_at"].endswith("+00:00")
