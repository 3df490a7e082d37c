"""Trinity's backend reading our answers: the real Claude Code CLI through a real server.

Each test plays a rule of the controller (tests/support/trinity.py, each rule naming
the Trinity file it comes from) over a live answer: a model rejection read as one, the
context fields its bars are drawn from, an image the model actually receives, a
queued chat its watchdog can see and stop, and refusals with the whole error body.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from tests.conftest import SecretRegistry
from tests.e2e.conftest import TurnServers, wait_listed
from tests.support import trinity
from tests.support.contract import ERROR_DETAIL_KEYS
from tests.support.images import ONE_IMAGE, data_fingerprint, image, png
from tests.support.messages_api import (
    QUIET_CLI,
    UNKNOWN_MODEL,
    USAGE,
    MessagesApiStandIn,
    fingerprint,
    require_real_cli,
)
from tests.support.server import ServerProcess

pytestmark = [pytest.mark.realcli, pytest.mark.timeout(180)]


@pytest.fixture(scope="module")
def api() -> Iterator[MessagesApiStandIn]:
    """One Messages API stand-in; a slow request waits for `release()` (20 s at most)."""
    with MessagesApiStandIn(slow_max_wait_s=20) as stand_in:
        yield stand_in


@pytest.fixture(scope="module")
def servers(
    module_turn_servers: TurnServers, api: MessagesApiStandIn, secret_registry: SecretRegistry
) -> dict[str, ServerProcess]:
    """`main` (the default cap) and `single` (one turn slot), both over the real CLI."""
    env = {
        "AGENT_SERVER_RUNTIME_COMMAND": str(require_real_cli()),
        "ANTHROPIC_BASE_URL": api.base_url,
        "CLAUDE_CODE_OAUTH_TOKEN": secret_registry.new("good"),
        **QUIET_CLI,
    }
    return {
        "main": module_turn_servers.start(**env),
        "single": module_turn_servers.start(**env, AGENT_SERVER_MAX_PARALLEL="1"),
    }


def _body(message: str = "hi", **extra: Any) -> dict[str, Any]:
    return {"message": message, "execution_id": f"trinity-{secrets.token_hex(4)}", **extra}


def _events(log: list[Any], kind: str) -> list[dict[str, Any]]:
    return [e for e in log if isinstance(e, dict) and e.get("type") == kind]


# --- model rejection: failure_classifier.is_model_rejection -----------------------------


@pytest.mark.parametrize("path", ["/api/task", "/api/chat"])
def test_an_unknown_model_is_read_as_a_model_rejection(
    servers: dict[str, ServerProcess], path: str
) -> None:
    """400 model_unsupported whose message starts `Model unsupported: `; Trinity never
    switches on it and records it as a rejection."""
    response = servers["main"].post(path, json=_body(model=UNKNOWN_MODEL), timeout=90)
    assert response.status_code == 400, response.text
    detail = response.json()["detail"]
    assert detail["error_code"] == "model_unsupported"
    assert detail["message"].startswith("Model unsupported: ")
    assert len(detail["message"]) > len("Model unsupported: ")  # the CLI's sentence follows
    assert trinity.is_model_rejection(detail["message"])
    assert not trinity.is_auth_failure(detail["message"])
    assert trinity.switch_reason(response.status_code, detail["message"]) is None


# --- context: execution_classification._compute_context_used, the chat's session --------


def test_task_metadata_carries_the_cache_and_the_window_the_cli_reported(
    servers: dict[str, ServerProcess],
) -> None:
    """The last call's cache reads and writes and the model's window, as the CLI printed
    them; Trinity's context formula gives the cache's sum."""
    response = servers["main"].post("/api/task", json=_body(), timeout=90)
    assert response.status_code == 200, response.text
    body = response.json()
    metadata = body["metadata"]
    (call,) = [e["message"]["usage"] for e in _events(body["execution_log"], "assistant")]
    (result,) = _events(body["execution_log"], "result")
    assert metadata["cache_read_tokens"] == call["cache_read_input_tokens"] == 1200
    assert metadata["cache_creation_tokens"] == call["cache_creation_input_tokens"] == 300
    assert metadata["context_window"] == result["modelUsage"][metadata["model"]]["contextWindow"]
    assert trinity.context_used(metadata) == 1500
    assert "session" not in body


def test_a_chat_answer_says_how_full_its_session_is(servers: dict[str, ServerProcess]) -> None:
    """`session`: a UUID session id, the last call's whole prompt, and the window."""
    response = servers["main"].post("/api/chat", json=_body(), timeout=90)
    assert response.status_code == 200, response.text
    body = response.json()
    session_id, used, window = trinity.chat_context(body)
    assert str(session_id) == body["session_id"]
    prompt = USAGE["input_tokens"]
    assert used == prompt + USAGE["cache_read_input_tokens"] + USAGE["cache_creation_input_tokens"]
    assert window == body["metadata"]["context_window"] > used


