"""One process group: signal it, kill it, reap it (Linux `/proc`, `prctl`, pidfd).

A turn's CLI is the leader of a group of its own (`start_new_session`), so every
process it starts is reached through the group id. The server is a child subreaper,
so a grandchild orphaned by the leader's death becomes the server's child, and its
zombie is the server's to collect: asyncio reaps only the leader it spawned.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import signal
import sys
from dataclasses import dataclass

from agent_server.execution.timings import REAP_POLL_S, REAP_TIMEOUT_S

logger = logging.getLogger("agent_server.process_group")

_PR_SET_CHILD_SUBREAPER = 36


def enable_child_subreaper() -> bool:
    """Make this process the reaper of its orphaned descendants (Linux `prctl`).

    A grandchild whose parent died is re-parented to the nearest subreaper, else to
    PID 1; an init that does not reap (or none, in a bare container) leaves killed
    grandchildren as zombies forever. Call once at boot; unnecessary when this
    process is PID 1. Returns False where unsupported.
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        result = int(libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0))
    except (OSError, AttributeError):
        return False
    return result == 0


def use_pidfd_child_watcher() -> bool:
    """On Python 3.11, learn of a child's exit through a pidfd, not a thread per spawn.

    3.11's default child watcher starts one thread per spawn and blocks the event
    loop until that thread runs (about 0.7 ms a turn here, serialised across
    parallel turns); 3.12 and newer choose the pidfd watcher themselves and
    deprecate setting one. Call from the running loop; True when installed.
    """
    if sys.version_info >= (3, 12) or not hasattr(os, "pidfd_open"):
        return False
    try:
        os.close(os.pidfd_open(os.getpid()))
    except OSError:
        return False  # a kernel or sandbox without pidfd: keep the threaded watcher
    watcher = asyncio.PidfdChildWatcher()
    watcher.attach_loop(asyncio.get_running_loop())
    asyncio.set_child_watcher(watcher)
    return True


@dataclass(frozen=True)
class Member:
    """One process of a group, as /proc shows it."""

    pid: int
    state: str
    ppid: int


class ProcessGroup:
    """The process group `pgid`: signals to all of it, and reaping what is ours."""

    def __init__(self, pgid: int) -> None:
        self.pgid = pgid

    def signal(self, signum: signal.Signals) -> None:
        """Signal the whole group; an already empty group is fine."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pgid, signum)

    async def reap(self) -> None:
        """SIGKILL the group until it is empty, reaping the members that are our children.

        Bounded by `REAP_TIMEOUT_S`: a member that will not die (stuck in the kernel)
        is logged and left, never waited on forever.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + REAP_TIMEOUT_S
        me = os.getpid()
        while True:
            try:
                os.killpg(self.pgid, 0)
            except ProcessLookupError:
                return  # the group is empty: nothing survived, no zombie left
            except PermissionError:
                return  # what is left is not ours to signal
            self.signal(signal.SIGKILL)
            members = group_members(self.pgid)
            member_pids = {member.pid for member in members}
            pending = False
            for member in members:
                if member.state != "Z":
                    pending = True  # SIGKILLed above; wait for it to die
                elif member.ppid == me:
                    _reap(member.pid)
                    pending = True  # re-check the group after reaping
                elif member.ppid in member_pids:
                    pending = True  # its dying parent reaps it or hands it to us
                # Else a zombie of a parent outside the group: not ours to reap.
            if not pending:
                return
            if loop.time() >= deadline:
                logger.warning("process group %d still has members after SIGKILL", self.pgid)
                return
            await asyncio.sleep(REAP_POLL_S)


def group_members(pgid: int) -> list[Member]:
    """The processes of group `pgid`, from /proc (empty where /proc is absent)."""
    members: list[Member] = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return members
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as stat_file:
                stat = stat_file.read()
        except OSError:
            continue  # exited meanwhile
        # The command name may hold spaces and parentheses: split after the last ')'.
        fields = stat.rpartition(b")")[2].split()
        if len(fields) < 3 or int(fields[2]) != pgid:
            continue
        members.append(Member(pid=int(entry), state=fields[0].decode(), ppid=int(fields[1])))
    return members


def _reap(pid: int) -> None:
    """Collect one zombie child of ours (someone else may have been faster)."""
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)
