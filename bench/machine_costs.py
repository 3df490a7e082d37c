"""Figure 7: what the machine charges any program, with no agent-server code running.

A turn through HTTP wakes two sleeping processes the direct spawn does not: the
server, for the request, and the client, for the answer. And between a turn's steps
the server sleeps through the CLI's life, so each step starts on a CPU that has been
idle. Two probes measure both on their own, in plain Python:

- wake-up: a child process blocks reading a pipe; the bench writes a byte 50 ms
  later and the child stamps `time.monotonic_ns()` (one clock for every process) as
  its read returns. The median is what one such wake-up costs.
- a system call right after 50 ms asleep (`os.stat("/")`), against the same call
  made again at once: what a step's first call costs here, and what it costs hot;
- the same for a piece of plain Python (a small answer's JSON): code that ran 50 ms
  ago runs slower than the same code run again at once.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable

from bench.plan import Plan
from bench.report import Figure, median, percentile

_IDLE_S = 0.05
"""About how long the server sleeps while a bench stand-in CLI runs."""
_ANSWER = {
    "status": "success",
    "response": "ok",
    "metadata": {f"field_{n}": n * 1.5 for n in range(40)},
    "execution_log": [{"type": "assistant", "n": n, "text": "word " * 40} for n in range(5)],
}
"""About the size and shape of the bench stand-in's answer."""
_CHILD = (
    "import os, sys, time\n"
    "while os.read(0, 1):\n"
    "    sys.stdout.write(f'{time.monotonic_ns()}\\n'); sys.stdout.flush()\n"
)


def measure(plan: Plan) -> list[Figure]:
    """The two probes, `plan.machine_samples` times each."""
    wakes_ms = _wake_ups(plan.machine_samples)
    cold_us, hot_us = _cold_and_hot(plan.machine_samples, lambda: os.stat("/"))
    cold, hot = median(cold_us), median(hot_us)
    cold_py_us, hot_py_us = _cold_and_hot(plan.machine_samples, lambda: json.dumps(_ANSWER))
    cold_py, hot_py = median(cold_py_us), median(hot_py_us)
    return [
        Figure(
            "7 machine: a process asleep on a pipe, written to -> running (median)",
            median(wakes_ms),
            "ms",
            note=(
                f"p95 {percentile(wakes_ms, 0.95):.3f} ms, n={len(wakes_ms)}: "
                "what HTTP adds twice a turn (the server's wake, the client's)"
            ),
            details={"wake_ms": wakes_ms},
        ),
        Figure(
            f"7 machine: a system call after {_IDLE_S * 1000:.0f} ms asleep / the same hot",
            cold / hot,
            "x",
            note=f"os.stat: {cold:.1f} us vs {hot:.1f} us (medians, n={len(cold_us)})",
            details={"cold_us": cold_us, "hot_us": hot_us},
        ),
        Figure(
            f"7 machine: Python after {_IDLE_S * 1000:.0f} ms asleep / the same hot",
            cold_py / hot_py,
            "x",
            note=(
                f"a 2 KB answer's json.dumps: {cold_py:.1f} us vs {hot_py:.1f} us "
                f"(medians, n={len(cold_py_us)})"
            ),
            details={"cold_us": cold_py_us, "hot_us": hot_py_us},
        ),
    ]


def _wake_ups(samples: int) -> list[float]:
    """Milliseconds from a pipe write to the sleeping reader running, `samples` times."""
    child = subprocess.Popen(
        [sys.executable, "-I", "-c", _CHILD],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        bufsize=0,
    )
    assert child.stdin is not None and child.stdout is not None  # PIPE above
    wakes: list[float] = []
    try:
        for _ in range(samples):
            time.sleep(_IDLE_S)
            written = time.monotonic_ns()
            child.stdin.write(b"x")
            woke = int(child.stdout.readline())
            wakes.append((woke - written) / 1e6)
    finally:
        child.stdin.close()
        child.wait(10)
    return wakes


def _cold_and_hot(samples: int, call: Callable[[], object]) -> tuple[list[float], list[float]]:
    """Microseconds of `call()` right after a sleep, and again at once, `samples` times."""
    cold: list[float] = []
    hot: list[float] = []
    for _ in range(samples):
        time.sleep(_IDLE_S)
        for times in (cold, hot):
            started = time.perf_counter_ns()
            call()
            times.append((time.perf_counter_ns() - started) / 1000)
    return cold, hot
