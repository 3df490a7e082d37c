"""The credential routes through a real `agent-server serve` on loopback (contract §2, §3, §4)."""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from agent_server.credentials.state import fingerprint
from tests.conftest import SecretRegistry
from tests.e2e.conftest import ServerFactory
from tests.support.server import ServerProcess

OAUTH = "CLAUDE_CODE_OAUTH_TOKEN"
KEY = "ANTHROPIC_API_KEY"
AUTH = "ANTHROPIC_AUTH_TOKEN"
Start = Callable[[Mapping[str, str]], ServerProcess]


@pytest.fixture(scope="module")
def shared(
    tmp_path_factory: pytest.TempPathFactory, secret_registry: SecretRegistry
) -> Iterator[ServerProcess]:
    """One server for the read-only and refused-input tests of this module."""
    factory = ServerFactory(tmp_path_factory.mktemp("shared"), secret_registry)
    try:
        yield factory.start(factory.environ())
    finally:
        factory.close()


def _unchanged(server: ServerProcess, before: dict[str, Any]) -> None:
    after = server.status()
    assert (after["generation"], after["fingerprint"]) == (
        before["generation"],
        before["fingerprint"],
    )
    assert after["files"]["override_file"] == before["files"]["override_file"]


# --- controller authentication (contract §2) ----------------------------------------------


@pytest.mark.parametrize("token", ["", "wrong-token-value"], ids=["no token", "a wrong token"])
def test_a_missing_or_wrong_token_is_401(shared: ServerProcess, token: str) -> None:
    """Protected routes answer 401 {"detail": "Unauthorized"} without the right token."""
    for method, path in [
        ("GET", "/api/credentials/status"),
        ("POST", "/api/credentials/reload-token"),
    ]:
        response = shared.request(method, path, token=token, json={"token": "x" * 20})
        assert response.status_code == 401
        assert response.json() == {"detail": "Unauthorized"}


def test_health_and_options_need_no_token(shared: ServerProcess) -> None:
    """GET /health and OPTIONS are exempt; /health reports token auth."""
    health = shared.get("/health", token="")
    assert health.status_code == 200
    assert health.json()["auth"] == "token"
    assert shared.request("OPTIONS", "/api/credentials/status", token="").status_code != 401
    assert shared.get("/metrics", token="").status_code != 401


def test_fail_closed_generates_a_0600_token_file(
    servers: ServerFactory, server_env: dict[str, str], secret_registry: SecretRegistry
) -> None:
    """No token configured: a 0600 agent-auth-token appears, its value works, its path is logged."""
    del server_env["TRINITY_AGENT_AUTH_TOKEN"]
    server = servers.start(server_env)
    path = server.state_dir / "agent-auth-token"
    generated = secret_registry.add("generated controller token", path.read_text())
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert len(generated) >= 32
    assert server.get("/api/credentials/status", token="").status_code == 401
    assert server.get("/api/credentials/status", token=generated).status_code == 200
    assert server.get("/health", token="").json()["auth"] == "token"
    assert str(path) in server.log_text()


def test_insecure_no_auth_turns_auth_off(
    servers: ServerFactory, server_env: dict[str, str]
) -> None:
    """INSECURE_NO_AUTH=1: no token needed, /health says insecure, a WARNING at boot."""
    del server_env["TRINITY_AGENT_AUTH_TOKEN"]
    server_env["AGENT_SERVER_INSECURE_NO_AUTH"] = "1"
    server = servers.start(server_env)
    assert server.get("/api/credentials/status", token="").status_code == 200
    assert server.get("/health", token="").json()["auth"] == "insecure"
    assert not (server.state_dir / "agent-auth-token").exists()
    warnings = [r for r in server.log_messages() if r["level"] == "WARNING"]
    assert any("INSECURE_NO_AUTH" in r["message"] for r in warnings)


# --- reload-token refusals -----------------------------------------------------------


def _json(body: Any) -> dict[str, Any]:
    return {"content": json.dumps(body).encode(), "headers": {"content-type": "application/json"}}


BAD_RELOADS = [
    pytest.param(_json({"token": ""}), "token_required", id="an empty token"),
    pytest.param(_json({"token": " \t\n "}), "token_required", id="a whitespace-only token"),
    pytest.param(_json({"token": "tsecinner SPACE0123"}), "token_invalid", id="whitespace inside"),
    pytest.param(_json({"token": "tsecctrl\u0001char0123"}), "token_invalid", id="a control char"),
    pytest.param(_json({"token": "tsecdel\u007fchar0123"}), "token_invalid", id="a DEL character"),
    pytest.param(_json({"token": "tseclong" + "a" * 4089}), "token_invalid", id="over 4096 bytes"),
    pytest.param(
        _json({"token": "tsecmb" + "\u00e9" * 2046}), "token_invalid", id="over 4096 in fewer"
    ),
    pytest.param(_json({"token": "sk-ant-oat01-…"}), "token_invalid", id="the placeholder"),
    pytest.param(_json({"token": "tsechello"}), "token_invalid", id="shorter than a token"),
    pytest.param(_json({"token": "tsecunknownfield01", "extra": 1}), 422, id="an unknown field"),
    pytest.param(_json({"token": 123456789}), 422, id="a token that is not a string"),
    pytest.param(_json({"remove_api_key": True}), 422, id="a missing token"),
    pytest.param(
        {
            "content": b'{"token": "tsecnotjson0123"',
            "headers": {"content-type": "application/json"},
        },
        422,
        id="a body that is not JSON",
    ),
    pytest.param({"content": b""}, 422, id="an empty body"),
]


