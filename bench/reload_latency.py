"""Figure 3: reload-token latency idle vs while 32 turns stream output.

Reloads are sequential on their own connection and alternate between two tokens,
so every one changes the credential (file write, fsync, rename, state swap) while
the redactor's set of secrets stays the same size. Under load, 32 turns each print
an assistant event of about 2 KiB every 10 ms (32 x 200 KiB/s, 3,200 lines/s for the
server to split, parse and keep); reloads are measured only while all 32 run.

Each reload is followed by a `GET /health` on the same connection, timed apart: the
floor, what the load adds to any request (the wake-ups, the wait behind the turns'
output, the machine's scheduling) apart from what a reload does itself.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Mapping

from bench.client import Answer, LoopbackClient
from bench.plan import Plan
from bench.report import Figure, at_most, median, percentile
from bench.server import BenchServer, Workspace
from bench.turn_overhead import server_turn

TARGET_P99_RATIO = 2.0
MIN_RELOADS = 50
PARALLEL = 32
LINE_BYTES = 2048
INTERVAL_S = 0.01
TOKENS = ("sk-ant-oat01-bench-rotation-aaaaaaaaaaaa", "sk-ant-oat01-bench-rotation-bbbbbbbbbbbb")
_RUNNING_TIMEOUT_S = 15.0


async def _reloads(
    client: LoopbackClient, count: int, until: float
) -> tuple[list[float], list[float]]:
    """Up to `count` sequential reloads, each followed by a health check, before the
    monotonic instant `until`: the seconds of each, reloads first."""
    took: list[float] = []
    health: list[float] = []
    while len(took) < count and time.monotonic() < until:
        token = TOKENS[len(took) % 2]
        reload = client.post("/api/credentials/reload-token", {"token": token})
        took.append(await _timed(reload, "reload-token"))
        health.append(await _timed(client.get("/health"), "health"))
    return took, health


async def _timed(request: Awaitable[Answer], what: str) -> float:
    """Seconds `request` took to answer; it must answer 200."""
    started = time.perf_counter()
    answer = await request
    took = time.perf_counter() - started
    if answer.status != 200:
        msg = f"{what} failed: {answer.status} {answer.body[:300]!r}"
        raise RuntimeError(msg)
    return took


async def _wait_running(client: LoopbackClient, count: int) -> None:
    deadline = time.monotonic() + _RUNNING_TIMEOUT_S
    while time.monotonic() < deadline:
        answer = await client.get("/api/executions/running")
        if len(answer.json()["executions"]) >= count:
            return
        await asyncio.sleep(0.05)
    msg = f"{count} turns never ran at once"
    raise RuntimeError(msg)


async def measure(
    workspace: Workspace,
    plan: Plan,
    *,
    figure: str = "3",
    server_env: Mapping[str, str] | None = None,
    directive: str = "@stream",
) -> list[Figure]:
    """p50/p99 of reload-token idle and under 32 streaming turns (`directive` streams:
    `@stream` prints, `@stream-api` streams from the API through the broker too)."""
    env = {"AGENT_SERVER_MAX_PARALLEL": str(PARALLEL), **(server_env or {})}
    with BenchServer(workspace, env) as server:
        async with server.client(4) as control, server.client(PARALLEL) as turns_client:
            await _reloads(control, 5, time.monotonic() + 10)  # warm: imports, connection
            idle, idle_health = await _reloads(control, plan.reloads, time.monotonic() + 30)
            prompt = f"{directive} {plan.stream_s} {LINE_BYTES} {INTERVAL_S}"
            streaming_from = time.monotonic()
            turns = [
                asyncio.ensure_future(server_turn(turns_client, prompt, plan.stream_s + 60))
                for _ in range(PARALLEL)
            ]
            try:
                await _wait_running(control, PARALLEL)
                # Stop a second before the first turn may end: only full load counts.
                until = streaming_from + plan.stream_s - 1.0
                loaded, loaded_health = await _reloads(control, plan.reloads, until)
                answers = await asyncio.wait_for(asyncio.gather(*turns), plan.stream_s + 60)
            finally:
                for turn in turns:
                    turn.cancel()
    idle_p99, loaded_p99 = percentile(idle, 0.99), percentile(loaded, 0.99)
    ratio = loaded_p99 / idle_p99
    health_idle_p99, health_loaded_p99 = (
        percentile(idle_health, 0.99),
        percentile(loaded_health, 0.99),
    )
    enough = plan.quick or len(loaded) >= MIN_RELOADS
    details = {
        "idle_n": len(idle),
        "idle_p50_ms": median(idle) * 1000,
        "idle_p99_ms": idle_p99 * 1000,
        "loaded_n": len(loaded),
        "loaded_p50_ms": median(loaded) * 1000,
        "loaded_p99_ms": loaded_p99 * 1000,
        "health_idle_p50_ms": median(idle_health) * 1000,
        "health_idle_p99_ms": health_idle_p99 * 1000,
        "health_loaded_p50_ms": median(loaded_health) * 1000,
        "health_loaded_p99_ms": health_loaded_p99 * 1000,
        "turn_response_bytes_total": sum(len(a.body) for a in answers),
    }
    return [
        Figure(
            f"{figure} reload-token p99 idle",
            idle_p99 * 1000,
            "ms",
            note=f"p50 {median(idle) * 1000:.2f} ms, n={len(idle)}",
        ),
        Figure(
            f"{figure} reload-token p99 under {PARALLEL} streaming turns",
            loaded_p99 * 1000,
            "ms",
            note=f"p50 {median(loaded) * 1000:.2f} ms, n={len(loaded)}",
        ),
        Figure(
            f"{figure} reload-token p99: loaded / idle",
            ratio,
            "x",
            target=f"<= {TARGET_P99_RATIO:g}x",
            verdict=at_most(ratio, TARGET_P99_RATIO) if enough else "FAIL",
            target_value=TARGET_P99_RATIO,
            note="" if enough else f"only {len(loaded)} reloads under load",
            details=details,
        ),
        Figure(
            f"{figure} GET /health p99: loaded / idle (the floor)",
            health_loaded_p99 / health_idle_p99,
            "x",
            note=(
                f"p99 {health_idle_p99 * 1000:.2f} -> {health_loaded_p99 * 1000:.2f} ms, "
                "what the load adds to any request"
            ),
        ),
    ]
