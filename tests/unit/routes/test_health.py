"""GET /health and GET /metrics (contract §8): readiness, auth mode, capabilities, the metrics."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from agent_server import __version__
from agent_server.readiness import runtime_available
from agent_server.services import Services
from tests.support.contract import CLAUDE_TURN_OPTIONS, CODEX_TURN_OPTIONS
from tests.support.in_process import (
    TOKEN,
    app_client,
    fake_cli_services,
    request,
    wait_until,
)
from tests.support.server import FAKE_CLAUDE

pytestmark = pytest.mark.timeout(60)

BASELINE_OAUTH = "unit-baseline-oauth-0123456789"


def _executable(path: Path, mode: int = 0o755) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\nexit 0\n")
    path.chmod(mode)
    return path


@pytest.fixture
def bin_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A PATH of one folder holding `unit-cli` (executable) and `unit-text` (not), cwd tmp_path."""
    folder = tmp_path / "bin"
    _executable(folder / "unit-cli")
    _executable(folder / "unit-text", 0o644)
    monkeypatch.setenv("PATH", str(folder))
    monkeypatch.chdir(tmp_path)
    return folder


@pytest.mark.parametrize(
    ("command", "available"),
    [
        pytest.param(str(FAKE_CLAUDE), True, id="an absolute path to an executable file"),
        pytest.param("bin/unit-cli", True, id="a relative path is a path, from the cwd"),
        pytest.param("/nonexistent/unit-cli", False, id="a path that does not exist"),
        pytest.param("bin/unit-text", False, id="a path to a file that is not executable"),
        pytest.param("bin", False, id="a path to a directory"),
        pytest.param("unit-cli", True, id="a name found executable on PATH"),
        pytest.param("unit-text", False, id="a name on PATH that is not executable"),
        pytest.param("unit-missing", False, id="a name on no PATH entry"),
        pytest.param("home", False, id="a bare name is never looked up in the cwd"),
    ],
)
def test_runtime_available(bin_dir: Path, command: str, available: bool) -> None:
    """A command with a slash is a file to check; a bare name is looked up on PATH."""
    (bin_dir.parent / "home").mkdir(exist_ok=True)
    _executable(bin_dir.parent / "home" / "x")
    assert runtime_available(command) is available


def _health(services: Services) -> httpx.Response:
    return request(services, "GET", "/health", headers={})


def test_a_ready_claude_agent_is_ok(environ: dict[str, str]) -> None:
    """No token needed; the whole body, every override kind, every turn option; no secret."""
    services = fake_cli_services(environ, CLAUDE_CODE_OAUTH_TOKEN=BASELINE_OAUTH)
    response = _health(services)
    assert response.status_code == 200
    assert response.json() == {
        "status": "ok",
        "problems": [],
        "agent_name": "test-agent",
        "runtime": "claude-code",
        "runtime_available": True,
        "version": __version__,
        "active_executions": 0,
        "isolation": "same_uid",
        "spawn_user": None,
        "containment": "process_group",  # no lifespan here: the reaper is not installed
        "auth": "token",
        "capabilities": {
            "auth_override": ["oauth_token", "api_key", "provider"],
            "turn_options": CLAUDE_TURN_OPTIONS,
            "not_enforced": [],
            "reload_token": True,
            "credential_status": True,
        },
    }
    assert BASELINE_OAUTH not in response.text
    assert TOKEN not in response.text


@pytest.mark.parametrize(
    ("command", "status"),
    [
        pytest.param("unit-cli", "ok", id="a name on PATH is ok"),
        pytest.param("unit-missing", "degraded", id="a name on no PATH is degraded"),
        pytest.param("/nonexistent/claude", "degraded", id="a missing path is degraded"),
        pytest.param("bin/unit-text", "degraded", id="a file that cannot run is degraded"),
    ],
)
def test_a_missing_runtime_is_degraded_and_still_200(
    environ: dict[str, str], bin_dir: Path, command: str, status: str
) -> None:
    """The status stays 200; the body says degraded and runtime_available false."""
    services = fake_cli_services(environ, AGENT_SERVER_RUNTIME_COMMAND=command)
    response = _health(services)
    assert response.status_code == 200
    assert response.json()["status"] == status
    assert response.json()["runtime_available"] is (status == "ok")


