"""Processes as Linux /proc shows them: their state, threads, environment and children.

What the reaping and the sweep of `group` decide from. Every read is of one
moment: a process may exit, or hand its children on, between two of them.
"""

from __future__ import annotations

import contextlib
import os
import threading
from dataclasses import dataclass

from agent_server.process.spawn_user import SpawnUser, file_ids_of


@dataclass(frozen=True)
class Member:
    """One process of a group, as /proc shows it."""

    pid: int
    state: str
    ppid: int


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


def state_of(pid: int) -> str | None:
    """The /proc state letter of `pid`, or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat_file:
            fields = stat_file.read().rpartition(b")")[2].split()
    except OSError:
        return None
    return fields[0].decode() if fields else None


_PF_EXITING = 0x4
"""A task's flag (the ninth field of /proc/<pid>/stat) from its first step of exiting."""


def exited(pid: int) -> bool:
    """True when `pid` is gone, exiting, or a zombie that a wait collects.

    An exiting process no longer shows its environment, and hands its children to
    us only at its last step: a scan that meets one is not the last.
    """
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat_file:
            fields = stat_file.read().rpartition(b")")[2].split()
    except OSError:
        return True
    if fields[0] == b"Z":
        return not threads_live(pid)  # else its main thread alone exited: alive
    return bool(int(fields[6]) & _PF_EXITING)


def threads_live(pid: int) -> bool:
    """True when a thread of `pid` other than its exited main thread still runs.

    Threads that exit leave the task list at once; only the main thread lingers
    there, as a zombie, for as long as any other thread of its process runs.
    """
    try:
        return len(os.listdir(f"/proc/{pid}/task")) > 1
    except OSError:
        return False


def _environ(pid: int) -> bytes:
    """The environment of `pid`, read through a live thread when its main one exited.

    A main thread that exited no longer has the process's memory: reading its
    `environ` fails (ESRCH), a living thread's shows the process's.
    """
    try:
        with open(f"/proc/{pid}/environ", "rb") as environ:
            return environ.read()
    except ProcessLookupError:
        pass
    for thread in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(OSError), open(f"/proc/{pid}/task/{thread}/environ", "rb") as tenv:
            return tenv.read()
    return b""


def carries(pid: int, needle: bytes, files_as: SpawnUser | None) -> bool:
    """True when `pid`'s environment holds the tag (`\\0NAME=value\\0`).

    The kernel shows a process's environment to its own uid: a spawn user's process
    is read with that user's file-system ids, on this thread, for these opens.
    """
    try:
        with file_ids_of(files_as):
            return needle in b"\0" + _environ(pid) + b"\0"
    except OSError:
        return False  # unreadable: gone, or not ours to read; only an idle sweep takes it
