"""One set of shutdown timings: the parts add up, and a real worst-case kill fits them."""

from __future__ import annotations

import asyncio
import math
import os
import sys
import textwrap
import time

import pytest

from agent_server.process import timings
from agent_server.process.group import Reaper, enable_child_subreaper
from agent_server.process.runner import run_process

pytestmark = pytest.mark.timeout(60)

# The leader ignores SIGTERM (so the whole grace runs out) and leaves a grandchild in
# a session of its own holding stdout open (so the pipe drain runs out too).
STUBBORN = textwrap.dedent(
    """
    import os, signal, subprocess, sys, time
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    subprocess.Popen(["sleep", "30"], start_new_session=True)
    print("ready", flush=True)
    time.sleep(60)
    """
)


def test_the_kill_bound_is_the_sum_of_its_waits() -> None:
    """A stopped turn's worst case is grace, reap, drain and close, one after the other."""
    parts = (
        timings.KILL_GRACE_S,
        timings.REAP_TIMEOUT_S,
        timings.PIPE_DRAIN_S,
        timings.PIPE_CLOSE_S,
    )
    assert math.isclose(timings.KILL_BOUND_S, sum(parts))


@pytest.mark.parametrize("grace_s", [0.0, 5.0, 30.0, 3600.0])
def test_uvicorn_waits_for_the_grace_plus_every_kill(grace_s: float) -> None:
    """uvicorn's deadline covers the grace, one kill (they run in parallel) and the answers."""
    margin = timings.server_shutdown_timeout(grace_s) - grace_s
    assert margin >= timings.KILL_BOUND_S + timings.ANSWER_S
    assert margin == timings.SHUTDOWN_MARGIN_S
    assert timings.SHUTDOWN_MARGIN_S <= 10, "documented as 10 s in contract §8"


def test_a_worst_case_kill_ends_within_the_bound() -> None:
    """A CLI that ignores SIGTERM and leaks its stdout into a setsid child still ends in time,
    and the child that left the group is swept too."""
    enable_child_subreaper()

    async def scenario() -> float:
        cancel = asyncio.Event()

        def on_line(line: bytes) -> None:
            if line == b"ready":
                cancel.set()

        started = time.monotonic()
        reaper = Reaper()
        result = await run_process(
            [sys.executable, "-c", STUBBORN],
            env={"PATH": os.defpath, "TIMINGS_TAG": "worst-case"},
            cwd="/",
            stdin=b"",
            timeout_s=30,
            on_line=on_line,
            cancel=cancel,
            reaper=reaper,
            sweep_tag="TIMINGS_TAG=worst-case",
        )
        assert result.facts.terminated
        elapsed = time.monotonic() - started
        assert reaper.leaders == set()
        return elapsed

    elapsed = asyncio.run(scenario())
    # It uses the grace (the CLI ignores SIGTERM) ...
    assert elapsed >= timings.KILL_GRACE_S
    # ... and never more than it.
    assert elapsed <= timings.KILL_BOUND_S + 1.0
