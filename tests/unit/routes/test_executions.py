"""The turn routes (contract §5, §6): task and chat bodies to argv, chat's one session, the
running list, terminate, and a client that leaves.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import time
import uuid
from typing import Any

import httpx
import pytest

from agent_server.app import create_app
from agent_server.services import Services
from tests.support.in_process import (
    TOKEN,
    app_client,
    cli_report,
    fake_cli_services,
    request,
    wait_until,
)

pytestmark = pytest.mark.timeout(60)

BASELINE_OAUTH = "unit-baseline-oauth-0123456789"
OVERRIDE_KEY = "unit-override-key-0123456789"
LEADING_FLAGS = [
    "--print",
    "--output-format",
    "stream-json",
    "--verbose",
    "--permission-mode",
    "bypassPermissions",
]


@pytest.fixture
def services(environ: dict[str, str]) -> Services:
    """A Claude agent over the fake CLI, with a baseline OAuth token."""
    return fake_cli_services(environ, CLAUDE_CODE_OAUTH_TOKEN=BASELINE_OAUTH)


def _post(services: Services, path: str, body: dict[str, Any]) -> httpx.Response:
    return request(services, "POST", path, json=body)


def _contains(argv: list[str], fragment: list[str]) -> bool:
    return any(argv[i : i + len(fragment)] == fragment for i in range(len(argv)))


# --- /api/task ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "fragment"),
    [
        pytest.param({"model": "claude-unit-9"}, ["--model", "claude-unit-9"], id="model"),
        pytest.param({"max_turns": 3}, ["--max-turns", "3"], id="max_turns"),
        pytest.param(
            {"system_prompt": "-looks like a flag"},
            ["--append-system-prompt=-looks like a flag"],
            id="system_prompt is one argv element, whatever it starts with",
        ),
        pytest.param(
            {"allowed_tools": ["Read", "Bash(git:*)"]},
            ["--allowedTools", "Read,Bash(git:*)"],
            id="allowed_tools are joined by commas",
        ),
        pytest.param(
            {"resume_session_id": "sess-unit-1"},
            ["--resume", "sess-unit-1"],
            id="resume_session_id resumes that session",
        ),
        pytest.param(
            {"persist_session": False},
            ["--no-session-persistence"],
            id="persist_session false keeps no session on disk",
        ),
    ],
)
def test_a_task_field_becomes_its_cli_flag(
    services: Services, fields: dict[str, Any], fragment: list[str]
) -> None:
    """Each optional field reaches the fake CLI's argv; the message only its stdin."""
    message = "unit prompt text"
    report = cli_report(_post(services, "/api/task", {"message": message, **fields}))
    argv = report["argv"]
    assert argv[: len(LEADING_FLAGS)] == LEADING_FLAGS
    assert _contains(argv, fragment), argv
    assert report["prompt"] == message
    assert message not in argv


def test_a_bare_task_starts_a_fresh_session_with_nothing_optional(services: Services) -> None:
    """Only the message: a new --session-id (a uuid4), no optional flag, persisted."""
    report = cli_report(_post(services, "/api/task", {"message": "bare"}))
    argv = report["argv"]
    assert argv[: len(LEADING_FLAGS)] == LEADING_FLAGS
    assert argv[len(LEADING_FLAGS)] == "--session-id"
    assert uuid.UUID(argv[len(LEADING_FLAGS) + 1]).version == 4
    assert len(argv) == len(LEADING_FLAGS) + 2
    assert report["session"]["persist"] is True


def test_a_task_keeps_its_execution_id_and_ignores_what_it_does_not_know(
    services: Services, caplog: pytest.LogCaptureFixture
) -> None:
    """execution_id in the metadata and the registry; extra fields ignored; an async_result
    with no callback configured is answered in-line, and the log says why."""
    body = {
        "message": "x",
        "execution_id": "unit-exec-1",
        "async_result": True,
        "controller_only_field": {"any": "thing"},
    }
    with caplog.at_level(logging.INFO, logger="agent_server.executions"):
        response = _post(services, "/api/task", body)
    assert response.status_code == 200
    assert response.json()["metadata"]["execution_id"] == "unit-exec-1"
    assert services.registry.recently_completed() == ["unit-exec-1"]
    assert "async_result asked, answered synchronously: no callback configured" in caplog.messages


def test_a_task_timeout_is_the_turns_deadline(services: Services) -> None:
    """timeout_seconds 1 stops a CLI that sleeps 20 s: 504 timeout after about a second."""
    started = time.monotonic()
    response = _post(services, "/api/task", {"message": "@sleep 20", "timeout_seconds": 1})
    assert 1 <= time.monotonic() - started < 10
    assert response.status_code == 504
    assert response.json()["detail"]["error_code"] == "timeout"


