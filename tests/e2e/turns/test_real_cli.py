"""Turns of the REAL Claude Code CLI through a real server, against the Messages API stand-in.

The stand-in answers `served-by kind=<bearer|x-api-key> fp=<sha256-12>`, so every turn
proves which credential the real CLI actually sent. These tests FAIL under CI when
the CLI is missing (`require_real_cli`), they never skip there.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.requests import Request
from starlette.responses import Response

from tests.conftest import SecretRegistry
from tests.e2e.conftest import TurnServers
from tests.support.messages_api import (
    QUIET_CLI,
    MessagesApiStandIn,
    Scenario,
    fingerprint,
    require_real_cli,
)
from tests.support.server import ServerProcess

pytestmark = pytest.mark.realcli

OVERRIDE_HEADER = "X-Trinity-Auth-Override"
DESCRIPTOR_OF = {
    "oauth_token": "CLAUDE_CODE_OAUTH_TOKEN_FILE_DESCRIPTOR",
    "api_key": "CLAUDE_CODE_API_KEY_FILE_DESCRIPTOR",
}


class CountingStandIn(MessagesApiStandIn):
    """The stand-in, also recording how many messages each request carried."""

    def __init__(self) -> None:
        super().__init__()
        self.message_counts: list[int] = []
        self._count_lock = threading.Lock()

    async def _messages(self, request: Request) -> Response:
        try:
            body = await request.json()
        except ValueError:
            body = {}
        messages = body.get("messages") if isinstance(body, dict) else None
        with self._count_lock:
            self.message_counts.append(len(messages) if isinstance(messages, list) else -1)
        return await super()._messages(request)


@pytest.fixture(scope="module")
def cli() -> Path:
    """The real CLI (fails under CI when missing)."""
    return require_real_cli()


@pytest.fixture(scope="module")
def api() -> Iterator[CountingStandIn]:
    """One stand-in for the module."""
    with CountingStandIn() as stand_in:
        yield stand_in


def real_env(cli: Path, api: MessagesApiStandIn, **extra: str) -> dict[str, str]:
    """The server env that runs the real CLI quietly against the stand-in."""
    return {
        "AGENT_SERVER_RUNTIME_COMMAND": str(cli),
        "ANTHROPIC_BASE_URL": api.base_url,
        **QUIET_CLI,
        "IS_SANDBOX": "1",
        **extra,
    }


def served_by(response: httpx.Response) -> str:
    """The stand-in's answer the turn returned."""
    assert response.status_code == 200, response.text
    text: str = response.json()["response"]
    return text.strip()


def bearer(token: str) -> str:
    """What the stand-in answers to a request carrying this OAuth token."""
    return f"served-by kind=bearer fp={fingerprint(token)}"


def post(server: ServerProcess, path: str, body: dict[str, Any]) -> httpx.Response:
    """POST with the controller token (one client per call: safe from threads)."""
    with server.client(timeout=90) as client:
        return client.post(path, json=body)


def reload(server: ServerProcess, token: str) -> dict[str, Any]:
    """Rotate the subscription token; assert it took."""
    with server.client() as client:
        response = client.post("/api/credentials/reload-token", json={"token": token})
    assert response.status_code == 200, response.text
    result: dict[str, Any] = response.json()
    return result


@pytest.fixture(scope="module")
def baseline_token(secret_registry: SecretRegistry) -> str:
    """The subscription token in the module server's process env."""
    return secret_registry.new("real_baseline")


@pytest.fixture(scope="module")
def server(
    module_turn_servers: TurnServers,
    cli: Path,
    api: CountingStandIn,
    secret_registry: SecretRegistry,
    baseline_token: str,
) -> ServerProcess:
    """OAuth baseline in the process env, a stale API key in `.env`."""
    home = module_turn_servers.home("real")
    (home / ".env").write_text(f"ANTHROPIC_API_KEY={secret_registry.new('real_stale_key')}\n")
    return module_turn_servers.start(
        home, **real_env(cli, api, CLAUDE_CODE_OAUTH_TOKEN=baseline_token)
    )


