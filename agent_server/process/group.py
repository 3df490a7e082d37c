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
from collections.abc import Iterator
from typing import Literal

from agent_server.process.procfs import (
    carries,
    children_of_self,
    exited,
    group_members,
    state_of,
    threads_live,
)
from agent_server.process.spawn_user import SpawnUser
from agent_server.process.timings import ORPHAN_REAP_DELAY_S, REAP_POLL_S, REAP_TIMEOUT_S

logger = logging.getLogger("agent_server.process_group")

_PR_SET_DUMPABLE = 4
_PR_SET_CHILD_SUBREAPER = 36


def _prctl(option: int, value: int) -> bool:
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(option, value, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def forbid_dumps() -> bool:
    """Make this process non-dumpable (Linux `prctl(PR_SET_DUMPABLE, 0)`).

    A non-dumpable process's `/proc/<pid>/environ`, `mem` and `maps` are owned by
    root, and ptrace by the same uid is refused: an agent running as the server's
    user cannot read the controller token out of the server. Children are not
    affected: exec makes a process dumpable again. Returns False where unsupported.
    """
    return _prctl(_PR_SET_DUMPABLE, 0)


def enable_child_subreaper() -> bool:
    """Make this process the reaper of its orphaned descendants (Linux `prctl`).

    A grandchild whose parent died is re-parented to the nearest subreaper, else to
    PID 1; an init that does not reap (or none, in a bare container) leaves killed
    grandchildren as zombies forever. Call once at boot; unnecessary when this
    process is PID 1. Returns False where unsupported.
    """
    return _prctl(_PR_SET_CHILD_SUBREAPER, 1)


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


class ProcessGroup:
    """The process group `pgid`: signals to all of it, and reaping what is ours.

    With a `reaper` and a `tag`, reaping also sweeps the processes that left the
    group but carry the tag (`Reaper.sweep`).
    """

    def __init__(self, pgid: int, *, reaper: Reaper | None = None, tag: str | None = None) -> None:
        self.pgid = pgid
        self._reaper = reaper
        self._tag = tag

    def signal(self, signum: signal.Signals) -> None:
        """Signal the whole group; an already empty group is fine."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pgid, signum)

    async def reap(self) -> None:
        """Empty the group and sweep its escapees, within REAP_TIMEOUT_S for both.

        Call once the leader was reaped. A member that will not die (stuck in the
        kernel) is logged and left, never waited on forever.
        """
        deadline = asyncio.get_running_loop().time() + REAP_TIMEOUT_S
        await self._reap_group(deadline)
        if self._reaper is not None:
            self._reaper.leaders.discard(self.pgid)
            if self._tag is not None:
                await self._reaper.sweep(self._tag, deadline)

    def reap_now(self) -> bool:
        """`reap` when there is nothing to wait for; True when it is all done.

        True when the group is empty already and no escapee carries the tag (the
        usual end of a turn); False, having killed nothing, when `reap` must run.
        """
        try:
            os.killpg(self.pgid, 0)
        except (ProcessLookupError, PermissionError):
            pass  # empty, or what is left is not ours to signal (as `_reap_group`)
        else:
            return False
        if self._reaper is not None:
            self._reaper.leaders.discard(self.pgid)
            if self._tag is not None and not self._reaper.sweep_now(self._tag):
                return False
        return True

    async def _reap_group(self, deadline: float) -> None:
        """SIGKILL the group until it is empty, reaping the members that are our children."""
        loop = asyncio.get_running_loop()
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


def _reap(pid: int) -> None:
    """Collect one zombie child of ours (someone else may have been faster)."""
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


Containment = Literal["subreaper_sweep", "process_group"]
"""`subreaper_sweep`: a turn's group is killed, and every process that left it comes
to this server and is swept at the turn's end; `process_group`: the group only."""


class Reaper:
    """Every process a turn started, found and collected when the turn ends (contract §10).

    A CLI's children can leave its process group (`setsid`, a double fork). Being
    the child subreaper, this server inherits each such process once its parent
    dies, so the escapees of every turn end up among its own children. At the end
    of a spawn, `sweep` kills the children that carry the spawn's tag (its
    `TRINITY_EXECUTION_ID=…`, inherited through every fork), until none is left;
    when no other turn's CLI is alive it kills untagged ones too (a process that
    cleared its environment). `reap_orphans`, run on SIGCHLD, collects the zombies
    of inherited processes, never a turn leader asyncio is still waiting for.
    """

    def __init__(self, files_as: SpawnUser | None = None) -> None:
        self.files_as = files_as
        """The spawn user, whose file-system ids read its processes' environments."""
        self.leaders: set[int] = set()
        """The pids of running CLIs: asyncio's child watcher reaps those, never us."""
        self._spawning = 0
        self._pending: asyncio.Handle | None = None
        self._owns_children = False
        self.containment: Containment = "process_group"
        """What ends a turn's processes: its group only, until `install` makes this
        process the subreaper whose sweep also finds what left the group."""

    def install(self, loop: asyncio.AbstractEventLoop) -> None:
        """Make this the server's reaper: collect orphaned zombies on every SIGCHLD.

        It also declares that every child of this process is a turn's: an idle sweep
        then kills untagged children too (a process embedding agent-server for a
        test, which has children of its own, never calls this). Where the kernel
        refuses the subreaper, escapees go to PID 1 and only the group is killed.
        """
        self._owns_children = True
        if enable_child_subreaper():
            self.containment = "subreaper_sweep"
        loop.add_signal_handler(signal.SIGCHLD, self._on_sigchld, loop)

    def uninstall(self, loop: asyncio.AbstractEventLoop) -> None:
        """Stop listening for SIGCHLD (the server is done)."""
        loop.remove_signal_handler(signal.SIGCHLD)
        if self._pending is not None:
            self._pending.cancel()
            self._pending = None

    def _on_sigchld(self, loop: asyncio.AbstractEventLoop) -> None:
        # Not at once: a turn's CLI exiting sends one too, and its turn, which sweeps
        # and reaps for itself, must not wait behind the scan. Signals meanwhile join.
        if self._pending is None:
            self._pending = loop.call_later(ORPHAN_REAP_DELAY_S, self._run_pending)

    def _run_pending(self) -> None:
        self._pending = None
        self.reap_orphans()

    @contextlib.contextmanager
    def spawning(self) -> Iterator[None]:
        """Between fork and `leaders.add`, asyncio already waits for the new pid: hold off."""
        self._spawning += 1
        try:
            yield
        finally:
            self._spawning -= 1

    def reap_orphans(self) -> int:
        """Collect the zombies among our children that are not turn leaders; how many."""
        if self._spawning:
            return 0  # a pid asyncio is about to watch is not in `leaders` yet
        reaped = 0
        for pid in children_of_self() - self.leaders:
            if state_of(pid) == "Z" and not threads_live(pid):
                _reap(pid)
                reaped += 1
        return reaped

    async def sweep(self, tag: str, deadline: float) -> int:
        """Kill our children carrying `tag` (all of ours when no CLI runs), reap them.

        Repeats until a scan finds nothing new: no process to kill and no zombie to
        reap (a process that just exited has handed its children to us, and a
        fork-and-exit chain hands on its successor that way), or until the loop's
        clock passes `deadline`. Returns how many processes it killed.
        """
        needle = _needle(tag)
        loop = asyncio.get_running_loop()
        killed: set[int] = set()
        while True:
            alive, gone = self._doomed(needle)
            if not alive and not gone:
                return len(killed)
            for pid in alive:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)  # a zombie leader's live threads die too
                killed.add(pid)
            if loop.time() >= deadline:
                logger.warning("processes of a finished turn survive SIGKILL: %s", sorted(alive))
                return len(killed)
            await asyncio.sleep(REAP_POLL_S)  # a SIGKILL is delivered, an exit completes

    def sweep_now(self, tag: str) -> bool:
        """One pass of `sweep` that kills nothing: True when nothing is left to kill."""
        alive, gone = self._doomed(_needle(tag))
        return not alive and not gone

    def _doomed(self, needle: bytes) -> tuple[list[int], int]:
        """Our living children that a sweep for `needle` kills, and how many exited meanwhile.

        A scan of our children, and the environment only of those that are not
        running CLIs: at the usual end of a turn, none. A process whose main thread
        exited while its other threads run shows state Z, and no wait collects it:
        it is alive, and killed like any other. A child that exited (reaped on the
        way) or was exiting as it was read has handed its own children to us: the
        scan is not the last.
        """
        idle = self._owns_children and not self.leaders and not self._spawning
        alive = []
        gone = 0
        for pid in children_of_self() - self.leaders:
            if exited(pid):
                if self._spawning:
                    continue  # it may be the pid asyncio is about to watch
                _reap(pid)
                gone += 1
            elif idle or carries(pid, needle, self.files_as):
                alive.append(pid)
            elif exited(pid):
                gone += 1  # its environment went with its exit: rescan for its children
        return alive, gone


def _needle(tag: str) -> bytes:
    return b"\0" + tag.encode() + b"\0"
