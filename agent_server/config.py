"""Settings, read once from the environment at boot (contract §1).

A bad value refuses to start with one line naming the variable and the value
(`ConfigError`); `__main__` prints it and exits non-zero, without a traceback.
"""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from pydantic import SecretStr

from agent_server.errors import ConfigError
from agent_server.logs import choose_log_format
from agent_server.process.spawn_user import SPAWN_USER_VARIABLE, SpawnUser, resolve_spawn_user
from agent_server.records.heartbeat import INTERVAL_S as HEARTBEAT_INTERVAL_S
from agent_server.records.heartbeat import MAX_INTERVAL_S as MAX_HEARTBEAT_INTERVAL_S
from agent_server.records.heartbeat import MIN_INTERVAL_S as MIN_HEARTBEAT_INTERVAL_S
from agent_server.runtimes import RUNTIME_NAMES, adapter_for
from agent_server.wire.names import BYPASS_PERMISSIONS


@dataclass(frozen=True)
class Settings:
    """Everything the server reads from its environment, parsed and checked."""

    agent_name: str
    runtime: str
    runtime_command: str
    host: str
    port: int
    state_dir: Path
    env_file: Path
    workdir: Path
    permission_mode: str
    max_parallel: int
    shutdown_grace_s: float
    max_log_bytes: int
    log_format: str
    """`json` or `text` (contract §8)."""
    auth_token: SecretStr | None
    insecure_no_auth: bool
    callback_url: str | None
    """`TRINITY_BACKEND_URL`: where async turns' results go (contract §6.8)."""
    callback_key: SecretStr | None = field(repr=False)
    """`TRINITY_MCP_API_KEY`: the bearer credential of those callbacks."""
    baseline_env: Mapping[str, str] = field(repr=False)
    """The process environment at boot: the lowest spawn-env layer (contract §4); with a
    spawn user, its HOME, USER and LOGNAME are that user's."""
    spawn_user: SpawnUser | None = None
    """`AGENT_SERVER_SPAWN_USER`: whom every spawn runs as (None: the server's own uid)."""
    broker: bool = True
    """`AGENT_SERVER_BROKER` (default on; `0` turns it off): the CLI's credentials reach
    only the broker (§4.8)."""
    heartbeat_interval_s: float = HEARTBEAT_INTERVAL_S
    """`AGENT_SERVER_HEARTBEAT_INTERVAL_S`: how often the heartbeat is sent (§8)."""
    setting_sources: tuple[str, ...] | None = None
    """`AGENT_SERVER_SETTING_SOURCES`: the only settings files Claude Code loads besides
    the server's (managed settings): some of `user,project,local`, or none when empty;
    None (unset): the CLI's own default, all three (contract §4.8)."""

    @property
    def override_file(self) -> Path:
        """The token override file (contract §3)."""
        return self.state_dir / "oauth-token"

    @classmethod
    def from_environ(cls, environ: Mapping[str, str], *, isatty: bool = False) -> Settings:
        """Parse settings from an environment mapping; raise ConfigError on a bad value.

        `isatty` says whether stderr is a terminal (it picks the default log format).
        """
        home = Path(environ.get("HOME") or Path.home())
        raw_user = environ.get(SPAWN_USER_VARIABLE, "").strip()
        spawn_user = resolve_spawn_user(raw_user) if raw_user else None
        # `~` of the agent's files (its workdir and .env) is the spawn user's home.
        agent_home = spawn_user.home if spawn_user is not None else home
        runtime_raw = environ.get("AGENT_RUNTIME", "claude-code")
        runtime = RUNTIME_NAMES.get(runtime_raw.strip().lower())
        if runtime is None:
            msg = (
                f"AGENT_RUNTIME={runtime_raw!r} is not a known runtime "
                f"(expected one of: {', '.join(sorted(RUNTIME_NAMES))})"
            )
            raise ConfigError(msg)
        state_home = environ.get("XDG_STATE_HOME") or str(home / ".local" / "state")
        token = environ.get("TRINITY_AGENT_AUTH_TOKEN", "").strip()
        callback_key = environ.get("TRINITY_MCP_API_KEY", "").strip()
        return cls(
            agent_name=environ.get("AGENT_NAME") or socket.gethostname(),
            runtime=runtime,
            runtime_command=environ.get("AGENT_SERVER_RUNTIME_COMMAND")
            or adapter_for(runtime).default_command,
            host=environ.get("AGENT_SERVER_HOST", "127.0.0.1"),
            port=_integer(environ, "AGENT_SERVER_PORT", 8000, minimum=0, maximum=65535),
            state_dir=Path(
                environ.get("AGENT_SERVER_STATE_DIR") or Path(state_home) / "agent-server"
            ),
            env_file=Path(environ.get("AGENT_SERVER_ENV_FILE") or agent_home / ".env"),
            workdir=Path(environ.get("AGENT_SERVER_WORKDIR") or agent_home),
            permission_mode=environ.get("AGENT_SERVER_PERMISSION_MODE", BYPASS_PERMISSIONS),
            max_parallel=_integer(environ, "AGENT_SERVER_MAX_PARALLEL", 32, minimum=1),
            shutdown_grace_s=_number(environ, "AGENT_SERVER_SHUTDOWN_GRACE_S", 30.0),
            max_log_bytes=_integer(environ, "AGENT_SERVER_MAX_LOG_BYTES", 8 * 1024 * 1024),
            log_format=_log_format(environ, isatty=isatty),
            auth_token=SecretStr(token) if token else None,
            insecure_no_auth=_flag(environ, "AGENT_SERVER_INSECURE_NO_AUTH"),
            callback_url=_backend_url(environ),
            callback_key=SecretStr(callback_key) if callback_key else None,
            baseline_env={**environ, **(spawn_user.environ() if spawn_user else {})},
            spawn_user=spawn_user,
            broker=_flag(environ, "AGENT_SERVER_BROKER", default=True),
            heartbeat_interval_s=_number(
                environ,
                "AGENT_SERVER_HEARTBEAT_INTERVAL_S",
                HEARTBEAT_INTERVAL_S,
                bounds=(MIN_HEARTBEAT_INTERVAL_S, MAX_HEARTBEAT_INTERVAL_S),
            ),
            setting_sources=_setting_sources(environ),
        )

    @classmethod
    def from_env(cls) -> Settings:
        """Parse settings from this process's environment (and whether stderr is a tty)."""
        return cls.from_environ(os.environ, isatty=sys.stderr.isatty())


