"""Settings (contract §1): defaults, aliases, and a one-line refusal for a bad value."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from agent_server.config import Settings
from agent_server.errors import ConfigError


def test_defaults(tmp_path: Path) -> None:
    """With only HOME set, every setting takes its contract §1 default."""
    settings = Settings.from_environ({"HOME": str(tmp_path)})
    assert (settings.runtime, settings.runtime_command) == ("claude-code", "claude")
    assert (settings.host, settings.port) == ("127.0.0.1", 8000)
    assert settings.state_dir == tmp_path / ".local" / "state" / "agent-server"
    assert settings.override_file == settings.state_dir / "oauth-token"
    assert settings.env_file == tmp_path / ".env"
    assert settings.workdir == tmp_path
    assert settings.permission_mode == "bypassPermissions"
    assert (settings.max_parallel, settings.shutdown_grace_s) == (32, 30.0)
    assert settings.max_log_bytes == 8388608
    assert settings.log_format == "json"
    assert (settings.auth_token, settings.insecure_no_auth) == (None, False)
    assert settings.broker is True


def test_xdg_state_home_moves_the_state_dir(tmp_path: Path) -> None:
    """XDG_STATE_HOME is honoured when AGENT_SERVER_STATE_DIR is unset."""
    settings = Settings.from_environ({"HOME": "/h", "XDG_STATE_HOME": str(tmp_path)})
    assert settings.state_dir == tmp_path / "agent-server"


@pytest.mark.parametrize(
    ("raw", "runtime", "command"),
    [
        pytest.param("claude", "claude-code", "claude", id="claude is an alias of claude-code"),
        pytest.param("codex", "codex", "codex", id="codex"),
        pytest.param("gemini", "gemini-cli", "gemini", id="gemini is an alias of gemini-cli"),
        pytest.param(" Gemini-CLI ", "gemini-cli", "gemini", id="case and blanks are forgiven"),
    ],
)
def test_runtime_aliases(raw: str, runtime: str, command: str) -> None:
    """Each runtime spelling maps to its canonical name and default command."""
    settings = Settings.from_environ({"HOME": "/h", "AGENT_RUNTIME": raw})
    assert (settings.runtime, settings.runtime_command) == (runtime, command)


def test_the_controller_token_is_secret_and_stripped() -> None:
    """TRINITY_AGENT_AUTH_TOKEN is a SecretStr, never shown in repr."""
    settings = Settings.from_environ({"HOME": "/h", "TRINITY_AGENT_AUTH_TOKEN": " ctl-secret-1 "})
    assert settings.auth_token is not None
    assert settings.auth_token.get_secret_value() == "ctl-secret-1"
    assert "ctl-secret-1" not in repr(settings)


@pytest.mark.parametrize(
    ("name", "value"),
    [
        pytest.param("AGENT_RUNTIME", "cursor", id="an unknown runtime"),
        pytest.param("AGENT_SERVER_PORT", "eighty", id="a non-numeric port"),
        pytest.param("AGENT_SERVER_PORT", "65536", id="a port out of range"),
        pytest.param("AGENT_SERVER_MAX_PARALLEL", "0", id="zero parallel turns"),
        pytest.param("AGENT_SERVER_SHUTDOWN_GRACE_S", "nan", id="a NaN grace"),
        pytest.param("AGENT_SERVER_SHUTDOWN_GRACE_S", "-1", id="a negative grace"),
        pytest.param("AGENT_SERVER_INSECURE_NO_AUTH", "maybe", id="a non-boolean flag"),
        pytest.param("AGENT_SERVER_LOG_FORMAT", "xml", id="an unknown log format"),
        pytest.param("AGENT_SERVER_HEARTBEAT_INTERVAL_S", "0.1", id="a heartbeat flood"),
        pytest.param("AGENT_SERVER_HEARTBEAT_INTERVAL_S", "301", id="a heartbeat too rare"),
        pytest.param("AGENT_SERVER_HEARTBEAT_INTERVAL_S", "inf", id="no heartbeat at all"),
        pytest.param("AGENT_SERVER_SETTING_SOURCES", "user,policy", id="an unknown source"),
        pytest.param("AGENT_SERVER_BROKER", "off-ish", id="a broker neither on nor off"),
    ],
)
def test_bad_values_are_refused(name: str, value: str) -> None:
    """A bad value raises ConfigError naming the variable and the value."""
    with pytest.raises(ConfigError) as caught:
        Settings.from_environ({"HOME": "/h", name: value})
    assert name in str(caught.value)
    assert value in str(caught.value)


def _agent_server_command() -> list[str]:
    script = Path(sys.executable).with_name("agent-server")
    return [str(script)] if script.exists() else [sys.executable, "-m", "agent_server"]


@pytest.mark.parametrize(
    ("name", "value"),
    [
        pytest.param("AGENT_RUNTIME", "cursor-agent", id="an unknown runtime"),
        pytest.param("AGENT_SERVER_PORT", "eighty", id="a non-numeric port"),
        pytest.param("AGENT_SERVER_LOG_FORMAT", "yaml", id="an unknown log format"),
    ],
)
def test_the_command_refuses_to_start_with_one_line(tmp_path: Path, name: str, value: str) -> None:
    """`agent-server` exits non-zero with exactly one stderr line and no traceback."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp_path), name: value}
    done = subprocess.run(
        [*_agent_server_command(), "serve"], env=env, capture_output=True, text=True, timeout=60
    )
    lines = done.stderr.splitlines()
    assert done.returncode != 0
    assert len(lines) == 1, done.stderr
    assert name in lines[0]
    assert value in lines[0]
    assert "Traceback" not in done.stderr
    assert not (tmp_path / ".local").exists()