# --- images: what Trinity's channel adapters send ----------------------------------------


@pytest.mark.parametrize("path", ["/api/task", "/api/chat"])
def test_images_reach_the_model_as_image_blocks(
    servers: dict[str, ServerProcess],
    api: MessagesApiStandIn,
    secret_registry: SecretRegistry,
    path: str,
) -> None:
    """The real CLI sends each image, its type and its exact bytes, to the Messages API."""
    token = secret_registry.new("good")
    green = image(png(0, 255, 0), "image/png")
    body = _body("what colours are these?", images=[ONE_IMAGE, green])
    body["auth_override"] = {"oauth_token": token}
    response = servers["main"].post(path, json=body, timeout=90)
    assert response.status_code == 200, response.text
    (request,) = [r for r in api.message_requests if r.fingerprint == fingerprint(token)]
    assert request.images == (
        ("image/png", data_fingerprint(ONE_IMAGE)),
        ("image/png", data_fingerprint(green)),
    )


# --- a queued chat: cleanup_service's watchdog -----------------------------------------


def test_a_queued_chat_is_seen_by_the_watchdog_and_stops_without_running(
    servers: dict[str, ServerProcess], api: MessagesApiStandIn, secret_registry: SecretRegistry
) -> None:
    """A chat behind a slow one: listed `queued` (so the watchdog keeps its row), and
    terminated it answers cancelled having never reached the model."""
    server = servers["main"]
    slow, waiting = _body(), _body()
    slow["auth_override"] = {"oauth_token": secret_registry.new("slow")}
    waiting_token = secret_registry.new("good")
    waiting["auth_override"] = {"oauth_token": waiting_token}
    api.hold()
    with server.client(timeout=90) as client, ThreadPoolExecutor(2) as pool:
        first: Future[httpx.Response] = pool.submit(client.post, "/api/chat", json=slow)
        wait_listed(server, slow["execution_id"], state="running", timeout=30)
        second: Future[httpx.Response] = pool.submit(client.post, "/api/chat", json=waiting)
        listed = wait_listed(server, waiting["execution_id"], state="queued", timeout=30)
        assert waiting["execution_id"] in trinity.watchdog_known(listed)
        assert listed["pending_ids"] == [waiting["execution_id"]]
        stop = client.post(f"/api/executions/{waiting['execution_id']}/terminate")
        cancelled = second.result(timeout=30)
        api.release()
        served = first.result(timeout=60)
    assert stop.json() == {"status": "terminated"}
    assert cancelled.status_code == 200, cancelled.text
    assert cancelled.json()["status"] == "cancelled"
    assert served.status_code == 200, served.text
    assert not [r for r in api.message_requests if r.fingerprint == fingerprint(waiting_token)]
    after = server.get("/api/executions/running").json()
    assert waiting["execution_id"] in trinity.watchdog_known(after)  # recently completed


# --- refusals: the whole error body -----------------------------------------------------


def test_refusals_carry_the_whole_error_body(
    servers: dict[str, ServerProcess], api: MessagesApiStandIn, secret_registry: SecretRegistry
) -> None:
    """409 busy and 409 execution_in_progress: every error key, no switch, the id sent."""
    server = servers["single"]
    slow = _body()
    slow["auth_override"] = {"oauth_token": secret_registry.new("slow")}
    api.hold()
    with server.client(timeout=90) as client, ThreadPoolExecutor(1) as pool:
        running: Future[httpx.Response] = pool.submit(client.post, "/api/task", json=slow)
        wait_listed(server, slow["execution_id"], state="running", timeout=30)
        again = client.post("/api/task", json={**slow, "message": "again"})
        other = _body(auth_override={"api_key": secret_registry.new("good")})
        busy = client.post("/api/chat", json=other)
        api.release()
        assert running.result(timeout=60).status_code == 200
    for response, code, sent, route in [
        (again, "execution_in_progress", slow, "oauth_token"),
        (busy, "busy", other, "api_key"),
    ]:
        assert response.status_code == 409, response.text
        detail = response.json()["detail"]
        assert list(detail) == list(ERROR_DETAIL_KEYS)
        assert detail["error_code"] == code
        assert detail["switch_credential"] is False
        assert (detail["execution_id"], detail["auth_route"]) == (sent["execution_id"], route)
        assert response.headers["X-Trinity-Auth-Override"] == route
        assert trinity.switch_reason(response.status_code, detail["message"]) is None
    assert busy.headers["Retry-After"] == "5"
