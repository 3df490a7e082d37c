"""`agent-server [serve|status|pool]`: serve the API (default), print the credential
status, or drive a pool of credentials (`pool walk|status|stop|assign|clear`, the
controller library)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import json
import logging
import math
import os
import sys
from collections.abc import Iterator
from types import FrameType

import uvicorn
from starlette.types import ASGIApp

from agent_server.client_limits import ClientLimits, guarded_protocol
from agent_server.config import Settings
from agent_server.errors import ConfigError
from agent_server.execution.registry import Registry
from agent_server.logs import choose_log_format
from agent_server.process.group import forbid_dumps
from agent_server.process.spawn_user import check_can_switch
from agent_server.process.timings import server_shutdown_timeout
from agent_server.wire.credentials import CredentialStatus, DriftRow
from agent_server.wire.names import CONTROLLER_TOKEN

_M_ARENA_MAX = -8
"""`mallopt`'s parameter for the most arenas (glibc's malloc.h)."""


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `agent-server` console script."""
    given = sys.argv[1:] if argv is None else argv
    if given[:1] == ["pool"]:
        # The controller's command line: imported only when asked for (the server never is).
        from agent_server.controller.cli import main as pool_main

        return pool_main(given[1:])
    parser = argparse.ArgumentParser(prog="agent-server", description=__doc__)
    parser.add_argument(
        "command",
        nargs="?",
        default="serve",
        choices=["serve", "status", "pool"],
        help="serve (the default), status, or pool: the controller's walk|status|stop|"
        "assign|clear (agent-server pool --help)",
    )
    parser.add_argument(
        "--json", action="store_true", help="status: print the JSON of GET /api/credentials/status"
    )
    args = parser.parse_args(given)
    if args.command == "serve":
        return serve()
    try:
        settings = Settings.from_env()
    except ConfigError as exc:
        print(f"agent-server: {exc}", file=sys.stderr)
        return 2
    return _status(settings, as_json=args.json)


def _one_malloc_arena() -> None:
    """Every thread allocates from the one heap (glibc's `M_ARENA_MAX` = 1).

    The server's threads (a large answer made aside, records written, the broker's
    loop) run one at a time under the GIL, so arenas of their own buy no speed; each
    would keep what it freed as its own, and a large answer made on a worker thread
    held about 13 MiB more at its peak (docs/benchmarks.md, figure 4). A C library
    without `mallopt` (not glibc) keeps its own policy."""
    mallopt = getattr(ctypes.CDLL(None), "mallopt", None)
    if mallopt is not None:
        mallopt(_M_ARENA_MAX, 1)


def serve(client_limits: ClientLimits | None = None) -> int:
    """Serve until SIGTERM/SIGINT; `client_limits` replaces the slow-client limits (tests)."""
    from agent_server.app import create_app
    from agent_server.logs import configure_logging, lean_records
    from agent_server.redaction.redactor import Redactor
    from agent_server.services import Services

    lean_records()
    _one_malloc_arena()
    # Before anything: the agent runs as this user and must not read our memory or
    # environment, which hold the controller token (contract §10).
    forbid_dumps()
    # Logging first: even a refused setting or a boot crash is one log line (contract §8),
    # in the format asked for when that setting is the one that is wrong.
    redactor = Redactor()
    configure_logging(redactor, log_format=_early_log_format())
    logger = logging.getLogger("agent_server")
    try:
        settings = Settings.from_env()
    except ConfigError as exc:
        logger.error("agent-server: %s", exc)
        return 2
    configure_logging(redactor, log_format=settings.log_format)
    try:
        _announce_isolation(settings, logger)
    except ConfigError as exc:
        logger.error("agent-server: %s", exc)
        return 2
    # Settings hold it now: no later reader of os.environ (nor a child) gets it.
    os.environ.pop(CONTROLLER_TOKEN, None)
    try:
        services = Services.build(settings, redactor)
    except Exception:
        logger.exception("agent-server could not start")
        return 1
    app = create_app(settings, services)
    limits = client_limits or ClientLimits.for_max_parallel(settings.max_parallel)
    config = uvicorn_config(app, settings, limits)
    _DrainingServer(config, services.registry, settings.shutdown_grace_s).run()
    return 0


def _announce_isolation(settings: Settings, logger: logging.Logger) -> None:
    """Refuse a spawn user this server cannot become (ConfigError); say what same-uid
    mode leaves open (contract §10)."""
    if settings.spawn_user is not None:
        check_can_switch(settings.spawn_user)
        logger.info(
            "turns run as %s (uid %d): the agent cannot reach the server, its state dir or "
            "its memory",
            settings.spawn_user.name,
            settings.spawn_user.uid,
        )
        return
    logger.warning(
        "AGENT_SERVER_SPAWN_USER is not set: turns run as the server's own user, so the "
        "agent can signal the server and read and write its state dir (the rotated "
        "token, retained and pending results, a generated controller token); set it to "
        "separate them (contract §10)"
    )


def uvicorn_config(app: ASGIApp, settings: Settings, limits: ClientLimits) -> uvicorn.Config:
    """How uvicorn serves `app`: httptools with the slow-client guard, and the shutdown deadline."""
    return uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_config=None,
        # Header and body deadlines and the connection cap (contract §8, Slow clients).
        http=guarded_protocol(limits),
        # No route is a WebSocket: an upgrade must never leave the guard's deadlines.
        ws="none",
        # Never uvloop, which uvicorn's "auto" picks wherever it is installed: it keeps
        # SIGCHLD for itself and refuses the reaper's handler, so the server would not
        # start (and it has no pidfd watcher to gain from).
        loop="asyncio",
        # The agent shares the loopback uvicorn trusts by default: an X-Forwarded-For it
        # sends must not stand in for the caller's address in the access log.
        proxy_headers=False,
        # uvicorn's own deadline only backs up the drain: SIGKILL escalation and answers.
        timeout_graceful_shutdown=math.ceil(server_shutdown_timeout(settings.shutdown_grace_s)),
    )