@pytest.mark.parametrize(
    ("configured", "isatty", "chosen"),
    [
        pytest.param(None, False, "json", id="unset and not a terminal: json"),
        pytest.param(None, True, "text", id="unset on a terminal: text"),
        pytest.param("json", True, "json", id="json on a terminal, because asked"),
        pytest.param(" TEXT ", False, "text", id="text off a terminal, because asked"),
    ],
)
def test_the_log_format_follows_the_terminal_unless_set(
    configured: str | None, isatty: bool, chosen: str
) -> None:
    """AGENT_SERVER_LOG_FORMAT wins; unset, a terminal gets text and anything else JSON."""
    environ = {"HOME": "/h"}
    if configured is not None:
        environ["AGENT_SERVER_LOG_FORMAT"] = configured
    assert Settings.from_environ(environ, isatty=isatty).log_format == chosen


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        pytest.param(None, 5.0, id="unset: every 5 s"),
        pytest.param(" ", 5.0, id="blank: every 5 s"),
        pytest.param("0.5", 0.5, id="the fastest allowed"),
        pytest.param("300", 300.0, id="the slowest allowed"),
    ],
)
def test_the_heartbeat_interval(value: str | None, expected: float) -> None:
    """`AGENT_SERVER_HEARTBEAT_INTERVAL_S` sets the interval within its bounds."""
    environ = {"HOME": "/h"}
    if value is not None:
        environ["AGENT_SERVER_HEARTBEAT_INTERVAL_S"] = value
    assert Settings.from_environ(environ).heartbeat_interval_s == expected


@pytest.mark.parametrize(
    ("raw", "sources"),
    [(None, None), ("", ()), (" project , local,project", ("project", "local"))],
    ids=["unset: the CLI's default", "empty: none", "a list, trimmed, each once"],
)
def test_setting_sources(raw: str | None, sources: tuple[str, ...] | None) -> None:
    """AGENT_SERVER_SETTING_SOURCES: which of the agent's settings files Claude Code loads."""
    environ = {"HOME": "/h"} if raw is None else {"HOME": "/h", "AGENT_SERVER_SETTING_SOURCES": raw}
    assert Settings.from_environ(environ).setting_sources == sources


@pytest.mark.parametrize(
    ("raw", "broker"),
    [(None, True), (" ", True), ("1", True), ("yes", True), ("0", False), ("false", False)],
    ids=["unset: on", "blank: on", "1", "yes", "0: off", "false: off"],
)
def test_the_broker_is_on_unless_turned_off(raw: str | None, broker: bool) -> None:
    """AGENT_SERVER_BROKER: every CLI's credentials reach only the broker, unless 0 (§4.8)."""
    environ = {"HOME": "/h"} if raw is None else {"HOME": "/h", "AGENT_SERVER_BROKER": raw}
    assert Settings.from_environ(environ).broker is broker
