"""Figure 1: one turn through the server vs a direct spawn of the same stand-in.

Both sides run the same stand-in with the same argv shape, stdin, env and working
directory; the server side adds HTTP, validation, the spawn env, the process-group
runner, stream parsing, classification and the JSON answer. Pairs are interleaved
and their order alternates, so drift on a noisy machine hits both sides alike.
"""

from __future__ import annotations

import time

from bench.client import Answer, LoopbackClient
from bench.plan import Plan
from bench.report import Figure, median, percentile
from bench.server import BenchServer, Workspace, direct_turn

TARGET_RATIO = 1.03
PROMPT = "say ok"
SLOWER_PROMPT = "@sleep 0.1\nsay ok"
"""A stand-in turn of about 130 ms: the order of a Python stand-in CLI's own start-up."""


async def server_turn(client: LoopbackClient, prompt: str, timeout_s: float = 60.0) -> Answer:
    """POST one turn and insist it succeeded."""
    answer = await client.post("/api/task", {"message": prompt}, timeout_s)
    if answer.status != 200:
        msg = f"server turn failed: {answer.status} {answer.body[:300]!r}"
        raise RuntimeError(msg)
    return answer


async def measure(workspace: Workspace, plan: Plan) -> list[Figure]:
    """Figure 1 with the fastest stand-in, and again with a 100 ms slower one.

    The overhead in ms is what the server costs; the ratio depends on how long the
    CLI itself takes, so both are printed.
    """
    fast = await _measure(workspace, plan, PROMPT, "1")
    slower = await _measure(workspace, plan, SLOWER_PROMPT, "1b")
    return fast + slower[:1]


async def _measure(workspace: Workspace, plan: Plan, prompt: str, label: str) -> list[Figure]:
    """Median wall time of a server turn over a direct spawn."""
    server_s: list[float] = []
    direct_s: list[float] = []
    with BenchServer(workspace) as server:
        async with server.client() as client:
            for index in range(plan.warmup_pairs + plan.turn_pairs):
                sides = ("server", "direct") if index % 2 == 0 else ("direct", "server")
                for side in sides:
                    started = time.perf_counter()
                    if side == "server":
                        await server_turn(client, prompt)
                    else:
                        await direct_turn(workspace, prompt)
                    took = time.perf_counter() - started
                    if index >= plan.warmup_pairs:
                        (server_s if side == "server" else direct_s).append(took)
    ratio = median(server_s) / median(direct_s)
    overhead_ms = (median(server_s) - median(direct_s)) * 1000
    pair_ratios = [s / d for s, d in zip(server_s, direct_s, strict=True)]
    details = {
        "n_each": len(server_s),
        "pair_ratio_median": median(pair_ratios),
        "server_median_ms": median(server_s) * 1000,
        "server_s": server_s,
        "direct_s": direct_s,
        "direct_median_ms": median(direct_s) * 1000,
        "server_p90_ms": percentile(server_s, 0.9) * 1000,
        "direct_p90_ms": percentile(direct_s, 0.9) * 1000,
    }
    return [
        Figure.limited(
            f"{label} turn: server / direct spawn (median)",
            ratio,
            "x",
            TARGET_RATIO,
            baseline="1.04x",
            note=(
                f"overhead {overhead_ms:.2f} ms: server {details['server_median_ms']:.1f} ms vs "
                f"direct {details['direct_median_ms']:.1f} ms, n={len(server_s)} each; "
                f"median of pair ratios {details['pair_ratio_median']:.3f}x"
            ),
            details=details,
        ),
        Figure(
            f"{label} turn: server overhead per turn (median)",
            overhead_ms,
            "ms",
            note="HTTP, env, process group, parse, answer; CLI-independent",
        ),
    ]