def test_baseline_is_served_by_the_subscription_despite_a_stale_env_key(
    server: ServerProcess, api: CountingStandIn, baseline_token: str
) -> None:
    """The stale `.env` key never reaches the CLI: the OAuth token serves."""
    before = len(api.message_requests)
    response = post(server, "/api/task", {"message": "hello"})
    assert served_by(response) == bearer(baseline_token)
    meta = response.json()["metadata"]
    assert meta["api_key_source"] == "none"
    assert meta["auth_route"] == "baseline"
    assert meta["fingerprint"] == "sha256:" + fingerprint(baseline_token)
    assert OVERRIDE_HEADER.lower() not in response.headers
    (request,) = api.message_requests[before:]
    assert request.fingerprints == {"bearer": fingerprint(baseline_token)}


@pytest.mark.parametrize("kind", ["oauth_token", "api_key"])
def test_an_override_serves_exactly_that_credential_then_the_baseline_returns(
    server: ServerProcess,
    api: CountingStandIn,
    secret_registry: SecretRegistry,
    baseline_token: str,
    kind: str,
) -> None:
    """One spawn, one credential; the next plain turn is back on the baseline."""
    secret = secret_registry.new(f"real_{kind}")
    before = len(api.message_requests)
    response = post(server, "/api/task", {"message": "hi", "auth_override": {kind: secret}})
    header_kind = "bearer" if kind == "oauth_token" else "x-api-key"
    assert served_by(response) == f"served-by kind={header_kind} fp={fingerprint(secret)}"
    assert response.headers[OVERRIDE_HEADER] == kind
    meta = response.json()["metadata"]
    assert meta["auth_route"] == kind
    assert meta["api_key_source"] == ("ANTHROPIC_API_KEY" if kind == "api_key" else "none")
    (request,) = api.message_requests[before:]
    assert request.fingerprints == {header_kind: fingerprint(secret)}

    plain = post(server, "/api/task", {"message": "and now?"})
    assert served_by(plain) == bearer(baseline_token)
    assert OVERRIDE_HEADER.lower() not in plain.headers


@pytest.mark.parametrize("kind", ["oauth_token", "api_key"])
def test_a_bash_tool_in_the_turn_finds_no_credential_in_any_environment(
    server: ServerProcess,
    api: CountingStandIn,
    secret_registry: SecretRegistry,
    baseline_token: str,
    kind: str,
) -> None:
    """The turn's Bash tool prints its own environment and that of every process of the
    turn (the CLI's too): the override that served and the baseline are in none, the
    CLI's names the descriptor it read instead (contract §4.7)."""
    secret = secret_registry.new(f"real_tool_{kind}")
    api.on(secret, Scenario.BASH_TOOL)
    before = len(api.tool_outputs)
    response = post(server, "/api/task", {"message": "run it", "auth_override": {kind: secret}})
    header_kind = "bearer" if kind == "oauth_token" else "x-api-key"
    assert served_by(response) == f"served-by kind={header_kind} fp={fingerprint(secret)}"
    (output,) = api.tool_outputs[before:]  # never printed: it would hold what leaked
    read_the_turns = output.count("== /proc/") >= 2  # the CLI and the tool's own shell
    assert read_the_turns, "the tool read no environment of the turn's processes"
    found = [name for name, value in (("override", secret), ("baseline", baseline_token))
             if value in output]  # fmt: skip
    assert found == []
    named = f"{DESCRIPTOR_OF[kind]}=" in output
    assert named, "the CLI's environment does not name the descriptor"


