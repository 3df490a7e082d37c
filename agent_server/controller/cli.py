"""`agent-server pool walk|status`: run one turn through the walk, or show the pool.

    agent-server pool walk --pool pool.toml --store sqlite:////var/lib/ctl/pool.db \\
        --agent-url http://agent-1:8000 --agent-token-file /run/secrets/agent-1 \\
        --agent-name agent-1 --message "fix the failing test" [--interactive] [--json]
    agent-server pool status --pool pool.toml --store redis://localhost:6379/0 [--json]

`walk` exits 0 when a credential served, 3 when the agent waits for capacity, 1 when
the turn failed otherwise, 2 when the pool file, the store or the token cannot be
used. The walk's events go to stderr; stdout is the result (`--json`: one object).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
from pathlib import Path

from pydantic import SecretStr

from agent_server.controller.client import AgentClient
from agent_server.controller.clock import utc_now
from agent_server.controller.errors import ControllerError, PoolFileError, StoreError
from agent_server.controller.pool.file import AGENT_NAME, load_pool
from agent_server.controller.pool.status import pool_rows, render_table
from agent_server.controller.result import WalkResult
from agent_server.controller.stores.base import default_store_url, open_store
from agent_server.controller.turn import WalkTurn
from agent_server.controller.walker import Walker
from agent_server.wire.values import secret_problem

EXIT_SERVED, EXIT_FAILED, EXIT_UNUSABLE, EXIT_WAITING = 0, 1, 2, 3


def main(argv: list[str]) -> int:
    """`agent-server pool …` (the server's entry point hands the rest of argv here)."""
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    try:
        if args.command == "walk":
            return asyncio.run(_walk(args))
        return asyncio.run(_status(args))
    except (PoolFileError, StoreError) as exc:
        print(f"agent-server pool: {exc}", file=sys.stderr)
        return EXIT_UNUSABLE
    except ControllerError as exc:
        print(f"agent-server pool: {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_FAILED


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="agent-server pool", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    walk = commands.add_parser("walk", help="run one turn through the walk")
    status = commands.add_parser("status", help="show the pool's credentials")
    for command in (walk, status):
        command.add_argument("--pool", type=Path, required=True, help="the pool file (TOML)")
        command.add_argument(
            "--store",
            default=None,
            help="sqlite:///PATH or redis://HOST:PORT/DB (default: a file under the state dir)",
        )
        command.add_argument("--json", action="store_true", help="print JSON")
    walk.add_argument("--agent-url", required=True, help="the agent-server's base URL")
    walk.add_argument("--agent-token-file", type=Path, required=True, help="its controller token")
    walk.add_argument("--agent-name", required=True, help="the agent the turn belongs to")
    walk.add_argument("--message", required=True, help="the prompt")
    walk.add_argument(
        "--interactive", action="store_true", help="a person waits: any skipped subscription"
    )
    walk.add_argument("--timeout", type=float, default=900.0, help="the whole walk's seconds")
    walk.add_argument("--execution-id", default=None, help="the turn's id (default: generated)")
    return parser


def _read_token(path: Path) -> SecretStr:
    try:
        value = path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        msg = f"the agent token file {path} cannot be read ({type(exc).__name__})"
        raise PoolFileError(msg) from exc
    problem = secret_problem(value)
    if problem is not None:
        msg = f"the agent token in {path} {problem}"
        raise PoolFileError(msg)
    return SecretStr(value)


async def _walk(args: argparse.Namespace) -> int:
    if not AGENT_NAME.fullmatch(args.agent_name):
        msg = f"--agent-name must match {AGENT_NAME.pattern}"
        raise PoolFileError(msg)
    pool = load_pool(args.pool)
    token = _read_token(args.agent_token_file)
    store = await open_store(args.store or default_store_url())
    try:
        async with AgentClient(args.agent_url, token) as client:
            await store.register_credentials(pool.infos)
            walker = Walker({args.agent_name: client}, store, pool)
            turn = WalkTurn(
                agent=args.agent_name,
                message=args.message,
                interactive=args.interactive,
                execution_id=args.execution_id,
                timeout_s=args.timeout,
            )
            result = await walker.walk(turn)
    finally:
        await store.close()
    print(json.dumps(result.as_json(), indent=2) if args.json else _summary(result))
    return {"served": EXIT_SERVED, "waiting_for_capacity": EXIT_WAITING}.get(
        result.outcome, EXIT_FAILED
    )


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
    rows = pool_rows(pool.infos, snapshot, utc_now())
    if args.json:
        print(json.dumps([row.as_json() for row in rows], indent=2))
    else:
        print(render_table(rows, snapshot))
    return EXIT_SERVED