def test_a_codex_without_a_key_is_degraded_until_a_reload_finds_one(
    environ: dict[str, str],
) -> None:
    """Checked at boot: no key, no login, so no turn can run; a reload-token checks again
    and finds the key the operator has since put in `.env`. Names, never values."""
    key = "unit-openai-key-0123456789abcdef"
    services = fake_cli_services(environ, AGENT_RUNTIME="codex")

    async def scenario() -> tuple[dict[str, Any], dict[str, Any], int]:
        await services.readiness.check()  # what the lifespan does at boot
        async with app_client(services) as client:
            before = (await client.get("/health")).json()
            Path(environ["AGENT_SERVER_ENV_FILE"]).write_text(f"OPENAI_API_KEY={key}\n")
            reload = await client.post("/api/credentials/reload-token", json={"token": "t" * 24})
            after = (await client.get("/health")).json()
            return before, after, reload.status_code

    before, after, reloaded = asyncio.run(scenario())
    assert reloaded == 200
    assert before["status"] == "degraded"
    assert before["runtime_available"] is True
    (problem,) = before["problems"]
    assert "OPENAI_API_KEY" in problem
    assert (after["status"], after["problems"]) == ("ok", [])
    assert key not in json.dumps(after)


@pytest.mark.parametrize(
    ("extra", "problems"),
    [
        pytest.param({"IS_SANDBOX": ""}, ["claude-code refuses bypassPermissions as root"],
                     id="root without IS_SANDBOX=1 cannot run a turn"),
        pytest.param({"IS_SANDBOX": "1"}, [], id="root with IS_SANDBOX=1 can"),
        pytest.param({"IS_SANDBOX": "", "AGENT_SERVER_PERMISSION_MODE": "default"}, [],
                     id="root in another permission mode can"),
    ],
)  # fmt: skip
def test_a_claude_agent_as_root_needs_is_sandbox(
    environ: dict[str, str], extra: dict[str, str], problems: list[str]
) -> None:
    """The spawn uid is the server's: as root, Claude Code's own refusal is foreseen."""
    if os.geteuid() != 0:
        pytest.skip("the refusal is root's; CI runs as root")
    services = fake_cli_services(environ, **extra)
    found = asyncio.run(services.readiness.check())
    assert [text[: len(want)] for text, want in zip(found, problems, strict=True)] == problems
    body = _health(services).json()
    assert body["status"] == ("degraded" if problems else "ok")


def test_a_missing_runtime_is_named_a_problem(environ: dict[str, str]) -> None:
    """The command that is no executable is a problem too, named by its variable only."""
    services = fake_cli_services(environ, AGENT_SERVER_RUNTIME_COMMAND="/nonexistent/x-cli")
    body = _health(services).json()
    assert body["problems"] == [
        "the runtime command (AGENT_SERVER_RUNTIME_COMMAND) is no executable"
    ]
    assert "/nonexistent" not in json.dumps(body)


def test_insecure_mode_says_so(environ: dict[str, str]) -> None:
    """AGENT_SERVER_INSECURE_NO_AUTH=1: auth "insecure"."""
    services = fake_cli_services(
        environ, TRINITY_AGENT_AUTH_TOKEN="", AGENT_SERVER_INSECURE_NO_AUTH="1"
    )
    assert _health(services).json()["auth"] == "insecure"


@pytest.mark.parametrize(
    ("runtime", "overrides", "options", "unenforced"),
    [
        pytest.param(
            "claude-code",
            ["oauth_token", "api_key", "provider"],
            CLAUDE_TURN_OPTIONS,
            [],
            id="claude code takes every override and every option",
        ),
        pytest.param(
            "codex",
            ["api_key", "provider"],
            CODEX_TURN_OPTIONS,
            ["allowed_tools"],
            id="codex takes a key or a provider, enforces no tool list, has no turn cap",
        ),
        pytest.param(
            "gemini-cli",
            ["api_key", "provider"],
            ["model", "system_prompt", "resume_session_id"],
            ["allowed_tools", "persist_session"],
            id="gemini takes a key or a provider and keeps its sessions",
        ),
    ],
)
def test_capabilities_are_the_runtimes(
    environ: dict[str, str],
    runtime: str,
    overrides: list[str],
    options: list[str],
    unenforced: list[str],
) -> None:
    """capabilities follow the contract §6.1 table of each runtime, with the broker on
    (the default)."""
    services = fake_cli_services(environ, AGENT_RUNTIME=runtime, AGENT_SERVER_BROKER="1")
    body = _health(services).json()
    assert body["runtime"] == runtime
    assert body["capabilities"]["auth_override"] == overrides
    assert body["capabilities"]["turn_options"] == options
    assert body["capabilities"]["not_enforced"] == unenforced