@pytest.mark.parametrize("path", ["/api/task", "/api/chat"])
def test_an_auth_override_serves_the_turn_and_names_itself(services: Services, path: str) -> None:
    """The override's key reaches the spawn (not the baseline); the answer carries the header."""
    body = {"message": "x", "auth_override": {"api_key": OVERRIDE_KEY}}
    response = _post(services, path, body)
    report = cli_report(response)
    assert report["served_by"] == "ANTHROPIC_API_KEY"
    assert "CLAUDE_CODE_OAUTH_TOKEN" not in report["env_names"]
    assert response.headers["x-trinity-auth-override"] == "api_key"
    assert response.json()["metadata"]["auth_route"] == "api_key"
    assert OVERRIDE_KEY not in response.text


# --- /api/chat ----------------------------------------------------------------------------


def test_chat_takes_model_and_system_prompt_and_nothing_task_only(services: Services) -> None:
    """Chat's fields reach argv; a task-only field sent to chat is ignored, not honoured."""
    body = {
        "message": "x",
        "model": "claude-unit-9",
        "system_prompt": "terse",
        "allowed_tools": ["Read"],
        "max_turns": 2,
    }
    argv = cli_report(_post(services, "/api/chat", body))["argv"]
    assert _contains(argv, ["--model", "claude-unit-9"])
    assert "--append-system-prompt=terse" in argv
    assert "--allowedTools" not in argv
    assert "--max-turns" not in argv


def _chat(client: httpx.AsyncClient, message: str) -> Any:
    return client.post("/api/chat", json={"message": message})


def test_chat_resumes_only_the_session_of_a_turn_that_served(services: Services) -> None:
    """A failed first turn keeps nothing; a served one is kept; a later failure keeps it."""
    chat = services.chat

    async def scenario() -> list[httpx.Response]:
        async with app_client(services) as client:
            failed_first = await _chat(client, "@exit 3")
            assert chat.current() is None
            served = await _chat(client, "hello")
            failed_later = await _chat(client, "@exit 3")
            resumed = await _chat(client, "again")
            return [failed_first, served, failed_later, resumed]

    failed_first, served, failed_later, resumed = asyncio.run(scenario())
    assert failed_first.status_code == 500
    assert failed_first.json()["detail"]["metadata"]["session_id"]  # the CLI did report one
    first_session = cli_report(served)["session"]
    assert first_session["resume"] is None
    kept = served.json()["session_id"]
    assert kept == first_session["session_id"]
    assert failed_later.status_code == 500
    assert failed_later.json()["detail"]["metadata"]["session_id"] == kept
    assert cli_report(resumed)["session"]["resume"] == kept
    assert chat.current() == kept
    assert chat.path.read_text() == kept


def test_chat_starts_over_once_when_the_cli_forgot_the_session(services: Services) -> None:
    """A kept id the CLI no longer knows: a fresh session, session_reset, and the new id kept."""
    services.chat.remember("stale-session-0001")
    response = _post(services, "/api/chat", {"message": "@unknown-session"})
    report = cli_report(response)
    assert report["session"]["resume"] is None
    assert response.json()["metadata"]["session_reset"] is True
    assert services.chat.current() == report["session"]["session_id"] != "stale-session-0001"


def test_two_chats_sent_together_never_overlap(services: Services) -> None:
    """The second waits for the first, then resumes the session the first one kept."""
    overlap: list[int] = []

    async def scenario() -> tuple[httpx.Response, httpx.Response]:
        async with app_client(services) as client:
            watching = True

            async def watch() -> None:
                while watching:
                    states = [e.state for e in services.registry.running()]
                    overlap.append(states.count("running"))
                    await asyncio.sleep(0.01)

            watcher = asyncio.create_task(watch())
            one, two = await asyncio.gather(
                _chat(client, "@sleep 0.4\none"), _chat(client, "@sleep 0.4\ntwo")
            )
            watching = False
            await watcher
            return one, two

    one, two = asyncio.run(scenario())
    reports = sorted((cli_report(one), cli_report(two)), key=lambda r: r["session"]["resume"] or "")
    first, second = reports
    assert first["session"]["resume"] is None
    assert second["session"]["resume"] == first["session"]["session_id"]
    assert max(overlap) == 1
    assert overlap.count(1) >= 5  # the watch did see the turns run


# --- running and terminate ----------------------------------------------------------------


