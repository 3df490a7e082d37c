"""Operations of a live server (contract §8): /metrics, JSON logs, /openapi.json and /health."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from agent_server import __version__
from tests.conftest import SecretRegistry
from tests.e2e.conftest import TurnServers
from tests.support.contract import CLAUDE_TURN_OPTIONS, CODEX_TURN_OPTIONS
from tests.support.server import CONTROLLER_TOKEN, ServerProcess

RELOAD = "/api/credentials/reload-token"


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of a Prometheus exposition: (name, sorted labels) -> value."""
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def _guarded_server(turn_servers: TurnServers, registry: SecretRegistry) -> ServerProcess:
    """A Claude agent whose .env has a stale API key and whose env has an OAuth token.

    The permission mode is `default` because the replayed fixtures were recorded in it.
    """
    home = turn_servers.home()
    (home / ".env").write_text(f"ANTHROPIC_API_KEY={registry.new('ops_stale_key')}\n")
    return turn_servers.start(
        home,
        CLAUDE_CODE_OAUTH_TOKEN=registry.new("ops_oauth"),
        AGENT_SERVER_PERMISSION_MODE="default",
    )


def test_metrics_count_turns_reloads_and_suppressed_keys(
    turn_servers: TurnServers, secret_registry: SecretRegistry
) -> None:
    """/metrics (no auth) counts each turn by outcome and route, each reload by result."""
    server = _guarded_server(turn_servers, secret_registry)
    with server.client() as client:
        assert client.post("/api/task", json={"message": "hello"}).status_code == 200
        override = {"api_key": secret_registry.new("ops_override_key")}
        routed = client.post("/api/task", json={"message": "hi", "auth_override": override})
        assert routed.status_code == 200, routed.text
        limited = client.post("/api/task", json={"message": "@scenario rate_limit_five_hour_oauth"})
        assert limited.status_code == 429, limited.text
        token = {"token": secret_registry.new("ops_rotated")}
        assert client.post(RELOAD, json=token).status_code == 200
        assert client.post(RELOAD, json=token).status_code == 200
        assert client.post(RELOAD, json={"token": ""}).status_code == 400
        assert client.post(RELOAD, json={**token, "expected_generation": 1}).status_code == 409
        assert client.post(RELOAD, json={"token": "a b"}).status_code == 400
        assert client.post(RELOAD, json={**token, "extra": 1}).status_code == 422
        generation = client.get("/api/credentials/status").json()["generation"]
    with server.client(token="") as anonymous:
        response = anonymous.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    samples = _samples(response.text)

    def value(name: str, **labels: str) -> float | None:
        return samples.get((name, tuple(sorted(labels.items()))))

    assert value("agent_server_turns_total", outcome="success", auth_route="baseline") == 1
    assert value("agent_server_turns_total", outcome="success", auth_route="api_key") == 1
    assert value("agent_server_turns_total", outcome="rate_limit", auth_route="baseline") == 1
    assert value("agent_server_turn_seconds_count") == 3
    assert value("agent_server_turn_seconds_bucket", le="+Inf") == 3
    assert value("agent_server_active_turns") == 0
    for result in (
        "changed",
        "unchanged",
        "token_required",
        "token_invalid",
        "generation_mismatch",
    ):
        assert value("agent_server_credential_reloads_total", result=result) == 1, result
    assert value("agent_server_credential_reloads_total", result="validation_failed") == 1
    assert value("agent_server_credential_generation") == generation
    suppressed = value("agent_server_spawn_suppressed_keys_total", key="ANTHROPIC_API_KEY")
    assert suppressed is not None
    assert suppressed >= 1
    assert secret_registry.leaks([response.text]) == []


def test_every_log_line_is_json_and_no_secret_reaches_it(
    turn_servers: TurnServers, secret_registry: SecretRegistry
) -> None:
    """stderr is JSON lines (uvicorn's too), turn lines carry their execution id, no secret."""
    server = _guarded_server(turn_servers, secret_registry)
    in_path = secret_registry.new("ops_in_path")
    with server.client() as client:
        done = client.post("/api/task", json={"message": "hello", "execution_id": "ops-exec-1"})
        assert done.status_code == 200, done.text
        # A secret in a URL reaches uvicorn's access log call: the redactor must mask it.
        client.post(RELOAD, json={"token": in_path})
        assert client.post(f"/api/executions/{in_path}/terminate").status_code in (200, 404)
        client.get("/health", params={"h": "Authorization: Bearer opaque.bearer.value"})
        client.get("/health", params={"k": "sk-ant-api03-ShouldNotAppear_0"})
        client.get("/no/such/route")
    server.stop()
    text = server.log_text()
    entries = [json.loads(line) for line in text.splitlines()]
    assert all({"time", "level", "logger", "message"} <= set(entry) for entry in entries)
    loggers = {entry["logger"] for entry in entries}
    assert {"uvicorn.access", "uvicorn.error", "agent_server.turn"} <= loggers
    about_turn = [
        e for e in entries if e["logger"] in ("agent_server.turn", "agent_server.spawn_env")
    ]
    assert about_turn
    assert all(e.get("execution_id") == "ops-exec-1" for e in about_turn)
    assert secret_registry.leaks([text]) == []
    assert "opaque.bearer.value" not in text
    assert "ShouldNotAppear" not in text