def test_a_capped_override_answers_429_with_the_header_stamped(
    server: ServerProcess, secret_registry: SecretRegistry
) -> None:
    """A subscription at its 5-hour wall: rate_limit, resets_at, Retry-After, header."""
    capped = secret_registry.new("ratelimit")
    response = post(
        server, "/api/task", {"message": "hi", "auth_override": {"oauth_token": capped}}
    )
    assert response.status_code == 429, response.text
    assert response.headers[OVERRIDE_HEADER] == "oauth_token"
    detail = response.json()["detail"]
    assert detail["error_code"] == "rate_limit"
    assert detail["switch_credential"] is True
    assert detail["auth_route"] == "oauth_token"
    assert detail["rate_limit_type"] == "five_hour"
    assert detail["resets_at"] is not None
    assert 3000 < int(response.headers["Retry-After"]) <= 3601
    assert detail["execution_log"]


def test_an_invalid_override_is_stamped_on_the_auth_error_too(
    server: ServerProcess, secret_registry: SecretRegistry
) -> None:
    """A rejected API key: 503 auth, switch_credential, header stamped."""
    bad = secret_registry.new("badauth")
    response = post(server, "/api/task", {"message": "hi", "auth_override": {"api_key": bad}})
    assert response.status_code == 503, response.text
    assert response.headers[OVERRIDE_HEADER] == "api_key"
    assert response.json()["detail"]["error_code"] == "auth"
    assert response.json()["detail"]["switch_credential"] is True


def test_a_reload_reaches_the_next_turn_while_the_turn_in_flight_keeps_its_token(
    turn_servers: TurnServers, cli: Path, api: CountingStandIn, secret_registry: SecretRegistry
) -> None:
    """Held turn on the old token; reload; a new turn serves on the new one; release."""
    old = secret_registry.new("real_old")
    new = secret_registry.new("real_new")
    api.on(old, Scenario.SLOW)
    server = turn_servers.start(**real_env(cli, api, CLAUDE_CODE_OAUTH_TOKEN=old))
    before = len(api.message_requests)
    try:
        with ThreadPoolExecutor(1) as pool:
            held = pool.submit(post, server, "/api/task", {"message": "slow one"})
            api.wait_for_requests(before + 1, timeout=30)
            generation = reload(server, new)["generation"]
            fresh = post(server, "/api/task", {"message": "after the reload"})
            assert served_by(fresh) == bearer(new)
            assert fresh.json()["metadata"]["generation"] == generation
            assert not held.done()
            api.release()
            answer = held.result()
    finally:
        api.release()
        api.hold()
    assert served_by(answer) == bearer(old)
    assert answer.json()["metadata"]["fingerprint"] == "sha256:" + fingerprint(old)
    assert answer.json()["metadata"]["generation"] < generation


def test_the_chat_resumes_its_session_across_a_credential_switch(
    turn_servers: TurnServers, cli: Path, api: CountingStandIn, secret_registry: SecretRegistry
) -> None:
    """Chat, reload, chat: same session, and the second request carries the history."""
    first_token = secret_registry.new("chat_first")
    second_token = secret_registry.new("chat_second")
    server = turn_servers.start(**real_env(cli, api, CLAUDE_CODE_OAUTH_TOKEN=first_token))
    before = len(api.message_requests)
    counts_before = len(api.message_counts)
    one = post(server, "/api/chat", {"message": "remember the word walnut"})
    assert served_by(one) == bearer(first_token)
    reload(server, second_token)
    time.sleep(0.05)
    two = post(server, "/api/chat", {"message": "which word?"})
    assert served_by(two) == bearer(second_token)

    session = one.json()["session_id"]
    assert session
    assert two.json()["session_id"] == session
    assert two.json()["metadata"]["session_reset"] is False
    first_request, second_request = api.message_requests[before:]
    assert first_request.session_id == second_request.session_id == session
    first_count, second_count = api.message_counts[counts_before:]
    assert second_count > first_count  # the resumed conversation's history came along
    init = next(e for e in two.json()["execution_log"] if e.get("subtype") == "init")
    assert init["session_id"] == session