@pytest.mark.parametrize("runtime", ["codex", "gemini-cli"])
def test_without_the_broker_a_key_only_cli_takes_no_override(
    environ: dict[str, str], runtime: str
) -> None:
    """With AGENT_SERVER_BROKER=0 the CLI's own configuration would choose where a key
    goes, so Codex and Gemini CLI take no `auth_override` (contract §6.2)."""
    services = fake_cli_services(environ, AGENT_RUNTIME=runtime, AGENT_SERVER_BROKER="0")
    assert _health(services).json()["capabilities"]["auth_override"] == []


def test_active_executions_counts_the_turns_in_flight(environ: dict[str, str]) -> None:
    """A running turn shows as 1, and 0 again once it is stopped."""
    services = fake_cli_services(environ)

    async def scenario() -> tuple[int, int]:
        async with app_client(services) as client:
            turn = asyncio.create_task(
                client.post("/api/task", json={"message": "@sleep 30", "execution_id": "busy"})
            )
            await wait_until(lambda: len(services.registry) == 1)
            during = (await client.get("/health")).json()["active_executions"]
            services.registry.terminate("busy")
            await asyncio.wait_for(turn, 10)
            after = (await client.get("/health")).json()["active_executions"]
            return during, after

    assert asyncio.run(scenario()) == (1, 0)


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def test_metrics_is_prometheus_text_with_every_family(environ: dict[str, str]) -> None:
    """No token; the exposition content type; the six §8 families with their types."""
    services = fake_cli_services(environ)

    async def scenario() -> httpx.Response:
        async with app_client(services, headers={}) as client:
            return await client.get("/metrics")

    response = asyncio.run(scenario())
    assert response.status_code == 200
    assert response.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
    families = {
        f.name: f.type
        for f in text_string_to_metric_families(response.text)
        if not f.name.endswith("_created")  # the client's creation-time series
    }
    assert families == {
        "agent_server_turns": "counter",
        "agent_server_turn_seconds": "histogram",
        "agent_server_active_turns": "gauge",
        "agent_server_credential_reloads": "counter",
        "agent_server_credential_generation": "gauge",
        "agent_server_spawn_suppressed_keys": "counter",
        "agent_server_result_callbacks": "counter",
        "agent_server_heartbeats": "counter",
        "agent_server_result_retention_failures": "counter",
    }


def test_metrics_count_a_served_turn_and_never_show_its_credential(
    environ: dict[str, str],
) -> None:
    """One override turn: counted by outcome and route, timed, the generation shown, no value."""
    services = fake_cli_services(environ, CLAUDE_CODE_OAUTH_TOKEN=BASELINE_OAUTH)
    override = "unit-override-key-0123456789"

    async def scenario() -> str:
        async with app_client(services) as client:
            body = {"message": "x", "auth_override": {"api_key": override}}
            assert (await client.post("/api/task", json=body)).status_code == 200
            return (await client.get("/metrics")).text

    text = asyncio.run(scenario())
    samples: dict[Any, float] = _samples(text)
    turns = ("agent_server_turns_total", (("auth_route", "api_key"), ("outcome", "success")))
    assert samples[turns] == 1
    assert samples[("agent_server_turn_seconds_count", ())] == 1
    assert samples[("agent_server_active_turns", ())] == 0
    generation = samples[("agent_server_credential_generation", ())]
    assert generation == services.store.current.generation
    assert override not in text
    assert BASELINE_OAUTH not in text


def test_a_generated_token_reports_token_auth_and_is_never_shown(environ: dict[str, str]) -> None:
    """No token configured: /health says auth "token" (fail closed), and shows no value."""
    services = fake_cli_services(environ, TRINITY_AGENT_AUTH_TOKEN="")
    generated = (services.settings.state_dir / "agent-auth-token").read_text()
    response = _health(services)
    assert response.json()["auth"] == "token"
    assert generated not in response.text
