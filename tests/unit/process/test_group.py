"""The sweep against real escapees: a zombie leader with live threads, a fork-and-exit chain."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent_server.process.group import Reaper, enable_child_subreaper
from agent_server.process.procfs import carries, children_of_self, group_members

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]

REPO = Path(__file__).resolve().parents[3]
HOSTILE_CLI = REPO / "tests" / "support" / "hostile-cli"
TAG = "TRINITY_EXECUTION_ID=sweep-test"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(autouse=True, scope="module")
def _subreaper() -> None:
    # The escapees must be re-parented to this process, as to the server.
    enable_child_subreaper()


def escape(case: str, tag: str = TAG) -> int:
    """Run the hostile CLI's `case` to its exit; the pid of the escapee it left (whose
    group `_last_resort` kills after the test, whatever the sweep did)."""
    name, _, value = tag.partition("=")
    done = subprocess.run(
        [sys.executable, str(HOSTILE_CLI)],
        input=f"case {case}".encode(),
        env={"PATH": os.defpath, name: value},
        capture_output=True,
        timeout=30,
        check=True,
    )
    (line,) = [x for x in done.stdout.splitlines() if b"hostile_escapee" in x]
    escapee = json.loads(line)
    GROUPS.append(escapee["group"])
    return int(escapee["pid"])


GROUPS: list[int] = []


@pytest.fixture(autouse=True)
def _last_resort() -> Iterator[None]:
    # A sweep that failed leaves a chain forking forever: its group goes with the test.
    yield
    needle = f"\0{TAG}\0".encode()
    while GROUPS:
        group = GROUPS.pop()
        for _ in range(50):  # a chain's live member may be mid-fork as it is read
            live = [m for m in group_members(group) if m.state != "Z"]
            if not live:
                break  # gone, as it should be
            if any(carries(m.pid, needle, None) for m in live):
                # Still this test's chain, not a group that took its number since.
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(group, signal.SIGKILL)
                break
            time.sleep(0.01)


def state(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_bytes().rpartition(b")")[2].split()[0].decode()
    except OSError:
        return None


async def sweep(reaper: Reaper, tag: str = TAG) -> int:
    return await reaper.sweep(tag, asyncio.get_running_loop().time() + 5)


async def test_a_zombie_leader_with_live_threads_is_killed() -> None:
    """State Z, a thread still running, the environment only a live thread shows: killed."""
    pid = escape("zombie-leader")
    assert state(pid) == "Z"
    assert len(os.listdir(f"/proc/{pid}/task")) == 2
    reaper = Reaper()
    assert not reaper.sweep_now(TAG)
    assert await sweep(reaper) == 1
    assert state(pid) is None
    assert reaper.sweep_now(TAG)


@pytest.mark.parametrize("attempt", range(20))
async def test_a_fork_and_exit_chain_is_followed_to_its_end(attempt: int) -> None:
    """Each process forks its successor and exits: the sweep scans until nothing is new."""
    before = children_of_self()  # other tests' servers (a session's redis-server) stay
    escape("fork-chain")
    reaper = Reaper()
    assert await sweep(reaper) >= 1
    await asyncio.sleep(0.05)  # a successor the sweep missed would be our child by now
    assert children_of_self() - before == set(), f"attempt {attempt}"


async def test_an_escapee_of_another_turn_is_left_alone() -> None:
    """Another tag's zombie leader survives this sweep, then goes with its own."""
    other = "TRINITY_EXECUTION_ID=another-turn"
    pid = escape("zombie-leader", other)
    reaper = Reaper()
    assert await sweep(reaper) == 0
    assert state(pid) == "Z"
    assert await sweep(reaper, other) == 1
    assert state(pid) is None
