"""Figure 4: idle RSS, start to healthy, and RSS during a turn that prints 200 MiB.

Start to healthy: from spawning `agent-server serve` to the first 200 on /health,
over fresh servers (each with its own port, HOME and state dir). Idle RSS: VmRSS
after that start and its one health call. The big turn runs on the last of them,
after one small warm-up turn (so lazy imports of the first turn are not counted):
VmRSS is sampled every 50 ms from just before the request until the answer is read,
and once more a second later (what the server gave back).
"""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import asdict, dataclass

from bench.plan import Plan
from bench.report import Figure, median
from bench.server import BenchServer, Workspace
from bench.turn_overhead import server_turn

TARGET_IDLE_MIB = 45.0
TARGET_START_S = 0.5
TARGET_GROWTH_MIB = 32.0
SAMPLE_S = 0.05
_SETTLE_S = 0.3
_BIG_TURN_TIMEOUT_S = 120.0


class RssSampler:
    """Samples one server's VmRSS every `SAMPLE_S` in a thread."""

    def __init__(self, server: BenchServer) -> None:
        self._server = server
        self._stop = threading.Event()
        self.samples: list[tuple[float, int]] = []
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join(5)

    def _run(self) -> None:
        started = time.monotonic()
        while not self._stop.is_set():
            self.samples.append((time.monotonic() - started, self._server.rss_kib()))
            self._stop.wait(SAMPLE_S)

    @property
    def peak_kib(self) -> int:
        """The highest VmRSS sampled."""
        return max(kib for _, kib in self.samples)


@dataclass(frozen=True)
class BigTurn:
    """VmRSS around one turn whose CLI prints a lot, in MiB."""

    printed_mib: float
    turn_s: float
    response_mib: float
    log_truncated: bool
    before_mib: float
    peak_mib: float
    after_mib: float
    after_1s_mib: float
    trace_mib: list[tuple[float, float]]
    """(seconds since the request, VmRSS) every 50 ms."""


async def _turn(server: BenchServer, prompt: str) -> tuple[float, bytes, bool]:
    async with server.client(1) as client:
        started = time.perf_counter()
        answer = await server_turn(client, prompt, _BIG_TURN_TIMEOUT_S)
        took = time.perf_counter() - started
    return took, answer.body, bool(answer.json()["metadata"]["log_truncated"])


def big_turn(server: BenchServer, total_bytes: int) -> BigTurn:
    """Run a warm-up turn, then the big one while sampling the server's VmRSS."""
    asyncio.run(_turn(server, "warm up"))
    time.sleep(_SETTLE_S)
    before = server.rss_kib()
    with RssSampler(server) as sampler:
        took, body, truncated = asyncio.run(_turn(server, f"@print-bytes {total_bytes}"))
    after = server.rss_kib()
    time.sleep(1.0)
    settled = server.rss_kib()
    return BigTurn(
        printed_mib=total_bytes / 2**20,
        turn_s=took,
        response_mib=len(body) / 2**20,
        log_truncated=truncated,
        before_mib=before / 1024,
        peak_mib=sampler.peak_kib / 1024,
        after_mib=after / 1024,
        after_1s_mib=settled / 1024,
        trace_mib=[(round(t, 2), round(kib / 1024, 1)) for t, kib in sampler.samples],
    )


def measure(workspace: Workspace, plan: Plan) -> list[Figure]:
    """Start-to-healthy and idle RSS over fresh servers, then the big turn on the last."""
    started_s: list[float] = []
    idle_mib: list[float] = []
    big: BigTurn | None = None
    for index in range(plan.starts):
        with BenchServer(workspace) as server:
            started_s.append(server.started_s)
            time.sleep(_SETTLE_S)
            idle_mib.append(server.rss_kib() / 1024)
            if index == plan.starts - 1:
                big = big_turn(server, plan.big_turn_bytes)
    assert big is not None  # plan.starts >= 1
    idle, start = median(idle_mib), median(started_s)
    growth = big.peak_mib - big.before_mib
    kept = big.after_1s_mib - big.before_mib
    return [
        Figure.limited(
            "4 idle RSS (median)",
            idle,
            "MiB",
            TARGET_IDLE_MIB,
            baseline="48.7 MB",
            note=f"{len(idle_mib)} fresh servers, after start + 1 health call",
            details={"idle_mib": idle_mib},
        ),
        Figure.limited(
            "4 start to healthy (median)",
            start,
            "s",
            TARGET_START_S,
            baseline="0.46 s",
            note="spawn to first 200 on /health, " + ", ".join(f"{s:.2f}" for s in started_s),
            details={"started_s": started_s},
        ),
        Figure.limited(
            f"4 RSS growth, CLI printing {big.printed_mib:.0f} MiB (peak - before)",
            growth,
            "MiB",
            TARGET_GROWTH_MIB,
            baseline="+200 MB",
            note=(
                f"{big.before_mib:.1f} -> peak {big.peak_mib:.1f} MiB in {big.turn_s:.1f} s; "
                f"answer {big.response_mib:.1f} MiB, log_truncated={big.log_truncated}"
            ),
            details=asdict(big),
        ),
        Figure.limited(
            "4 RSS the turn leaves (1 s later - before)",
            kept,
            "MiB",
            TARGET_GROWTH_MIB,
            note=f"right after the answer: {big.after_mib - big.before_mib:+.1f} MiB",
        ),
    ]
