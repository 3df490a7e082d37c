"""`agent-server status` (contract §8): the local credential status, printed without a server."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from agent_server.__main__ import format_status
from agent_server.credentials.state import fingerprint
from agent_server.wire.credentials import (
    CredentialFiles,
    CredentialStatus,
    DriftRow,
    EffectiveAuth,
    OverrideFileStatus,
)
from tests.conftest import SecretRegistry

AGENT_SERVER = Path(sys.executable).with_name("agent-server")


def _status(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(AGENT_SERVER), "status", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
        stdin=subprocess.DEVNULL,
    )


@pytest.fixture
def local(environ: dict[str, str], secret_registry: SecretRegistry) -> dict[str, str]:
    """A configuration with a stale key in .env, an OAuth token in env and an override file."""
    Path(environ["AGENT_SERVER_ENV_FILE"]).write_text(
        f"ANTHROPIC_API_KEY={secret_registry.new('status_stale_key')}\nEDITOR=vi\n"
    )
    state = Path(environ["AGENT_SERVER_STATE_DIR"])
    state.mkdir(mode=0o700)
    override = state / "oauth-token"
    override.write_text(secret_registry.new("status_override"))
    override.chmod(0o600)
    return {**environ, "CLAUDE_CODE_OAUTH_TOKEN": secret_registry.new("status_env_oauth")}


def test_status_json_names_the_effective_credential_and_the_drift(
    local: dict[str, str], secret_registry: SecretRegistry
) -> None:
    """--json prints the §4 status: the override token wins, the stale .env key is suppressed."""
    done = _status(local, "--json")
    assert done.returncode == 0, done.stderr
    status: dict[str, Any] = json.loads(done.stdout)
    override = (Path(local["AGENT_SERVER_STATE_DIR"]) / "oauth-token").read_text()
    assert status["effective_auth"] == {
        "variable": "CLAUDE_CODE_OAUTH_TOKEN",
        "layer": "override",
        "fingerprint": fingerprint(override),
        "conflicts": [],
    }
    assert status["guard_armed"] is True
    rows = {row["key"]: row for row in status["env_drift"]}
    assert rows["ANTHROPIC_API_KEY"]["in_file"] is True
    assert rows["ANTHROPIC_API_KEY"]["suppressed_for_spawn"] is True
    assert rows["CLAUDE_CODE_OAUTH_TOKEN"]["spawn_source"] == "override"
    assert "EDITOR" in rows
    assert status["files"]["override_file"]["mode"] == "0600"
    assert secret_registry.leaks([done.stdout, done.stderr]) == []


def test_status_prints_a_short_summary_for_an_operator(
    local: dict[str, str], secret_registry: SecretRegistry
) -> None:
    """The default output says which credential is used and what it shadows, then the table."""
    done = _status(local)
    assert done.returncode == 0, done.stderr
    override = (Path(local["AGENT_SERVER_STATE_DIR"]) / "oauth-token").read_text()
    lines = done.stdout.splitlines()
    assert (
        f"effective credential: CLAUDE_CODE_OAUTH_TOKEN (override, {fingerprint(override)})"
        in lines
    )
    assert "shadowed: ANTHROPIC_API_KEY in .env is suppressed by the guard" in lines
    header = next(line for line in lines if line.startswith("KEY"))
    assert header.split() == ["KEY", ".ENV", "PROCESS", "EQUAL", "SPAWN"]
    assert any(line.split()[:2] == ["ANTHROPIC_API_KEY", "yes"] for line in lines)
    assert len(lines) < 20
    assert secret_registry.leaks([done.stdout, done.stderr]) == []


def test_status_neither_serves_nor_creates_a_controller_token(local: dict[str, str]) -> None:
    """Without TRINITY_AGENT_AUTH_TOKEN, status writes no agent-auth-token and starts no server."""
    state = Path(local["AGENT_SERVER_STATE_DIR"])
    before = sorted(p.name for p in state.iterdir())
    done = _status(local)
    assert done.returncode == 0, done.stderr
    assert not (state / "agent-auth-token").exists()
    assert sorted(p.name for p in state.iterdir()) == before
    assert "Uvicorn running" not in done.stderr
    assert "serving runtime" not in done.stderr


def test_status_leaves_a_running_servers_temp_file_alone(local: dict[str, str]) -> None:
    """status is read-only: a reload's temp file (of the server running beside it) survives."""
    temp = Path(local["AGENT_SERVER_STATE_DIR"]) / "oauth-token.tmp.inflight"
    temp.write_text("half-written")
    temp.chmod(0o600)
    assert _status(local).returncode == 0
    assert temp.exists()


def test_status_refuses_a_bad_setting_in_one_line(environ: dict[str, str]) -> None:
    """A bad AGENT_RUNTIME is one line on stderr and exit 2, nothing on stdout."""
    done = _status({**environ, "AGENT_RUNTIME": "cobol"})
    assert done.returncode == 2
    assert done.stdout == ""
    assert len(done.stderr.strip().splitlines()) == 1


def _row(key: str, **facts: Any) -> DriftRow:
    base: dict[str, Any] = {
        "in_file": False,
        "in_process_env": False,
        "equal": None,
        "overridden_for_spawn": False,
        "suppressed_for_spawn": False,
        "spawn_source": None,
    }
    return DriftRow(key=key, **{**base, **facts})


def _summary(effective: EffectiveAuth | None, rows: list[DriftRow], armed: bool) -> str:
    return format_status(
        CredentialStatus(
            agent_name="a",
            runtime="claude-code",
            generation=7,
            fingerprint=None,
            auth_mode="subscription",
            guard_armed=armed,
            files=CredentialFiles(
                env_file="/h/.env", override_file=OverrideFileStatus(exists=False)
            ),
            effective_auth=effective,
            env_drift=rows,
        )
    )


def test_summary_without_any_credential_says_so() -> None:
    """No effective credential: the CLI's own login is the only way left, and the line says it."""
    text = _summary(None, [], armed=False)
    assert "effective credential: none" in text
    assert "override file: none" in text


def test_summary_names_conflicts_and_a_replaced_env_value() -> None:
    """Conflicting credentials are listed; a .env value an override replaces is called shadowed."""
    effective = EffectiveAuth(
        variable="ANTHROPIC_API_KEY",
        layer="env_file",
        fingerprint="sha256:0123456789ab",
        conflicts=["CLAUDE_CODE_OAUTH_TOKEN"],
    )
    rows = [
        _row("ANTHROPIC_API_KEY", in_file=True, spawn_source="env_file"),
        _row(
            "CLAUDE_CODE_OAUTH_TOKEN",
            in_file=True,
            in_process_env=True,
            equal=False,
            overridden_for_spawn=True,
            spawn_source="override",
        ),
        _row("CLAUDE_CODE_USE_VERTEX", suppressed_for_spawn=True),
    ]
    lines = _summary(effective, rows, armed=False).splitlines()
    assert "effective credential: ANTHROPIC_API_KEY (env_file, sha256:0123456789ab)" in lines
    assert "also in the spawn env: CLAUDE_CODE_OAUTH_TOKEN" in lines
    assert "shadowed: CLAUDE_CODE_OAUTH_TOKEN in .env is replaced by the override" in lines
    assert "guard: not armed; unset for spawns: CLAUDE_CODE_USE_VERTEX" in lines
    table = {line.split()[0]: line.split()[1:] for line in lines if line.startswith("CLAUDE_")}
    assert table == {"CLAUDE_CODE_OAUTH_TOKEN": ["yes", "yes", "no", "override"]}
