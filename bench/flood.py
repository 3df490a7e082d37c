"""Figure 9: one turn floods stdout; the server stays responsive, bounded, and stoppable.

For each flood (empty lines, one-byte lines, 16 MiB lines; bench/standin_cli.py
`@flood`), a fresh server runs one turn that prints as fast as the pipe takes it for
`Plan.flood_s`, while the bench asks `GET /health` every 10 ms and samples the
server's RSS: the figures are `/health`'s p99 and the RSS peak over the idle RSS.
Then a second flooding turn is started and the server is sent SIGTERM mid-flood:
the figure is how long it takes to exit, against the grace plus the 13 s margin a
container's stop timeout must give (contract §8).
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time

from agent_server.process.timings import STOP_TIMEOUT_MARGIN_S
from bench.plan import Plan
from bench.report import Figure, percentile
from bench.server import REPO, BenchServer, Workspace

HEALTH_P99_MS = 50.0
RSS_GROWTH_MIB = 64.0
GRACE_S = 1.0
EXIT_LIMIT_S = GRACE_S + STOP_TIMEOUT_MARGIN_S
FLOODS = ("empty", "byte", "wide")
PROBE_EVERY_S = 0.01
SERVER_FROM_TREE = (sys.executable, "-m", "agent_server", "serve")
"""This tree's server (the bench may run from a checkout with no venv of its own)."""


async def _probe(server: BenchServer, turn: asyncio.Task[object]) -> tuple[list[float], int]:
    """`/health` latencies (ms) and the peak RSS (KiB) until `turn` is done."""
    latencies: list[float] = []
    peak = server.rss_kib()
    async with server.client(2) as client:
        while not turn.done():
            started = time.perf_counter()
            answer = await client.get("/health", timeout_s=30)
            latencies.append((time.perf_counter() - started) * 1000)
            if answer.status != 200:
                msg = f"/health answered {answer.status} during the flood"
                raise RuntimeError(msg)
            peak = max(peak, server.rss_kib())
            await asyncio.sleep(PROBE_EVERY_S)
    return latencies, peak


async def _flood_turn(server: BenchServer, kind: str, seconds: float) -> object:
    async with server.client(1) as client:
        body = {"message": f"@flood {kind} {seconds}", "timeout_seconds": int(seconds) + 60}
        answer = await client.post("/api/task", body, timeout_s=seconds + 90)
    return answer.status


async def _one(workspace: Workspace, kind: str, plan: Plan) -> list[Figure]:
    env = {"AGENT_SERVER_SHUTDOWN_GRACE_S": str(GRACE_S), "PYTHONPATH": str(REPO)}
    with BenchServer(workspace, env, command=SERVER_FROM_TREE) as server:
        idle = server.rss_kib()
        turn = asyncio.create_task(_flood_turn(server, kind, plan.flood_s))
        latencies, peak = await _probe(server, turn)
        status = turn.result()
        # A second flood, stopped by SIGTERM halfway.
        second = asyncio.create_task(_flood_turn(server, kind, plan.flood_s * 4))
        await asyncio.sleep(plan.flood_s / 2)
        started = time.perf_counter()
        assert server.process is not None
        os.kill(server.pid, signal.SIGTERM)
        while server.process.poll() is None and time.perf_counter() - started < 60:
            await asyncio.sleep(0.01)
        exit_s = time.perf_counter() - started
        second.cancel()
    p99 = percentile(latencies, 0.99)
    growth = (peak - idle) / 1024
    note = f"{len(latencies)} probes, max {max(latencies):.1f} ms, turn answered {status}"
    return [
        Figure.limited(
            f"9 {kind} lines: /health p99 during a flood",
            p99,
            "ms",
            HEALTH_P99_MS,
            note=note,
            details={"latencies_ms": latencies},
        ),
        Figure.limited(
            f"9 {kind} lines: RSS growth (peak)",
            growth,
            "MiB",
            RSS_GROWTH_MIB,
            note=f"idle {idle / 1024:.1f} MiB, peak {peak / 1024:.1f} MiB",
        ),
        Figure.limited(
            f"9 {kind} lines: SIGTERM mid-flood to exit",
            exit_s,
            "s",
            EXIT_LIMIT_S,
            note=f"grace {GRACE_S:.0f} s + {STOP_TIMEOUT_MARGIN_S:.0f} s",
        ),
    ]


async def measure(workspace: Workspace, plan: Plan) -> list[Figure]:
    """The three floods, each on a fresh server."""
    figures: list[Figure] = []
    for kind in FLOODS:
        figures += await _one(workspace, kind, plan)
    return figures
