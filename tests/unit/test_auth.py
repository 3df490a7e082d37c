"""Controller authentication (contract §2): the token check, its exemptions, and failing closed."""

from __future__ import annotations

import asyncio
import logging
import os
import stat
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import SecretStr

from agent_server.app import ENDPOINTS
from agent_server.auth import EXEMPT_PATHS, ControllerAuth, resolve_controller_token
from agent_server.services import Services
from tests.support.in_process import TOKEN, app_client, fake_cli_services, request

pytestmark = pytest.mark.timeout(60)

HEADER = "X-Trinity-Agent-Token"
UNAUTHORIZED = {"detail": "Unauthorized"}
TOKEN_FILE = "agent-auth-token"


def _get(services: Services, path: str, headers: dict[str, str]) -> httpx.Response:
    return request(services, "GET", path, headers=headers)


@pytest.mark.parametrize(
    ("headers", "status"),
    [
        pytest.param({HEADER: TOKEN}, 200, id="the right token passes"),
        pytest.param({HEADER.upper(): TOKEN}, 200, id="the header name is case-insensitive"),
        pytest.param({}, 401, id="no header fails"),
        pytest.param({HEADER: ""}, 401, id="an empty value fails"),
        pytest.param({HEADER: "not-the-token-0123456789"}, 401, id="a wrong value fails"),
        pytest.param({HEADER: TOKEN.upper()}, 401, id="the value in another case fails"),
        pytest.param({HEADER: TOKEN[:-1]}, 401, id="a prefix of the token fails"),
        pytest.param({HEADER: TOKEN + "0"}, 401, id="the token with more after it fails"),
        pytest.param(
            {"Authorization": f"Bearer {TOKEN}"}, 401, id="the token in another header fails"
        ),
    ],
)
def test_only_the_exact_token_in_its_header_passes(
    environ: dict[str, str], headers: dict[str, str], status: int
) -> None:
    """A refusal is exactly 401 {"detail": "Unauthorized"} as JSON, with its length."""
    response = _get(fake_cli_services(environ), "/api/executions/running", headers)
    assert response.status_code == status
    if status == 401:
        assert response.json() == UNAUTHORIZED
        assert response.headers["content-type"] == "application/json"
        assert int(response.headers["content-length"]) == len(response.content)


def test_the_public_routes_are_exactly_the_exempt_paths() -> None:
    """The routes table's public flag (the OpenAPI security) agrees with the middleware."""
    assert {e.path for e in ENDPOINTS if e.public} == EXEMPT_PATHS


@pytest.mark.parametrize(
    "endpoint",
    [e for e in ENDPOINTS if not e.public],
    ids=lambda e: f"{e.method} {e.path}",
)
def test_every_protected_route_refuses_a_request_without_the_token(
    environ: dict[str, str], endpoint: Any
) -> None:
    """401 before anything else runs: no body is read, no turn registered."""
    services = fake_cli_services(environ)

    async def scenario() -> httpx.Response:
        async with app_client(services, headers={}) as client:
            path = endpoint.path.replace("{execution_id}", "x")
            return await client.request(endpoint.method, path, json={"message": "x"})

    response = asyncio.run(scenario())
    assert (response.status_code, response.json()) == (401, UNAUTHORIZED)
    assert services.registry.recently_completed() == []


@pytest.mark.parametrize(
    ("method", "path", "status"),
    [
        pytest.param("GET", "/health", 200, id="GET /health is exempt"),
        pytest.param("GET", "/metrics", 200, id="GET /metrics is exempt"),
        pytest.param(
            "OPTIONS", "/api/task", 405, id="OPTIONS on a protected route reaches the router"
        ),
        pytest.param("OPTIONS", "/nowhere", 404, id="OPTIONS on no route reaches the router"),
        pytest.param("GET", "/health/", 401, id="a trailing slash is not the exempt path"),
        pytest.param("GET", "/healthz", 401, id="a longer name is not the exempt path"),
        pytest.param("GET", "/HEALTH", 401, id="paths are case-sensitive"),
        pytest.param("GET", "/api/no-such-route", 401, id="an unknown path is not revealed"),
    ],
)
def test_what_needs_no_token(environ: dict[str, str], method: str, path: str, status: int) -> None:
    """Only /health, /metrics (exactly) and OPTIONS get past the middleware without a token."""
    services = fake_cli_services(environ)

    async def scenario() -> httpx.Response:
        async with app_client(services, headers={}) as client:
            return await client.request(method, path)

    assert asyncio.run(scenario()).status_code == status


