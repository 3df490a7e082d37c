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
import threading
from collections.abc import Iterator
from dataclasses import dataclass

from agent_server.process.spawn_user import SpawnUser, file_ids_of
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


@dataclass(frozen=True)
class Member:
    """One process of a group, as /proc shows it."""

    pid: int
    state: str
    ppid: int


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

    def install(self, loop: asyncio.AbstractEventLoop) -> None:
        """Make this the server's reaper: collect orphaned zombies on every SIGCHLD.

        It also declares that every child of this process is a turn's: an idle sweep
        then kills untagged children too (a process embedding agent-server for a
        test, which has children of its own, never calls this).
        """
        self._owns_children = True
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
            if _state(pid) == "Z":
                _reap(pid)
                reaped += 1
        return reaped

    async def sweep(self, tag: str, deadline: float) -> int:
        """Kill our children carrying `tag` (all of ours when no CLI runs), reap them.

        Repeats until none is left (a killed process's own children come to us next)
        or the loop's clock passes `deadline`. Returns how many processes it killed.
        """
        needle = _needle(tag)
        loop = asyncio.get_running_loop()
        killed: set[int] = set()
        while True:
            alive = self._doomed(needle)
            if not alive:
                return len(killed)
            for pid in alive:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
                killed.add(pid)
            if loop.time() >= deadline:
                logger.warning("processes of a finished turn survive SIGKILL: %s", sorted(alive))
                return len(killed)
            await asyncio.sleep(REAP_POLL_S)

    def sweep_now(self, tag: str) -> bool:
        """One pass of `sweep` that kills nothing: True when nothing is left to kill."""
        return not self._doomed(_needle(tag))

    def _doomed(self, needle: bytes) -> list[int]:
        """Our living children that a sweep for `needle` kills; zombies are reaped on the way.

        A scan of our children, and the environment only of those that are not
        running CLIs: at the usual end of a turn, none.
        """
        idle = self._owns_children and not self.leaders and not self._spawning
        alive = []
        for pid in children_of_self() - self.leaders:
            state = _state(pid)
            if state == "Z" or state is None:
                if state == "Z" and not self._spawning:
                    _reap(pid)
                continue
            if idle or _carries(pid, needle, self.files_as):
                alive.append(pid)
        return alive


def _needle(tag: str) -> bytes:
    return b"\0" + tag.encode() + b"\0"


def children_of_self() -> set[int]:
    """Our own child pids: those of the main thread and of the calling one.

    /proc lists a process's children under the thread that forked it, or adopted
    it. The kernel hands an orphan to its subreaper's first live thread, the main
    one (`find_new_reaper`), and every spawn is forked by the event loop's thread,
    which calls this; worker threads fork nothing. Two reads, not one a thread, and
    none when the process has no child at all (the usual end of a turn): one
    `waitid` tells, which collects nothing (`WNOWAIT`) and costs a tenth of them.
    """
    try:
        os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return set()
    children: set[int] = set()
    for thread in {os.getpid(), threading.get_native_id()}:
        try:
            with open(f"/proc/self/task/{thread}/children", "rb") as listing:
                children.update(int(pid) for pid in listing.read().split())
        except OSError:
            continue  # no /proc
    return children


def _state(pid: int) -> str | None:
    """The /proc state letter of `pid`, or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat_file:
            fields = stat_file.read().rpartition(b")")[2].split()
    except OSError:
        return None
    return fields[0].decode() if fields else None


def _carries(pid: int, needle: bytes, files_as: SpawnUser | None) -> bool:
    """True when `pid`'s environment holds the tag (`\\0NAME=value\\0`).

    The kernel shows a process's environment to its own uid: a spawn user's process
    is read with that user's file-system ids, on this thread, for this one open.
    """
    try:
        with file_ids_of(files_as), open(f"/proc/{pid}/environ", "rb") as environ:
            return needle in b"\0" + environ.read() + b"\0"
    except OSError:
        return False  # unreadable: gone, or not ours to read; only an idle sweep takes it
