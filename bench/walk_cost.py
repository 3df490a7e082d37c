"""Figure 8: what the controller's walk costs beside the turns it sends.

- **its own cost per rung**: whole walks of three rungs and a commit (A refuses with
  a 429, B with a 401, C serves and is committed by reload-token) against answers made
  in-process at once (an httpx `MockTransport` replying the contract's bodies), on the
  default SQLite store in a temp dir. What is left is the walk's own work per rung:
  planning, the client's request and parse, the store's writes (a failure or a
  reading a rung, the commit's compare-and-set), its events. Each walk is a new agent
  and the controller's clock moves 3 h a walk, so every walk climbs all three rungs.
- **rung selection over a 1,000-credential pool**: what the walk does before each
  rung, from a store's snapshot: the pool's view (standing of every credential) and
  the ordered ladder, with a third of the pool measured, a tenth failed and 300
  agents assigned.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
from pydantic import SecretStr

from agent_server.controller.client import AgentClient
from agent_server.controller.pool.file import Pool, PoolCredential
from agent_server.controller.pool.rungs import PoolView, TurnContext, plan_rungs
from agent_server.controller.pool.state import (
    Assignment,
    CredentialInfo,
    Failure,
    PoolSnapshot,
    Reading,
    WindowUse,
)
from agent_server.controller.stores.base import open_store
from agent_server.controller.turn import WalkTurn
from agent_server.controller.walker import Walker
from bench.plan import Plan
from bench.report import Figure

RUNG_TARGET_MS = 2.0
SELECTION_TARGET_MS = 5.0
POOL_SIZE = 1000
_START = datetime(2026, 12, 1, tzinfo=UTC)
_SECRETS = {"a": "bench-sub-a-0123456789", "b": "bench-sub-b-0123456789", "c": "bench-sub-c-01234"}


def _metadata(execution_id: str) -> dict[str, Any]:
    return {
        "execution_id": execution_id,
        "context_window": 200000,
        "auth_route": "oauth_token",
        "generation": 7,
        "rate_limit": {"status": "allowed", "five_hour": {"utilization": 0.4}},
    }


def _answer(request: httpx.Request) -> httpx.Response:
    """What a server would answer, made at once: by the credential the turn carries."""
    if request.url.path == "/api/credentials/reload-token":
        return httpx.Response(
            200,
            json={"changed": True, "generation": 8, "fingerprint": "sha256:x", "env_shadow": []},
        )
    body = json.loads(request.content)
    token = body["auth_override"]["oauth_token"]
    headers = {"X-Trinity-Auth-Override": "oauth_token"}
    if token == _SECRETS["c"]:
        answer = {
            "status": "success",
            "response": "done",
            "execution_log": [],
            "session_id": None,
            "timestamp": _START.isoformat(),
            "metadata": _metadata(body["execution_id"]),
        }
        return httpx.Response(200, json=answer, headers=headers)
    code, status = ("rate_limit", 429) if token == _SECRETS["a"] else ("auth", 503)
    detail = {
        "message": code,
        "error_code": code,
        "retryable": False,
        "switch_credential": True,
        "execution_id": body["execution_id"],
        "auth_route": "oauth_token",
        "api_error_status": status,
        "resets_at": (_START + timedelta(hours=1)).isoformat() if code == "rate_limit" else None,
        "rate_limit_type": "five_hour" if code == "rate_limit" else None,
        "metadata": _metadata(body["execution_id"]),
        "execution_log": [],
    }
    return httpx.Response(status, json={"detail": detail}, headers=headers)


async def _walks(root: Path, rounds: int) -> list[float]:
    """Milliseconds per rung of each walk (three rungs and a commit)."""
    pool = Pool(
        tuple(
            PoolCredential(name, "subscription", SecretStr(secret))
            for name, secret in _SECRETS.items()
        )
    )
    store = await open_store(f"sqlite:///{root}/pool.sqlite3")
    client = AgentClient(
        "http://agent", SecretStr("bench-token"), transport=httpx.MockTransport(_answer)
    )
    moments = iter(_START + timedelta(hours=3 * n) for n in range(rounds * 100))
    now = [next(moments)]
    walker = Walker(lambda _agent: client, store, pool, clock=lambda: now[0])
    per_rung = []
    try:
        for n in range(rounds + 3):
            now[0] = next(moments)
            started = time.perf_counter()
            result = await walker.walk(WalkTurn(f"agent-{n}", "hi", timeout_s=3600))
            elapsed = time.perf_counter() - started
            if result.served_by != "c" or len(result.trail) != 3 or not result.committed:
                msg = f"the bench walk did not climb three rungs: {result.as_json()}"
                raise RuntimeError(msg)
            if n >= 3:  # the first walks warm the caches
                per_rung.append(elapsed * 1000 / 3)
    finally:
        await client.aclose()
        await store.close()
    return per_rung


def _big_pool() -> tuple[tuple[CredentialInfo, ...], PoolSnapshot]:
    infos = tuple(CredentialInfo(f"sub-{n:04d}", "subscription") for n in range(POOL_SIZE))
    now = _START
    readings = {
        info.id: Reading(
            info.id,
            now - timedelta(minutes=n % 200),
            "allowed",
            None,
            WindowUse((n % 97) / 100, now + timedelta(hours=2), "allowed"),
            WindowUse((n % 53) / 100, now + timedelta(days=3), "allowed"),
        )
        for n, info in enumerate(infos)
        if n % 3 == 0
    }
    failures = {
        info.id: {"auth": Failure(info.id, "auth", now - timedelta(minutes=n % 150))}
        for n, info in enumerate(infos)
        if n % 10 == 1
    }
    assignments = {
        f"agent-{n}": Assignment(f"agent-{n}", infos[(n * 7) % POOL_SIZE].id, 1, now)
        for n in range(300)
    }
    snapshot = PoolSnapshot(assignments=assignments, failures=failures, readings=readings)  # type: ignore[arg-type]
    return infos, snapshot


def _selection_ms(rounds: int) -> list[float]:
    infos, snapshot = _big_pool()
    times = []
    for n in range(rounds + 3):
        started = time.perf_counter()
        view = PoolView.of(infos, snapshot, "agent-1")
        rungs = plan_rungs(view, TurnContext(_START, interactive=n % 2 == 0))
        elapsed = time.perf_counter() - started
        if len(rungs) < POOL_SIZE // 2:
            msg = f"the ladder over {POOL_SIZE} credentials has only {len(rungs)} rungs"
            raise RuntimeError(msg)
        if n >= 3:
            times.append(elapsed * 1000)
    return times


def measure(plan: Plan) -> list[Figure]:
    """The walk's own cost per rung, and rung selection over 1,000 credentials."""
    rounds = plan.walk_rounds
    with tempfile.TemporaryDirectory(prefix="agent-server-bench-walk-") as root:
        per_rung = asyncio.run(_walks(Path(root), rounds))
    selection = _selection_ms(rounds)
    return [
        Figure.limited(
            "8 walk: its own cost per rung (3 rungs + commit, SQLite, instant answers)",
            statistics.median(per_rung),
            "ms",
            RUNG_TARGET_MS,
            note=f"median of {len(per_rung)} walks; p90 {_p90(per_rung):.2f} ms",
            details={"per_rung_ms": per_rung},
        ),
        Figure.limited(
            f"8 walk: rung selection over {POOL_SIZE:,} credentials (view + ladder)",
            statistics.median(selection),
            "ms",
            SELECTION_TARGET_MS,
            note=f"median of {len(selection)}; p90 {_p90(selection):.2f} ms",
            details={"selection_ms": selection},
        ),
    ]


def _p90(values: list[float]) -> float:
    return sorted(values)[max(0, int(len(values) * 0.9) - 1)]