@pytest.mark.parametrize(("request_kwargs", "refusal"), BAD_RELOADS)
def test_a_bad_reload_is_refused_and_changes_nothing(
    shared: ServerProcess, request_kwargs: dict[str, Any], refusal: int | str
) -> None:
    """400 token_required or token_invalid, or 422 with a list detail; never the input
    echoed back, and no change."""
    before = shared.status()
    response = shared.post("/api/credentials/reload-token", **request_kwargs)
    detail = response.json()["detail"]
    if isinstance(refusal, str):
        assert response.status_code == 400
        assert detail["error_code"] == refusal
        assert "tsec" not in response.text
    else:
        assert response.status_code == refusal
        assert isinstance(detail, list)
        assert detail
        assert all("input" not in error for error in detail)
        assert "tsec" not in response.text
    _unchanged(shared, before)
    assert not (shared.state_dir / "oauth-token").exists()


# --- reload-token that takes effect --------------------------------------------------


def test_a_good_reload(
    start_server: Start, server_env: dict[str, str], secret_registry: SecretRegistry
) -> None:
    """200 with a grown generation and the fingerprint; the file holds the raw token at 0600."""
    token = secret_registry.new("reloaded")
    server = start_server(server_env)
    server.env_file.write_text(f"{KEY}={secret_registry.new('dotenv_api_key')}\nFOO=1\n")
    before = server.status()
    response = server.reload({"token": token, "remove_api_key": True})
    assert response.status_code == 200
    body = response.json()
    assert body == {
        "status": "success",
        "reloaded": True,
        "changed": True,
        "generation": body["generation"],
        "fingerprint": fingerprint(token),
        "persisted": True,
        "env_shadow": [KEY],
    }
    assert body["generation"] > before["generation"]
    path = server.state_dir / "oauth-token"
    assert path.read_text() == token
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    status = server.status()
    assert (status["generation"], status["fingerprint"]) == (
        body["generation"],
        body["fingerprint"],
    )
    assert status["guard_armed"] is True
    assert status["effective_auth"]["variable"] == OAUTH
    assert status["effective_auth"]["layer"] == "override"


def test_the_same_reload_again_is_not_a_change(
    start_server: Start, server_env: dict[str, str], secret_registry: SecretRegistry
) -> None:
    """The same token and flag again: changed false, same generation; env_shadow [] unflagged."""
    token = secret_registry.new("idempotent")
    server = start_server(server_env)
    server.env_file.write_text(f"{KEY}={secret_registry.new('dotenv_api_key')}\n")
    first = server.reload({"token": token}).json()
    again = server.reload({"token": token}).json()
    assert (first["changed"], first["env_shadow"]) == (True, [])
    assert (again["changed"], again["generation"]) == (False, first["generation"])
    assert again["fingerprint"] == first["fingerprint"]


def test_a_stale_expected_generation_is_409(
    start_server: Start, server_env: dict[str, str], secret_registry: SecretRegistry
) -> None:
    """expected_generation that is not current: 409 generation_mismatch and nothing changes."""
    server = start_server(server_env)
    before = server.status()
    stale = server.reload(
        {"token": secret_registry.new("mismatch"), "expected_generation": before["generation"] - 1}
    )
    assert stale.status_code == 409
    assert stale.json()["detail"]["error_code"] == "generation_mismatch"
    _unchanged(server, before)
    ok = server.reload(
        {"token": secret_registry.new("matching"), "expected_generation": before["generation"]}
    )
    assert ok.status_code == 200