SETTING_SOURCES = ("user", "project", "local")
"""Claude Code's settings files that `--setting-sources` chooses among."""


def _setting_sources(environ: Mapping[str, str]) -> tuple[str, ...] | None:
    """A comma-separated subset of `SETTING_SOURCES` (empty: none), or None when unset."""
    raw = environ.get("AGENT_SERVER_SETTING_SOURCES")
    if raw is None:
        return None
    sources = tuple(part.strip() for part in raw.split(",") if part.strip())
    if unknown := [part for part in sources if part not in SETTING_SOURCES]:
        msg = (
            f"AGENT_SERVER_SETTING_SOURCES={raw!r} names {', '.join(map(repr, unknown))}: "
            f"it takes some of {','.join(SETTING_SOURCES)}, or nothing"
        )
        raise ConfigError(msg)
    return tuple(dict.fromkeys(sources))


def _backend_url(environ: Mapping[str, str]) -> str | None:
    """An http(s) URL with a host and nothing a URL of ours could not extend."""
    raw = environ.get("TRINITY_BACKEND_URL", "").strip()
    if not raw:
        return None
    parts = urlsplit(raw)
    if (
        parts.scheme not in ("http", "https")
        or not parts.hostname
        or parts.username is not None
        or parts.query
        or parts.fragment
        or any(c.isspace() or ord(c) < 32 for c in raw)
    ):
        msg = (
            f"TRINITY_BACKEND_URL={raw!r} is not an http:// or https:// URL with a host "
            "(and no credentials, query or fragment)"
        )
        raise ConfigError(msg)
    return raw.rstrip("/")


def _integer(
    environ: Mapping[str, str],
    name: str,
    default: int,
    *,
    minimum: int = 0,
    maximum: int | None = None,
) -> int:
    raw = environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = int(raw.strip())
    except ValueError:
        value = None
    if value is None or value < minimum or (maximum is not None and value > maximum):
        bounds = f">= {minimum}" if maximum is None else f"in {minimum}..{maximum}"
        msg = f"{name}={raw!r} is not an integer {bounds}"
        raise ConfigError(msg)
    return value


def _number(
    environ: Mapping[str, str],
    name: str,
    default: float,
    *,
    bounds: tuple[float, float] | None = None,
) -> float:
    raw = environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = float(raw.strip())
    except ValueError:
        value = -1.0
    if not value >= 0 or value == float("inf"):
        msg = f"{name}={raw!r} is not a non-negative number of seconds"
        raise ConfigError(msg)
    if bounds is not None and not bounds[0] <= value <= bounds[1]:
        msg = f"{name}={raw!r} is not a number of seconds in {bounds[0]:g}..{bounds[1]:g}"
        raise ConfigError(msg)
    return value


def _log_format(environ: Mapping[str, str], *, isatty: bool) -> str:
    raw = environ.get("AGENT_SERVER_LOG_FORMAT")
    try:
        return choose_log_format(raw, isatty=isatty)
    except ValueError:
        msg = f"AGENT_SERVER_LOG_FORMAT={raw!r} is not a log format (use json or text)"
        raise ConfigError(msg) from None


def _flag(environ: Mapping[str, str], name: str, *, default: bool = False) -> bool:
    raw = environ.get(name, "").strip().lower()
    if not raw:
        return default
    if raw in ("0", "false", "no"):
        return False
    if raw in ("1", "true", "yes"):
        return True
    msg = f"{name}={raw!r} is not a boolean (use 1 or 0)"
    raise ConfigError(msg)