def test_insecure_mode_needs_no_token_anywhere(environ: dict[str, str]) -> None:
    """AGENT_SERVER_INSECURE_NO_AUTH=1: no controller token at all, every route open."""
    services = fake_cli_services(
        environ, TRINITY_AGENT_AUTH_TOKEN="", AGENT_SERVER_INSECURE_NO_AUTH="1"
    )
    assert services.controller_token is None
    assert _get(services, "/api/executions/running", {}).status_code == 200
    assert _get(services, "/api/credentials/status", {HEADER: "anything"}).status_code == 200


def test_a_scope_other_than_http_passes_through() -> None:
    """Lifespan (and websocket) scopes carry no headers to check: the app gets them as is."""
    seen: list[str] = []

    async def inner(scope: Any, receive: Any, send: Any) -> None:
        seen.append(scope["type"])

    async def nothing() -> Any:
        return {}

    async def ignore(message: Any) -> None:
        raise AssertionError(message)

    auth = ControllerAuth(inner, SecretStr(TOKEN))
    asyncio.run(auth({"type": "lifespan"}, nothing, ignore))
    assert seen == ["lifespan"]


# --- resolve_controller_token -----------------------------------------------------------


def test_a_configured_token_wins_and_writes_nothing(tmp_path: Path) -> None:
    """The token from the environment is the token; no file appears in the state dir."""
    configured = SecretStr("unit-configured-token-0001")
    state_dir = tmp_path / "state"
    assert resolve_controller_token(configured, False, state_dir) is configured
    assert not state_dir.exists()


@pytest.mark.parametrize(
    "configured",
    [
        pytest.param(None, id="with no token configured"),
        pytest.param(SecretStr("unit-configured-token-0001"), id="even over a configured token"),
    ],
)
def test_insecure_mode_returns_none_and_warns(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, configured: SecretStr | None
) -> None:
    """Auth is off: None, one WARNING naming the setting, no file written."""
    with caplog.at_level(logging.WARNING, logger="agent_server.auth"):
        assert resolve_controller_token(configured, True, tmp_path / "state") is None
    (record,) = caplog.records
    assert record.levelno == logging.WARNING
    assert "AGENT_SERVER_INSECURE_NO_AUTH=1" in record.getMessage()
    assert "OFF" in record.getMessage()
    assert not (tmp_path / "state").exists()