# --- status and drift ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("baseline", "dotenv", "variable", "layer", "conflicts", "armed"),
    [
        pytest.param(
            [OAUTH],
            [KEY, AUTH],
            OAUTH,
            "baseline",
            [],
            True,
            id="a baseline OAuth token arms the guard over .env keys",
        ),
        pytest.param(
            [],
            [OAUTH, AUTH, KEY],
            KEY,
            "env_file",
            [AUTH, OAUTH],
            False,
            id="the API key beats the auth token beats the OAuth token",
        ),
        pytest.param(
            [KEY],
            [AUTH, "CLAUDE_CODE_USE_BEDROCK"],
            "CLAUDE_CODE_USE_BEDROCK",
            "env_file",
            [KEY, AUTH],
            False,
            id="a provider switch beats every credential",
        ),
    ],
)
def test_status_and_drift(
    start_server: Start,
    server_env: dict[str, str],
    secret_registry: SecretRegistry,
    baseline: list[str],
    dotenv: list[str],
    variable: str,
    layer: str,
    conflicts: list[str],
    armed: bool,
) -> None:
    """effective_auth follows the CLI's precedence; drift rows carry names only."""
    for name in baseline:
        server_env[name] = secret_registry.new(f"baseline_{name}")
    lines = [
        f"{n}={'1' if n.startswith('CLAUDE_CODE_USE') else secret_registry.new(n)}" for n in dotenv
    ]
    Path(server_env["AGENT_SERVER_ENV_FILE"]).write_text("\n".join([*lines, "PLAIN=plainvalue42"]))
    server = start_server(server_env)
    status = server.status()
    auth = status["effective_auth"]
    assert (auth["variable"], auth["layer"], auth["conflicts"]) == (variable, layer, conflicts)
    assert status["guard_armed"] is armed
    rows = {row["key"]: row for row in status["env_drift"]}
    assert set(rows) >= {*baseline, *dotenv, "PLAIN"}
    assert all(
        set(row)
        == {
            "key",
            "in_file",
            "in_process_env",
            "equal",
            "overridden_for_spawn",
            "suppressed_for_spawn",
            "spawn_source",
            "note",
        }
        for row in rows.values()
    )
    if armed:
        assert rows[KEY]["suppressed_for_spawn"] is True
        assert rows[KEY]["spawn_source"] is None
        assert rows[KEY]["note"] == "force-unset: the credential guard removes it"
    assert "plainvalue42" not in json.dumps(status)


def test_status_shows_the_override_file_metadata(
    start_server: Start, server_env: dict[str, str], secret_registry: SecretRegistry
) -> None:
    """files.override_file shows exists, mode 0600 and size, never the content."""
    token = secret_registry.new("file_meta")
    server = start_server(server_env)
    assert server.status()["files"]["override_file"]["exists"] is False
    server.reload({"token": token})
    meta = server.status()["files"]["override_file"]
    assert (meta["exists"], meta["mode"], meta["size"]) == (True, "0600", len(token))


def test_a_reloaded_token_survives_a_restart(
    start_server: Start, server_env: dict[str, str], secret_registry: SecretRegistry
) -> None:
    """Stale tokens in `.env` and the process env lose to the reloaded one after a restart."""
    server_env[OAUTH] = secret_registry.new("stale_process_oauth")
    Path(server_env["AGENT_SERVER_ENV_FILE"]).write_text(
        f"{OAUTH}={secret_registry.new('stale_dotenv')}\n"
    )
    token = secret_registry.new("rotated")
    first = start_server(server_env)
    generation = first.reload({"token": token}).json()["generation"]
    first.stop()
    second = start_server(server_env)
    status = second.status()
    assert status["fingerprint"] == fingerprint(token)
    assert status["effective_auth"]["fingerprint"] == fingerprint(token)
    assert (status["effective_auth"]["variable"], status["effective_auth"]["layer"]) == (
        OAUTH,
        "override",
    )
    assert status["generation"] > generation


# --- no secret leaks (contract §8) --------------------------------------------------------


def test_no_test_secret_reaches_a_log_line_or_a_body(
    servers: ServerFactory, server_env: dict[str, str], secret_registry: SecretRegistry
) -> None:
    """Credentials in every input path never appear in the JSON log or any response body."""
    server_env[OAUTH] = secret_registry.new("leak_baseline_oauth")
    server_env["GITHUB_TOKEN"] = secret_registry.new("leak_github")
    Path(server_env["AGENT_SERVER_ENV_FILE"]).write_text(
        f"{KEY}={secret_registry.new('leak_dotenv_key')}\nDB_PASSWORD={secret_registry.new('leak_db')}\n"
    )
    server = servers.start(server_env)
    rotated = secret_registry.new("leak_rotated")
    server.reload({"token": rotated, "remove_api_key": True})
    server.reload({"token": secret_registry.new("leak_inner") + " x"})
    server.reload({"token": rotated, "bogus": secret_registry.new("leak_field")})
    server.get("/api/credentials/status", token=secret_registry.new("leak_wrong_controller"))
    # The access log carries query strings: known secrets there must be masked.
    server.get(f"/api/credentials/status?probe={rotated}")
    server.get(f"/health?probe={server_env[OAUTH]}&ctl={server.token}")
    server.status()
    server.stop()
    records = server.log_messages()  # every line is one JSON object
    assert any("reload-token" in r["message"] for r in records)
    assert "[REDACTED]" in server.log_text()
    assert secret_registry.leaks([server.log_text(), *server.bodies()]) == []
    assert os.environ.get(OAUTH) != server_env[OAUTH]