def _early_log_format() -> str:
    """The log format before settings are read: a bad value falls back to the default."""
    isatty = sys.stderr.isatty()
    try:
        return choose_log_format(os.environ.get("AGENT_SERVER_LOG_FORMAT"), isatty=isatty)
    except ValueError:
        return choose_log_format(None, isatty=isatty)


class _DrainingServer(uvicorn.Server):
    """uvicorn, but running turns start their shutdown grace at the first SIGTERM/SIGINT.

    uvicorn alone waits its whole graceful timeout, then drops the requests; draining
    from the signal kills late turns' process groups at the grace, and each of them
    still answers 504 `killed`.
    """

    def __init__(self, config: uvicorn.Config, registry: Registry, grace_s: float) -> None:
        super().__init__(config)
        self._registry = registry
        self._grace_s = grace_s
        self._drain: asyncio.Future[None] | None = None

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        """uvicorn's, with the logs written before it re-raises the signal that stopped it.

        uvicorn ends a signalled server by raising that signal again, which ends the
        process at once: the records the event loop still holds (its last lines,
        `Finished server process`) are written first.
        """
        with super().capture_signals():
            try:
                yield
            finally:
                for handler in logging.getLogger().handlers:
                    handler.flush()

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        """Stop accepting (uvicorn) and start the running turns' grace (ours)."""
        super().handle_exit(sig, frame)
        if self._drain is None:
            asyncio.get_running_loop().call_soon_threadsafe(self._start_drain)

    def _start_drain(self) -> None:
        if self._drain is None:
            self._drain = asyncio.ensure_future(self._registry.drain(self._grace_s))


def _status(settings: Settings, *, as_json: bool) -> int:
    from agent_server.credentials.status import credential_status
    from agent_server.logs import configure_logging
    from agent_server.redaction.redactor import Redactor
    from agent_server.services import Services

    redactor = Redactor()
    # Only problems reach stderr (redacted); stdout is the status itself.
    configure_logging(redactor, logging.WARNING, settings.log_format)
    services = Services.build(settings, redactor, serving=False)
    status = credential_status(
        services.store,
        asyncio.run(services.spawn_envs.read_dotenv()),
        agent_name=settings.agent_name,
        runtime=settings.runtime,
        env_file=settings.env_file,
        env_file_problem=services.spawn_envs.dotenv.problem,
    )
    if as_json:
        print(json.dumps(status.model_dump(), indent=2))
    else:
        print(format_status(status))
    return 0


def format_status(status: CredentialStatus) -> str:
    """The credential status as a few lines an operator reads in `docker exec`."""
    lines = [
        f"agent {status.agent_name} ({status.runtime}), generation {status.generation}, "
        f"auth mode {status.auth_mode}"
    ]
    auth = status.effective_auth
    if auth is None:
        lines.append("effective credential: none (the CLI falls back to its own login, if any)")
    else:
        lines.append(
            f"effective credential: {auth.variable} ({auth.layer}, {auth.fingerprint or '-'})"
        )
        if auth.conflicts:
            lines.append(f"also in the spawn env: {', '.join(auth.conflicts)}")
    unset = [row.key for row in status.env_drift if row.suppressed_for_spawn]
    guard = "armed" if status.guard_armed else "not armed"
    lines.append(f"guard: {guard}" + (f"; unset for spawns: {', '.join(unset)}" if unset else ""))
    remover = "the guard" if status.guard_armed else "a credential override"
    for row in status.env_drift:
        if row.in_file and row.suppressed_for_spawn:
            lines.append(f"shadowed: {row.key} in .env is suppressed by {remover}")
        elif row.in_file and row.overridden_for_spawn:
            lines.append(f"shadowed: {row.key} in .env is replaced by the override")
    override = status.files.override_file
    lines.append(
        f"override file: {override.mode} {override.size} bytes"
        + (f" (not used: {override.problem})" if override.problem else "")
        if override.exists
        else "override file: none"
    )
    problem = status.files.env_file_problem
    lines.append(f".env: {status.files.env_file}" + (f" ({problem})" if problem else ""))
    # A name that is nowhere but in the unset list above says nothing more in the table.
    present = [r for r in status.env_drift if r.in_file or r.in_process_env or r.spawn_source]
    if present:
        lines.append("")
        lines.extend(_drift_table(present))
    return "\n".join(lines)


def _drift_table(rows: list[DriftRow]) -> list[str]:
    """Names only: where each variable is, and where the spawn takes it from."""
    header = ("KEY", ".ENV", "PROCESS", "EQUAL", "SPAWN")
    table = [header]
    for row in rows:
        spawn = "unset" if row.suppressed_for_spawn else row.spawn_source or "-"
        equal = "-" if row.equal is None else ("yes" if row.equal else "no")
        table.append((row.key, _yes(row.in_file), _yes(row.in_process_env), equal, spawn))
    widths = [max(len(cells[i]) for cells in table) for i in range(len(header))]
    return [
        "  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip()
        for cells in table
    ]


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"


if __name__ == "__main__":
    sys.exit(main())
