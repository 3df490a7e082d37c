"""`agent-server pool walk|status|stop|assign|clear`: the walk and the operator's hands.

    agent-server pool walk --pool pool.toml --store sqlite:////var/lib/ctl/pool.db \\
        --agent-url http://agent-1:8000 --agent-token-file /run/secrets/agent-1 \\
        --agent-name agent-1 --message "fix the failing test" [--interactive] [--json]
    agent-server pool status --pool pool.toml --store redis://localhost:6379/0 [--json]
    agent-server pool stop --pool pool.toml --store … --agent-name agent-1
    agent-server pool assign --pool pool.toml --store … --agent-name agent-1 \\
        --credential sub-b --agent-url … --agent-token-file …
    agent-server pool clear --pool pool.toml --store … --credential sub-a
    agent-server pool serve --pool pool.toml --store redis://localhost:6379/0 \\
        --listen 127.0.0.1:8700 --token-file /run/secrets/pool-serve

Exit codes: 0 served (or done), 1 the turn failed otherwise (or the server refused),
2 the pool file, the store or the token cannot be used, 3 the agent waits for
capacity, 4 the walk was stopped. stdout is the result (`--json`: one object);
stderr carries the walk's events (`--events-json`: one JSON object a line) and one
line on an error, never a library's chatter. `serve` runs until SIGTERM or SIGINT, shuts
down gracefully, and then ends by that signal, as uvicorn does (docs/pool-service.md).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from pydantic import SecretStr, ValidationError

from agent_server.controller.client import AgentClient
from agent_server.controller.clock import utc_now
from agent_server.controller.errors import ControllerError, PoolFileError, StoreError
from agent_server.controller.events import WalkEvent, logger
from agent_server.controller.pool.file import AGENT_NAME, Pool, load_pool
from agent_server.controller.pool.status import pool_rows, pool_status, render_table
from agent_server.controller.result import WalkResult
from agent_server.controller.service.instance import DRAIN_S, TICK_S
from agent_server.controller.stores.base import PoolStore, default_store_url, open_store
from agent_server.controller.turn import WalkTurn
from agent_server.controller.walker import Walker
from agent_server.wire.values import secret_problem

EXIT_SERVED, EXIT_FAILED, EXIT_UNUSABLE, EXIT_WAITING, EXIT_STOPPED = 0, 1, 2, 3, 4
_BY_OUTCOME = {"served": EXIT_SERVED, "waiting_for_capacity": EXIT_WAITING, "stopped": EXIT_STOPPED}


def main(argv: list[str]) -> int:
    """`agent-server pool …` (the server's entry point hands the rest of argv here)."""
    args = _parser().parse_args(argv)
    _quiet_libraries(getattr(args, "events_json", False))
    try:
        return asyncio.run(_COMMANDS[args.command](args))
    except (PoolFileError, StoreError) as exc:
        print(f"agent-server pool: {exc}", file=sys.stderr)
        return EXIT_UNUSABLE
    except ControllerError as exc:
        print(f"agent-server pool: {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_FAILED


def _quiet_libraries(events_json: bool) -> None:
    """The walk's events on stderr; nothing of httpx's or any other library's below a
    warning (their INFO lines are no operator's business)."""
    logging.basicConfig(level=logging.WARNING, format="%(message)s", stream=sys.stderr)
    logger.setLevel(logging.WARNING if events_json else logging.INFO)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="agent-server pool", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    walk = commands.add_parser("walk", help="run one turn through the walk")
    status = commands.add_parser("status", help="show the pool, its assignments and waits")
    stop = commands.add_parser("stop", help="cancel an agent's waiting turns and walks")
    assign = commands.add_parser("assign", help="assign an agent a subscription by hand")
    clear = commands.add_parser("clear", help="forget a credential's failures (rotated token)")
    for command in (walk, status, stop, assign, clear):
        command.add_argument("--pool", type=Path, required=True, help="the pool file (TOML)")
        command.add_argument(
            "--store",
            default=None,
            help="sqlite:///PATH or redis://HOST:PORT/DB (default: a file under the state dir)",
        )
        command.add_argument("--json", action="store_true", help="print JSON")
        command.add_argument(
            "--events-json", action="store_true", help="the events on stderr as JSON lines"
        )
    for command in (walk, stop, assign):
        command.add_argument("--agent-name", required=True, help="the agent")
    for command in (walk, assign):
        command.add_argument("--agent-url", required=True, help="the agent-server's base URL")
        command.add_argument(
            "--agent-token-file", type=Path, required=True, help="its controller token"
        )
    for command in (assign, clear):
        command.add_argument("--credential", required=True, help="the credential's id")
    _serve_parser(commands)
    walk.add_argument("--message", required=True, help="the prompt")
    walk.add_argument(
        "--interactive", action="store_true", help="a person waits: any skipped subscription"
    )
    walk.add_argument("--timeout", type=float, default=900.0, help="the whole walk's seconds")
    walk.add_argument("--execution-id", default=None, help="the turn's id (default: generated)")
    walk.add_argument(
        "--rerun",
        action="store_true",
        help="the turn (--execution-id) may have run: read a served one back, not again",
    )
    return parser


def _serve_parser(commands: Any) -> None:
    serve = commands.add_parser("serve", help="run the pool as a service (HTTP API, page)")
    serve.add_argument("--pool", type=Path, required=True, help="the pool file (TOML)")
    serve.add_argument("--store", default=None, help="as for walk (redis:// for several)")
    serve.add_argument("--listen", required=True, help="HOST:PORT to listen on")
    serve.add_argument(
        "--token-file", type=Path, required=True, help="the bearer token callers present"
    )
    serve.add_argument(
        "--tick", type=float, default=TICK_S, help="seconds between sweeps of the store"
    )
    serve.add_argument(
        "--drain", type=float, default=DRAIN_S, help="seconds running walks get at shutdown"
    )


def _read_token(path: Path, what: str = "agent token") -> SecretStr:
    try:
        value = path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        msg = f"the {what} file {path} cannot be read ({type(exc).__name__})"
        raise PoolFileError(msg) from exc
    problem = secret_problem(value)
    if problem is not None:
        msg = f"the {what} in {path} {problem}"
        raise PoolFileError(msg)
    return SecretStr(value)


def _listen(value: str) -> tuple[str, int]:
    host, _, port = value.rpartition(":")
    if not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        msg = "--listen must be HOST:PORT"
        raise PoolFileError(msg)
    return host.strip("[]"), int(port)


def _service_server(config: Any, on_signal: Callable[[], None]) -> Any:
    """uvicorn's server that, on the signal, first refuses new turns and ends the event
    streams (an open stream would hold the shutdown for the whole drain)."""
    import uvicorn

    loop = asyncio.get_running_loop()

    class ServiceServer(uvicorn.Server):
        def handle_exit(self, sig: int, frame: Any) -> None:
            loop.call_soon_threadsafe(on_signal)
            super().handle_exit(sig, frame)

    return ServiceServer(config)


async def _serve(args: argparse.Namespace) -> int:
    """Run the service until a signal (uvicorn handles SIGTERM/SIGINT: graceful)."""
    import uvicorn  # the service's own: the one-shot commands never load it

    from agent_server.controller.service import ServiceConfig, create_app

    host, port = _listen(args.listen)
    token = _read_token(args.token_file, "service token")
    pool = load_pool(args.pool)
    store = await open_store(args.store or default_store_url())
    try:
        app = create_app(ServiceConfig(pool, store, tick_s=args.tick, drain_s=args.drain), token)
        config = uvicorn.Config(
            app,
            host=host,
            port=port,
            log_level="warning",
            access_log=False,
            timeout_graceful_shutdown=max(1, int(args.drain)),
        )
        server = _service_server(config, app.state.instance.begin_shutdown)
        await server.serve()
        return EXIT_SERVED if server.started else EXIT_UNUSABLE
    finally:
        await store.close()


def _hook(args: argparse.Namespace) -> Callable[[WalkEvent], None] | None:
    if not args.events_json:
        return None
    return lambda event: print(json.dumps(event.as_json()), file=sys.stderr, flush=True)


async def _with_walker(
    args: argparse.Namespace, act: Callable[[Walker, PoolStore, Pool], Any]
) -> Any:
    """Open the pool, the store and (for walk and assign) the agent's client, then `act`."""
    name = getattr(args, "agent_name", None)
    if name is not None and not AGENT_NAME.fullmatch(name):
        msg = f"--agent-name must match {AGENT_NAME.pattern}"
        raise PoolFileError(msg)
    pool = load_pool(args.pool)
    token = _read_token(args.agent_token_file) if hasattr(args, "agent_url") else None
    store = await open_store(args.store or default_store_url())
    client = AgentClient(args.agent_url, token) if token is not None else None
    try:
        await store.register_credentials(pool.infos)
        clients = {name: client} if client is not None and name is not None else {}
        walker = Walker(clients, store, pool, hook=_hook(args))
        return await act(walker, store, pool)
    finally:
        if client is not None:
            await client.aclose()
        await store.close()


async def _walk(args: argparse.Namespace) -> int:
    turn = WalkTurn(
        agent=args.agent_name,
        message=args.message,
        interactive=args.interactive,
        execution_id=args.execution_id,
        timeout_s=args.timeout,
        rerun=args.rerun,
    )
    result: WalkResult = await _with_walker(
        args, lambda walker, store, _: _kept(walker, store, turn)
    )
    print(json.dumps(result.as_json(), indent=2) if args.json else _summary(result))
    return _BY_OUTCOME.get(result.outcome, EXIT_FAILED)


async def _kept(walker: Walker, store: PoolStore, turn: WalkTurn) -> WalkResult:
    """Walk `turn`; one that waits keeps its request beside its retry, so a `pool serve`
    on the same store runs it when it is due (nothing else would)."""
    from agent_server.controller.service.turns import TurnRequest, keep_request

    result = await walker.walk(turn)
    if result.retry is None:
        return result
    try:
        request = TurnRequest(
            message=turn.message, interactive=turn.interactive, timeout_s=turn.timeout_s
        )
    except ValidationError:
        return result  # a message or timeout past the service's bounds: the caller's to run
    kept = keep_request(result.retry, request)
    await store.schedule_retry(kept)
    return replace(result, retry=kept)


def _summary(result: WalkResult) -> str:
    lines = [f"{result.outcome}: {result.trail_text() or 'no attempt'}"]
    if result.served_by:
        lines.append(f"served by {result.served_by}, committed: {result.committed}")
    if result.retry:
        lines.append(f"retry at {result.as_json()['retry_at']} (turn {result.retry.turn_ref})")
    if result.answer:
        lines += ["", result.answer.response]
    elif result.error:
        lines.append(f"error: {result.error.message}")
    return "\n".join(lines)


async def _status(args: argparse.Namespace) -> int:
    pool = load_pool(args.pool)
    store = await open_store(args.store or default_store_url())
    try:
        snapshot = await store.snapshot()
    finally:
        await store.close()
    now = utc_now()
    if args.json:
        print(json.dumps(pool_status(pool.infos, snapshot, now), indent=2))
    else:
        print(render_table(pool_rows(pool.infos, snapshot, now), snapshot))
    return EXIT_SERVED


async def _stop(args: argparse.Namespace) -> int:
    stopped = await _with_walker(args, lambda walker, *_: walker.stop(args.agent_name))
    _done(args, {"agent": args.agent_name, "cancelled_turns": stopped})
    return EXIT_SERVED


async def _assign(args: argparse.Namespace) -> int:
    made = await _with_walker(
        args, lambda walker, *_: walker.assign(args.agent_name, args.credential)
    )
    _done(
        args, {"agent": made.agent, "credential": made.credential_id, "generation": made.generation}
    )
    return EXIT_SERVED


async def _clear(args: argparse.Namespace) -> int:
    await _with_walker(args, lambda walker, *_: walker.clear(args.credential))
    _done(args, {"credential": args.credential, "cleared": True})
    return EXIT_SERVED


def _done(args: argparse.Namespace, said: dict[str, Any]) -> None:
    print(json.dumps(said) if args.json else ", ".join(f"{k}: {v}" for k, v in said.items()))


_COMMANDS = {
    "walk": _walk,
    "status": _status,
    "stop": _stop,
    "assign": _assign,
    "clear": _clear,
    "serve": _serve,
}
