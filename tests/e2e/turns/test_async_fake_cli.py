"""Turns that outlive their connection (contract §6.6, §6.8), through a real server, the
fake CLI and a real loopback callback receiver: 202 and a durable callback, the
override on the async path, retained results across restarts, and the startup sweep
after a SIGKILL between persisting a result and delivering it."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from tests.conftest import SecretRegistry
from tests.e2e.conftest import TurnServers
from tests.support.callback_receiver import CallbackReceiver
from tests.support.fake_cli import fingerprint
from tests.support.server import ServerProcess

pytestmark = pytest.mark.timeout(120)

AGENT = "agent-under-test"


@pytest.fixture
def key(secret_registry: SecretRegistry) -> str:
    return secret_registry.new("callback_key")


@pytest.fixture
def receiver(key: str) -> Iterator[CallbackReceiver]:
    with CallbackReceiver(key) as running:
        yield running


@pytest.fixture
def server(turn_servers: TurnServers, receiver: CallbackReceiver) -> ServerProcess:
    return turn_servers.start(**receiver.environ(), AGENT_NAME=AGENT)


def _async(message: str, execution_id: str, **extra: Any) -> dict[str, Any]:
    return {"message": message, "execution_id": execution_id, "async_result": True, **extra}


def _report(envelope: dict[str, Any]) -> dict[str, Any]:
    report: dict[str, Any] = json.loads(envelope["response"])
    return report


def _wait(condition: Callable[[], bool], why: str, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, why
        time.sleep(0.02)


def _result(server: ServerProcess, execution_id: str) -> httpx.Response:
    return server.get(f"/api/executions/{execution_id}/result")


def test_an_async_turn_answers_202_and_its_result_comes_by_callback(
    server: ServerProcess, receiver: CallbackReceiver, secret_registry: SecretRegistry, key: str
) -> None:
    """202 at once with the override named; listed while it runs; one callback with the
    envelope, served by the override; the same record retained."""
    token = secret_registry.new("async_override")
    body = _async("@sleep 1\nhello", "async-1", auth_override={"oauth_token": token})
    started = time.monotonic()
    accepted = server.post("/api/task", json=body)
    assert time.monotonic() - started < 1.0
    assert accepted.status_code == 202, accepted.text
    assert accepted.json() == {"execution_id": "async-1", "status": "accepted"}
    assert accepted.headers["X-Trinity-Auth-Override"] == "oauth_token"
    listed = server.get("/api/executions/running").json()
    assert [e["execution_id"] for e in listed["executions"]] == ["async-1"]
    (delivery,) = receiver.wait_for(1)
    assert (delivery.agent, delivery.execution_id) == (AGENT, "async-1")
    assert delivery.bearer_fp == fingerprint(key)
    envelope = delivery.body
    assert (envelope["status"], envelope["terminal_reason"]) == ("success", "completed")
    assert envelope["auth_route"] == "oauth_token"
    assert _report(envelope)["fp"] == fingerprint(token)
    assert envelope["metadata"]["execution_id"] == "async-1"
    _wait(lambda: _result(server, "async-1").status_code == 200, "never retained")
    retained = _result(server, "async-1").json()
    assert {k: v for k, v in retained.items() if k != "retained_at"} == envelope
    pending = server.state_dir / "pending-results"
    _wait(lambda: not list(pending.iterdir()), "the pending file outlived its delivery")


def test_an_async_turn_can_be_terminated_and_says_cancelled(
    server: ServerProcess, receiver: CallbackReceiver
) -> None:
    """Terminate reaches a detached turn; its callback is `cancelled`."""
    assert server.post("/api/task", json=_async("@sleep 30", "async-stop")).status_code == 202
    deadline = time.monotonic() + 20
    while not server.get("/api/executions/running").json()["executions"]:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert server.post("/api/executions/async-stop/terminate").json() == {"status": "terminated"}
    (delivery,) = receiver.wait_for(1)
    assert (delivery.body["status"], delivery.body["terminal_reason"]) == (
        "cancelled",
        "cancelled",
    )


def test_a_failed_async_turn_carries_trinitys_code_and_ours(
    turn_servers: TurnServers, receiver: CallbackReceiver
) -> None:
    """A rate limit: `failed`, Trinity's `billing` with reason `rate_limit`; our detail says
    rate_limit, switch_credential and the window."""
    server = turn_servers.start(
        **receiver.environ(),
        # The replayed transcript was recorded in the CLI's default permission mode.
        AGENT_SERVER_PERMISSION_MODE="default",
    )
    message = "@scenario rate_limit_five_hour_oauth"
    assert server.post("/api/task", json=_async(message, "async-429")).status_code == 202
    (delivery,) = receiver.wait_for(1)
    envelope = delivery.body
    assert (envelope["status"], envelope["error_code"]) == ("failed", "billing")
    assert (envelope["terminal_reason"], envelope["http_status"]) == ("rate_limit", 429)
    assert envelope["detail"]["error_code"] == "rate_limit"
    assert envelope["detail"]["switch_credential"] is True
    assert envelope["detail"]["rate_limit_type"] == "five_hour"
    assert envelope["error"] == envelope["detail"]["message"]


def test_refusals_are_answered_at_once_not_by_callback(
    turn_servers: TurnServers, receiver: CallbackReceiver
) -> None:
    """busy and execution_in_progress come back as 409 to the request; no callback."""
    server = turn_servers.start(**receiver.environ(), AGENT_SERVER_MAX_PARALLEL="1")
    assert server.post("/api/task", json=_async("@sleep 30", "holder")).status_code == 202
    same = server.post("/api/task", json=_async("x", "holder"))
    other = server.post("/api/task", json=_async("x", "other"))
    assert (same.status_code, same.json()["detail"]["error_code"]) == (
        409,
        "execution_in_progress",
    )
    assert (other.status_code, other.json()["detail"]["error_code"]) == (409, "busy")
    server.post("/api/executions/holder/terminate")
    receiver.wait_for(1)
    time.sleep(0.5)
    assert [d.execution_id for d in receiver.deliveries] == ["holder"]


@pytest.mark.parametrize(
    ("configured", "body", "why"),
    [
        pytest.param(True, {"message": "x", "async_result": True}, "no execution_id", id="no id"),
        pytest.param(
            False,
            {"message": "x", "async_result": True, "execution_id": "sync-1"},
            "no callback configured",
            id="no callback",
        ),
    ],
)
def test_without_an_id_or_a_callback_the_turn_is_answered_in_line(
    turn_servers: TurnServers,
    receiver: CallbackReceiver,
    configured: bool,
    body: dict[str, Any],
    why: str,
) -> None:
    """200 with the answer, as if the flag were absent, and the log says why."""
    server = turn_servers.start(**(receiver.environ() if configured else {}))
    response = server.post("/api/task", json=body)
    assert response.status_code == 200, response.text
    assert f"answered synchronously: {why}" in server.log_text()
    assert receiver.deliveries == []


def test_a_sigkill_between_persisting_and_delivering_loses_nothing(
    server: ServerProcess, receiver: CallbackReceiver
) -> None:
    """The controller is down (503); the server dies with the result pending; once both
    are back, the startup sweep delivers it exactly once, and a retained copy waits."""
    receiver.fail_next(*[503] * 1000, headers={"Retry-After": "2"})
    assert server.post("/api/task", json=_async("hello", "survivor")).status_code == 202
    pending = server.state_dir / "pending-results" / "survivor.json"
    deadline = time.monotonic() + 20
    while not (pending.exists() and receiver.deliveries):
        assert time.monotonic() < deadline, "never persisted and tried"
        time.sleep(0.05)
    server.kill()
    receiver.recover()  # the controller is back
    server.start()
    (delivered,) = receiver.wait_for(1, timeout=30)
    assert (delivered.execution_id, delivered.body["status"]) == ("survivor", "success")
    _wait(lambda: not pending.exists(), "the pending file outlived its delivery")
    assert _result(server, "survivor").json()["status"] == "success"
    server.stop()
    server.start()  # and a second restart sends nothing again
    time.sleep(6)
    assert len(receiver.accepted()) == 1
    assert [d.status for d in receiver.deliveries if d.status == 200] == [200]


def test_a_retained_result_survives_a_restart_and_unknown_ids_are_404(
    server: ServerProcess,
) -> None:
    """A synchronous turn's answer is kept; a SIGKILL later it still is. An unknown id
    answers Trinity's coded 404; a path-like one matches no route at all."""
    answer = server.post("/api/task", json={"message": "keep me", "execution_id": "kept-1"})
    assert answer.status_code == 200
    _wait(lambda: _result(server, "kept-1").status_code == 200, "never retained")
    # Served from memory at once (read-your-writes): the kill must come after the write.
    _wait(lambda: (server.state_dir / "results" / "kept-1.json").exists(), "never written")
    server.kill()
    server.start()
    record = _result(server, "kept-1").json()
    assert record["response"] == answer.json()["response"]
    assert record["metadata"] == answer.json()["metadata"]
    for unknown in ("never-ran", "a.b", "x" * 129):
        missing = _result(server, unknown)
        assert missing.status_code == 404, unknown
        assert missing.json()["detail"]["code"] == "no_retained_result"
    escaping = _result(server, "..%2F..%2Foauth-token")
    assert escaping.status_code == 404
    assert escaping.json()["detail"]["error_code"] == "not_found"


def test_a_named_turn_whose_connection_drops_runs_on_and_is_retained(
    server: ServerProcess,
) -> None:
    """The controller's connection dies mid-turn: the turn finishes anyway, and a
    restarted controller finds its answer by id."""
    payload = json.dumps({"message": "@sleep 1\nstill here", "execution_id": "orphan"})
    request = (
        "POST /api/task HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"X-Trinity-Agent-Token: {server.token}\r\nContent-Length: {len(payload)}\r\n\r\n"
        f"{payload}"
    )
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as conn:
        conn.sendall(request.encode())
        _wait(
            lambda: bool(server.get("/api/executions/running").json()["executions"]),
            "never ran",
        )
    _wait(lambda: _result(server, "orphan").status_code == 200, "not retained", timeout=20)
    record = _result(server, "orphan").json()
    assert (record["status"], record["http_status"]) == ("success", 200)
    assert json.loads(record["response"])["prompt"] == "@sleep 1\nstill here"
