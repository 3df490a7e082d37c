"""Figure 2: 32 parallel one-second turns through the server vs 32 direct spawns.

Wall time from the first request (or spawn) to the last answer (or exit), rounds
interleaved with alternating order; the figure is the ratio of the medians.
"""

from __future__ import annotations

import asyncio
import time

from bench.plan import Plan
from bench.report import Figure, median
from bench.server import BenchServer, Workspace, direct_turn
from bench.turn_overhead import server_turn

TARGET_RATIO = 1.02
PARALLEL = 32
PROMPT = "@sleep 1"


async def measure(workspace: Workspace, plan: Plan) -> list[Figure]:
    """Median wall time of 32 parallel server turns over 32 parallel direct spawns."""
    server_s: list[float] = []
    direct_s: list[float] = []
    with BenchServer(workspace, {"AGENT_SERVER_MAX_PARALLEL": str(PARALLEL)}) as server:
        async with server.client(PARALLEL) as client:
            # Open the connections once, as a controller's pool would have them.
            await asyncio.gather(*(server_turn(client, "warm") for _ in range(PARALLEL)))
            for index in range(plan.parallel_rounds):
                sides = ("server", "direct") if index % 2 == 0 else ("direct", "server")
                for side in sides:
                    started = time.perf_counter()
                    if side == "server":
                        await asyncio.gather(
                            *(server_turn(client, PROMPT) for _ in range(PARALLEL))
                        )
                    else:
                        await asyncio.gather(
                            *(direct_turn(workspace, PROMPT) for _ in range(PARALLEL))
                        )
                    (server_s if side == "server" else direct_s).append(
                        time.perf_counter() - started
                    )
    ratio = median(server_s) / median(direct_s)
    return [
        Figure.limited(
            f"2 {PARALLEL} parallel 1-s turns: server / direct (wall)",
            ratio,
            "x",
            TARGET_RATIO,
            baseline="1.03x",
            note=(
                f"server {median(server_s):.3f} s vs direct {median(direct_s):.3f} s, "
                f"{len(server_s)} rounds"
            ),
            details={
                "rounds": len(server_s),
                "server_wall_s": server_s,
                "direct_wall_s": direct_s,
                "server_median_s": median(server_s),
                "direct_median_s": median(direct_s),
            },
        )
    ]