def test_openapi_needs_the_token_and_describes_every_route(
    turn_servers: TurnServers,
) -> None:
    """The live /openapi.json: 401 without the token, an OpenAPI 3.1 document with it."""
    server = turn_servers.start()
    with server.client(token="") as anonymous:
        denied = anonymous.get("/openapi.json")
    assert (denied.status_code, denied.json()) == (401, {"detail": "Unauthorized"})
    with server.client() as client:
        served = client.get("/openapi.json")
    assert served.status_code == 200
    document: dict[str, Any] = served.json()
    assert document["openapi"].startswith("3.1")
    assert "/api/task" in document["paths"]
    assert document["components"]["securitySchemes"]["controllerToken"]["name"] == (
        "X-Trinity-Agent-Token"
    )


def _health(server: ServerProcess) -> httpx.Response:
    with server.client(token="") as anonymous:
        return anonymous.get("/health")


def test_health_of_a_ready_claude_agent(turn_servers: TurnServers) -> None:
    """No token needed; ok, the runtime found, token auth, all three override kinds; the
    containment in force, which the boot log says too."""
    server = turn_servers.start()
    response = _health(server)
    assert "containment: subreaper_sweep" in server.log_text()
    assert response.status_code == 200
    assert response.json() == {
        "status": "ok",
        "problems": [],
        "agent_name": "test-agent",
        "runtime": "claude-code",
        "runtime_available": True,
        "version": __version__,
        "active_executions": 0,
        "auth": "token",
        "isolation": "same_uid",
        "spawn_user": None,
        "containment": "subreaper_sweep",
        "capabilities": {
            "auth_override": ["oauth_token", "api_key", "provider"],
            "turn_options": CLAUDE_TURN_OPTIONS,
            "not_enforced": [],
            "reload_token": True,
            "credential_status": True,
        },
    }


@pytest.mark.parametrize(
    ("command", "insecure"),
    [
        pytest.param("/nonexistent/claude", "0", id="a missing runtime command"),
        pytest.param("definitely-not-on-path-claude", "1", id="a name not on PATH, auth off"),
    ],
)
def test_health_says_degraded_when_the_runtime_is_missing(
    turn_servers: TurnServers, tmp_path: Path, command: str, insecure: str
) -> None:
    """Still 200: the body says degraded, runtime_available false, and how auth is set."""
    extra = {"AGENT_SERVER_RUNTIME_COMMAND": command, "AGENT_SERVER_INSECURE_NO_AUTH": insecure}
    if insecure == "1":
        extra["TRINITY_AGENT_AUTH_TOKEN"] = ""
    response = _health(turn_servers.start(**extra))
    assert response.status_code == 200
    body = response.json()
    assert (body["status"], body["runtime_available"]) == ("degraded", False)
    assert body["auth"] == ("insecure" if insecure == "1" else "token")


def test_health_of_a_codex_agent_offers_no_auth_override(turn_servers: TurnServers) -> None:
    """A runtime that cannot take a Claude credential advertises no override kinds."""
    response = _health(turn_servers.start(AGENT_RUNTIME="codex"))
    body = response.json()
    assert body["runtime"] == "codex"
    assert body["capabilities"]["auth_override"] == []
    assert body["capabilities"]["turn_options"] == CODEX_TURN_OPTIONS
    assert CONTROLLER_TOKEN not in response.text


def test_a_system_prompt_that_looks_like_an_option_is_still_a_prompt(
    turn_servers: TurnServers,
) -> None:
    """`system_prompt: "-x"` reaches the CLI as the prompt text, not as a flag."""
    with turn_servers.start().client() as client:
        response = client.post("/api/task", json={"message": "hi", "system_prompt": "-x"})
    assert response.status_code == 200, response.text
    assert json.loads(response.json()["response"])["append_system_prompt"] == "-x"


def test_a_nul_in_the_system_prompt_is_a_validation_error(turn_servers: TurnServers) -> None:
    """A NUL byte cannot be an argv element: 422 before any spawn, not a 500."""
    with turn_servers.start().client() as client:
        response = client.post("/api/task", json={"message": "hi", "system_prompt": "a\x00b"})
    assert response.status_code == 422, response.text


def test_the_access_log_names_the_caller_not_a_forwarded_header(
    turn_servers: TurnServers,
) -> None:
    """The agent shares the loopback: an `X-Forwarded-For` it sends never stands in for
    the caller's address in the access log (uvicorn's proxy headers are off)."""
    server = turn_servers.start()
    forged = {"X-Forwarded-For": "203.0.113.9", "X-Forwarded-Proto": "https"}
    with server.client(token="") as anonymous:
        assert anonymous.get("/api/executions/running", headers=forged).status_code == 401
    server.stop()
    access = [e["message"] for e in server.log_messages() if e["logger"] == "uvicorn.access"]
    assert any("127.0.0.1:" in line and "/api/executions/running" in line for line in access)
    assert not [line for line in access if "203.0.113.9" in line]
