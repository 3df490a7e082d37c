"""`python -m bench [--quick] [--only 0,1,3]`: measure, print the table, save the JSON."""

from __future__ import annotations

import argparse
import asyncio
import math
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path

from bench import (
    broker_forwarding,
    flood,
    machine_costs,
    memory_startup,
    parallel_turns,
    redaction,
    reload_latency,
    spawn_env_build,
    timeline,
    turn_overhead,
    walk_cost,
)
from bench.plan import FULL, QUICK, Plan
from bench.report import Figure, cpu_busy, machine, render, write_json
from bench.server import Workspace
from bench.spawn_env_build import write_env_file
from bench.standin_cli import install_standin

RESULTS = Path(__file__).resolve().parent / "results-latest.json"
BUDGET_S = 300.0
"""Past this, the remaining benchmarks are skipped (each one is bounded on its own)."""

Step = Callable[[Workspace, Plan], list[Figure]]
STEPS: dict[int, tuple[str, Step]] = {
    0: ("timeline of one turn", lambda w, p: asyncio.run(timeline.measure(w, p))),
    1: ("turn vs direct spawn", lambda w, p: asyncio.run(turn_overhead.measure(w, p))),
    2: ("32 parallel turns", lambda w, p: asyncio.run(parallel_turns.measure(w, p))),
    3: ("reload-token under load", lambda w, p: asyncio.run(reload_latency.measure(w, p))),
    4: ("memory and start", memory_startup.measure),
    5: ("spawn env build", lambda _w, p: spawn_env_build.measure(p)),
    6: ("redaction at 10 / 1,000 / 20,000 secrets", lambda _w, p: redaction.measure(p)),
    7: ("the machine: wake-ups and cold system calls", lambda _w, p: machine_costs.measure(p)),
    8: (
        "the controller's walk: per rung, and choosing one of 1,000",
        lambda _w, p: walk_cost.measure(p),
    ),
    9: ("a flooding turn: /health, RSS, SIGTERM", lambda w, p: asyncio.run(flood.measure(w, p))),
    10: (
        "the broker: time to first byte, a streamed answer, reloads under its traffic",
        lambda w, p: [
            *broker_forwarding.measure(p),
            *asyncio.run(broker_forwarding.measure_reloads(w, p)),
        ],
    ),
}


def main(argv: list[str] | None = None) -> int:
    """Run the benchmarks; exit 1 only when one of them could not run."""
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="a short smoke run")
    parser.add_argument("--only", help="comma-separated figure numbers, e.g. 1,3")
    parser.add_argument("--json", type=Path, default=RESULTS, help=f"default: {RESULTS}")
    parser.add_argument(
        "--server-env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="add to every server's environment (and so to every spawn's), repeatable",
    )
    args = parser.parse_args(argv)
    plan = QUICK if args.quick else FULL
    chosen = sorted(int(n) for n in args.only.split(",")) if args.only else sorted(STEPS)
    host = machine()
    started = time.monotonic()
    figures: list[Figure] = []
    busy: dict[str, float] = {}
    host["cpu_busy_before"] = busy
    broken = False
    with tempfile.TemporaryDirectory(prefix="agent-server-bench-") as root:
        extra = dict(item.split("=", 1) for item in args.server_env)
        workspace = Workspace(Path(root), install_standin(Path(root)), extra)
        write_env_file(workspace.home / ".env", lines=20)
        for number in chosen:
            title, step = STEPS[number]
            elapsed = time.monotonic() - started
            if elapsed > BUDGET_S:
                figures.append(Figure(f"{number} {title}: skipped (time budget)", math.nan, ""))
                continue
            busy[str(number)] = cpu_busy()
            print(
                f"[{elapsed:5.0f} s] {number}: {title} (CPUs {busy[str(number)]:.0%} busy) ...",
                file=sys.stderr,
                flush=True,
            )
            try:
                figures += step(workspace, plan)
            except Exception as exc:
                broken = True
                traceback.print_exc()
                figures.append(
                    Figure(
                        f"{number} {title}: ERROR",
                        math.nan,
                        "",
                        verdict="FAIL",
                        details={"error": f"{type(exc).__name__}: {exc}"},
                    )
                )
    elapsed = time.monotonic() - started
    print(render(host, figures, elapsed))
    write_json(args.json, {**host, "server_env": args.server_env}, figures, elapsed, plan.quick)
    print(f"saved {args.json}")
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