def test_no_token_generates_one_in_a_0600_file_and_logs_only_its_path(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The state dir is created 0700, the file holds the raw token at 0600, the log its path."""
    state_dir = tmp_path / "state"
    with caplog.at_level(logging.DEBUG, logger="agent_server.auth"):
        token = resolve_controller_token(None, False, state_dir)
    assert token is not None
    value = token.get_secret_value()
    assert len(value) >= 43  # 32 random bytes, URL-safe base64
    path = state_dir / TOKEN_FILE
    assert path.read_text() == value
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(state_dir.stat().st_mode) == 0o700
    (record,) = caplog.records
    assert record.levelno == logging.WARNING
    assert str(path) in record.getMessage()
    assert value not in caplog.text


def test_a_generated_token_survives_a_restart(tmp_path: Path) -> None:
    """A second boot without a configured token uses the one the first wrote: the README's
    `T=$(cat …)` keeps working after a restart."""
    tmp_path.chmod(0o700)
    first = resolve_controller_token(None, False, tmp_path)
    second = resolve_controller_token(None, False, tmp_path)
    assert first is not None
    assert second is not None
    assert first.get_secret_value() == second.get_secret_value()
    assert (tmp_path / TOKEN_FILE).read_text() == second.get_secret_value()


@pytest.mark.parametrize(
    ("content", "mode"),
    [
        pytest.param("short-token", 0o600, id="too short to be one we generated"),
        pytest.param("x" * 43, 0o644, id="shown to others"),
        pytest.param("with a space " + "x" * 40, 0o600, id="not a token"),
    ],
)
def test_a_token_file_that_is_not_a_private_generated_token_is_replaced(
    tmp_path: Path, content: str, mode: int
) -> None:
    """Only a private file holding a token of ours is used again; else a new one is made."""
    tmp_path.chmod(0o700)
    (tmp_path / TOKEN_FILE).write_text(content)
    (tmp_path / TOKEN_FILE).chmod(mode)
    token = resolve_controller_token(None, False, tmp_path)
    assert token is not None
    assert token.get_secret_value() != content
    assert (tmp_path / TOKEN_FILE).read_text() == token.get_secret_value()
    assert stat.S_IMODE((tmp_path / TOKEN_FILE).stat().st_mode) == 0o600


def _state_dir_is_a_file(tmp_path: Path) -> Path:
    path = tmp_path / "state"
    path.write_text("not a directory")
    return path


def _state_dir_open_to_all(tmp_path: Path) -> Path:
    path = tmp_path / "state"
    path.mkdir()
    path.chmod(0o777)
    return path


def _token_file_is_a_symlink(tmp_path: Path) -> Path:
    path = tmp_path / "state"
    path.mkdir(mode=0o700)
    (tmp_path / "elsewhere").write_text("untouched")
    (path / TOKEN_FILE).symlink_to(tmp_path / "elsewhere")
    return path


@pytest.mark.parametrize(
    "make_state_dir",
    [
        pytest.param(_state_dir_is_a_file, id="the state dir is a regular file"),
        pytest.param(_state_dir_open_to_all, id="the state dir is writable by others"),
        pytest.param(_token_file_is_a_symlink, id="the token file is a symlink"),
    ],
)
def test_an_unwritable_token_file_still_fails_closed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, make_state_dir: Any
) -> None:
    """A token nobody knows is returned (the API stays shut), and an ERROR names the path."""
    state_dir = make_state_dir(tmp_path)
    with caplog.at_level(logging.DEBUG, logger="agent_server.auth"):
        token = resolve_controller_token(None, False, state_dir)
    assert token is not None
    assert len(token.get_secret_value()) >= 43
    (record,) = caplog.records
    assert record.levelno == logging.ERROR
    assert str(state_dir / TOKEN_FILE) in record.getMessage()
    assert token.get_secret_value() not in caplog.text
    assert token.get_secret_value() not in "".join(
        p.read_text() for p in tmp_path.rglob("*") if p.is_file()
    )


def test_the_generated_token_is_the_one_the_app_asks_for(environ: dict[str, str]) -> None:
    """A server with no token configured answers the value in agent-auth-token, and only it."""
    services = fake_cli_services(environ, TRINITY_AGENT_AUTH_TOKEN="")
    token_file = services.settings.state_dir / TOKEN_FILE
    generated = token_file.read_text()
    assert _get(services, "/api/executions/running", {HEADER: generated}).status_code == 200
    assert _get(services, "/api/executions/running", {HEADER: TOKEN}).status_code == 401
    assert _get(services, "/api/executions/running", {}).status_code == 401


def test_a_server_whose_token_file_cannot_be_written_lets_nobody_in(
    environ: dict[str, str],
) -> None:
    """Fail closed: with the token file refused, no header value opens a protected route."""
    state_dir = Path(environ["AGENT_SERVER_STATE_DIR"])
    state_dir.mkdir()
    state_dir.chmod(0o777)
    try:
        services = fake_cli_services(environ, TRINITY_AGENT_AUTH_TOKEN="")
    finally:
        state_dir.chmod(0o700)
    assert not (state_dir / TOKEN_FILE).exists()
    assert services.controller_token is not None
    for headers in ({}, {HEADER: ""}, {HEADER: TOKEN}):
        assert _get(services, "/api/credentials/status", headers).status_code == 401
    assert _get(services, "/health", {}).json()["auth"] == "token"
    assert os.listdir(state_dir) == []
