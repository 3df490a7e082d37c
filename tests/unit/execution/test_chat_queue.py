"""A chat waiting behind the chat before it is a turn like any other (contract §6.4):
listed, counted against the cap, terminable; and every refusal carries the whole body.
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from agent_server.services import Services
from agent_server.wire.errors import TurnErrorDetail
from tests.support.fake_cli import fingerprint
from tests.support.in_process import app_client, cli_report, fake_cli_services, wait_until

pytestmark = pytest.mark.timeout(60)

BASELINE_OAUTH = "unit-baseline-oauth-0123456789"
OVERRIDE_KEY = "unit-override-key-0123456789"
ROTATED_OAUTH = "unit-rotated-oauth-0123456789"


@pytest.fixture
def services(environ: dict[str, str]) -> Services:
    """A Claude agent over the fake CLI with two turn slots."""
    return fake_cli_services(
        environ, CLAUDE_CODE_OAUTH_TOKEN=BASELINE_OAUTH, AGENT_SERVER_MAX_PARALLEL="2"
    )


def _states(services: Services) -> dict[str, str]:
    return {e.execution_id: e.state for e in services.registry.running()}


def test_a_queued_chat_is_listed_counted_and_cancelled_without_spawning(
    services: Services,
) -> None:
    """Queued: in the list and pending_ids, holding a slot; terminated: cancelled, never run."""

    async def scenario() -> dict[str, Any]:
        async with app_client(services) as client:
            first = asyncio.create_task(
                client.post("/api/chat", json={"message": "@sleep 30", "execution_id": "one"})
            )
            await wait_until(lambda: _states(services).get("one") == "running")
            second = asyncio.create_task(
                client.post("/api/chat", json={"message": "never", "execution_id": "two"})
            )
            await wait_until(lambda: "two" in _states(services))
            listed = (await client.get("/api/executions/running")).json()
            third = await client.post("/api/task", json={"message": "x", "execution_id": "three"})
            stop = await client.post("/api/executions/two/terminate")
            cancelled = await asyncio.wait_for(second, 10)
            services.registry.terminate("one")
            await asyncio.wait_for(first, 10)
            return {"listed": listed, "third": third, "stop": stop, "cancelled": cancelled}

    seen = asyncio.run(scenario())
    listed = seen["listed"]
    assert [(e["execution_id"], e["state"]) for e in listed["executions"]] == [
        ("one", "running"),
        ("two", "queued"),
    ]
    assert listed["pending_ids"] == ["two"]
    assert seen["third"].status_code == 409  # the queued chat holds the second slot
    assert seen["third"].json()["detail"]["error_code"] == "busy"
    assert seen["stop"].json() == {"status": "terminated"}
    answer = seen["cancelled"]
    assert answer.status_code == 200
    body = answer.json()
    assert (body["status"], body["response"], body["execution_log"]) == ("cancelled", "", [])
    assert body["metadata"]["execution_id"] == "two"
    assert body["metadata"]["exit_code"] is None  # no process ever ran
    assert body["session"]["session_id"] is None
    assert services.registry.recently_completed() == ["two", "one"]


def test_a_queued_chat_runs_on_the_credential_in_force_when_it_starts(
    services: Services,
) -> None:
    """A token reloaded while the chat waited is the one it runs on, and the generation."""

    async def scenario() -> tuple[httpx.Response, int]:
        async with app_client(services) as client:
            first = asyncio.create_task(client.post("/api/chat", json={"message": "@sleep 0.5"}))
            await wait_until(lambda: "running" in _states(services).values())
            second = asyncio.create_task(
                client.post("/api/chat", json={"message": "after", "execution_id": "later"})
            )
            await wait_until(lambda: _states(services).get("later") == "queued")
            reload = await client.post(
                "/api/credentials/reload-token", json={"token": ROTATED_OAUTH}
            )
            assert reload.status_code == 200, reload.text
            await asyncio.wait_for(first, 10)
            return await asyncio.wait_for(second, 10), reload.json()["generation"]

    answer, generation = asyncio.run(scenario())
    report = cli_report(answer)
    assert report["served_by"] == "CLAUDE_CODE_OAUTH_TOKEN"
    assert answer.json()["metadata"]["generation"] == generation
    assert report["fp"] == fingerprint(ROTATED_OAUTH)


def test_a_refused_turn_carries_the_whole_error_body(services: Services) -> None:
    """409 execution_in_progress: every §7 key, the id it named, its route and header."""

    async def scenario() -> httpx.Response:
        async with app_client(services) as client:
            first = asyncio.create_task(
                client.post("/api/task", json={"message": "@sleep 30", "execution_id": "dup"})
            )
            await wait_until(lambda: "dup" in _states(services))
            body = {
                "message": "x",
                "execution_id": "dup",
                "auth_override": {"api_key": OVERRIDE_KEY},
            }
            refused = await client.post("/api/chat", json=body)
            services.registry.terminate("dup")
            await asyncio.wait_for(first, 10)
            return refused

    refused = asyncio.run(scenario())
    assert refused.status_code == 409
    detail = refused.json()["detail"]
    assert set(detail) == set(TurnErrorDetail.model_fields)
    assert detail["error_code"] == "execution_in_progress"
    assert (detail["retryable"], detail["switch_credential"]) == (False, False)
    assert (detail["execution_id"], detail["auth_route"]) == ("dup", "api_key")
    assert refused.headers["x-trinity-auth-override"] == "api_key"
    assert OVERRIDE_KEY not in refused.text


def test_the_shutdown_fails_a_queued_chat_like_a_running_one(services: Services) -> None:
    """A drain that runs out of grace: the queued chat answers 504 killed, not cancelled."""

    async def scenario() -> httpx.Response:
        async with app_client(services) as client:
            first = asyncio.create_task(client.post("/api/chat", json={"message": "@sleep 30"}))
            await wait_until(lambda: "running" in _states(services).values())
            second = asyncio.create_task(
                client.post("/api/chat", json={"message": "x", "execution_id": "waiting"})
            )
            await wait_until(lambda: "waiting" in _states(services))
            await services.registry.drain(0)
            await asyncio.wait_for(first, 10)
            return await asyncio.wait_for(second, 10)

    answer = asyncio.run(scenario())
    assert answer.status_code == 504
    assert answer.json()["detail"]["error_code"] == "killed"