def test_running_lists_a_turn_until_terminate_stops_it(services: Services) -> None:
    """running shows id, route and generation; terminate: terminated, then already_finished."""
    generation = services.store.current.generation

    async def scenario() -> dict[str, Any]:
        async with app_client(services) as client:
            body = {
                "message": "@sleep 30",
                "execution_id": "listed",
                "auth_override": {"oauth_token": "unit-override-oauth-0123456789"},
            }
            turn = asyncio.create_task(client.post("/api/task", json=body))
            await wait_until(lambda: len(services.registry) == 1)
            during = await client.get("/api/executions/running")
            stop = await client.post("/api/executions/listed/terminate")
            answer = await asyncio.wait_for(turn, 10)
            after = await client.get("/api/executions/running")
            again = await client.post("/api/executions/listed/terminate")
            never = await client.post("/api/executions/never-ran/terminate")
            return {
                "during": during,
                "stop": stop,
                "answer": answer,
                "after": after,
                "again": again,
                "never": never,
            }

    seen = asyncio.run(scenario())
    (listed,) = seen["during"].json()["executions"]
    assert seen["during"].json()["recently_completed_ids"] == []
    assert (listed["execution_id"], listed["auth_route"], listed["generation"]) == (
        "listed",
        "oauth_token",
        generation,
    )
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d+\+00:00", listed["started_at"])
    assert seen["stop"].json() == {"status": "terminated"}
    assert seen["answer"].status_code == 200
    assert seen["answer"].json()["status"] == "cancelled"
    assert seen["answer"].headers["x-trinity-auth-override"] == "oauth_token"
    assert listed["state"] == "running"
    assert seen["during"].json()["pending_ids"] == []
    assert seen["after"].json() == {
        "executions": [],
        "recently_completed_ids": ["listed"],
        "pending_ids": [],
    }
    assert seen["again"].json() == {"status": "already_finished"}
    assert seen["never"].status_code == 404
    assert seen["never"].json() == {
        "detail": {
            "message": "no execution never-ran",
            "error_code": "not_found",
            "retryable": False,
            "switch_credential": False,
        }
    }


def test_terminate_never_quotes_a_secret_id(services: Services) -> None:
    """An id that is a credential is masked in the 404 message."""

    async def scenario() -> httpx.Response:
        async with app_client(services) as client:
            return await client.post(f"/api/executions/{BASELINE_OAUTH}/terminate")

    response = asyncio.run(scenario())
    assert response.status_code == 404
    assert response.json()["detail"]["message"] == "no execution [REDACTED]"
    assert BASELINE_OAUTH not in response.text


# --- a client that goes away --------------------------------------------------------------


def _leave_mid_turn(
    services: Services, caplog: pytest.LogCaptureFixture, body: dict[str, Any]
) -> tuple[float, list[int], list[dict[str, Any]]]:
    """POST `body` straight to the ASGI app, disconnect once the CLI runs, and wait for
    the route to end: (seconds it took after the disconnect, spawned pids, sent messages)."""
    app = create_app(services.settings, services)
    pending = [{"type": "http.request", "body": json.dumps(body).encode(), "more_body": False}]
    gone = asyncio.Event()
    sent: list[dict[str, Any]] = []
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/api/task",
        "raw_path": b"/api/task",
        "root_path": "",
        "query_string": b"",
        "headers": [
            (b"x-trinity-agent-token", TOKEN.encode()),
            (b"content-type", b"application/json"),
        ],
        "client": ("127.0.0.1", 50000),
        "server": ("agent.test", 80),
    }

    async def receive() -> dict[str, Any]:
        if pending:
            return pending.pop(0)
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message: Any) -> None:
        sent.append(message)

    def spawned() -> list[int]:
        return [
            int(m.group(1))
            for m in (re.search(r"as process group (\d+)", r.getMessage()) for r in caplog.records)
            if m
        ]

    async def scenario() -> float:
        call = asyncio.create_task(app(scope, receive, send))
        await wait_until(lambda: bool(spawned()))
        await asyncio.sleep(0.2)  # the CLI is asleep
        started = time.monotonic()
        gone.set()
        await asyncio.wait_for(call, 15)
        await services.results.close(5)  # the retention in flight
        return time.monotonic() - started

    with caplog.at_level(logging.DEBUG, logger="agent_server.turn"):
        took = asyncio.run(scenario())
    return took, spawned(), sent


def test_a_client_that_disconnects_stops_a_turn_it_named_no_id_for(
    services: Services, caplog: pytest.LogCaptureFixture
) -> None:
    """http.disconnect mid-turn kills the CLI's process group at once: nobody could ever
    ask for that turn's result."""
    stopped_in, (pid,), sent = _leave_mid_turn(services, caplog, {"message": "@sleep 30"})
    assert stopped_in < 5
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    (finished,) = services.registry.recently_completed()
    assert services.results.get(finished)["status"] == "cancelled"
    assert len(services.registry) == 0
    assert sent[0]["type"] == "http.response.start"


def test_a_named_turn_runs_on_when_its_client_leaves_and_is_retained(
    services: Services, caplog: pytest.LogCaptureFixture
) -> None:
    """With an execution id the turn finishes; its answer is kept for GET …/result."""
    body = {"message": "@sleep 1", "execution_id": "stays"}
    ran_on_for, _, _ = _leave_mid_turn(services, caplog, body)
    assert ran_on_for >= 0.5
    record = services.results.get("stays")
    assert record is not None
    assert (record["status"], record["http_status"]) == ("success", 200)
    assert json.loads(record["response"])["prompt"] == "@sleep 1"
