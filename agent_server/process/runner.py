"""Run a CLI as a subprocess in its own process group, and leave nothing behind.

The runner owns the process lifecycle and nothing else: it spawns argv (never a
shell) in a new session with exactly the given env, writes stdin, hands each stdout
line to `on_line` as it arrives, keeps a bounded stderr tail, and ends the run on
exit, timeout, the `cancel` event, or its own cancellation. Every ending kills the
whole process group and reaps it, grandchildren included.

Why `loop.subprocess_exec` with our own protocol rather than
`asyncio.create_subprocess_exec` (which wraps the same call): in Python 3.11,
`Process.wait()` returns only once the stdout/stderr pipes have closed, so a
grandchild that inherited stdout would hide the leader's exit and hang the run.
The protocol's `process_exited` fires when the leader is reaped, pipes or not, and
the transport gives a public `close()` for pipes held by something outside the group.
Data arrives as chunks that are split into lines a slice at a time, with reading
paused in between, so nothing buffers more than a chunk and one line (at most
`max_line_bytes`) however fast the CLI prints, and the loop is never held long.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import subprocess
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import anyio

from agent_server.errors import SpawnTooLarge
from agent_server.process.group import ProcessGroup, Reaper
from agent_server.process.pipes import ProcessProtocol, descriptor_pipes
from agent_server.process.timings import KILL_GRACE_S, PIPE_CLOSE_S, PIPE_DRAIN_S

logger = logging.getLogger(__name__)

_SPAWN_ERRORS = (FileNotFoundError, PermissionError, NotADirectoryError)


@dataclass(frozen=True)
class ProcessFacts:
    """What the runner knows about how the process ended, beside its stream."""

    exit_code: int | None
    """Exit status as asyncio reports it: negative for a signal, None if never spawned."""
    stderr: str = ""
    """A bounded tail of stderr (decoded; the caller redacts it)."""
    timed_out: bool = False
    terminated: bool = False
    """Terminated through the terminate route (or the client went away)."""
    spawn_failed: bool = False
    """The runtime command is missing or not executable."""


@dataclass(frozen=True)
class ProcessResult:
    """How one process run ended, and the pid it had (None if it never spawned)."""

    facts: ProcessFacts
    pid: int | None
    cut_lines: int = 0
    """Stdout lines over `max_line_bytes`, dropped unseen."""


async def run_process(
    argv: Sequence[str],
    *,
    env: Mapping[str, str],
    cwd: str | Path,
    stdin: bytes,
    timeout_s: float,
    on_line: Callable[[bytes], None],
    cancel: asyncio.Event,
    kill_grace_s: float = KILL_GRACE_S,
    max_line_bytes: int = 16 * 1024 * 1024,
    stderr_tail_bytes: int = 64 * 1024,
    on_spawn: Callable[[int], None] | None = None,
    reaper: Reaper | None = None,
    sweep_tag: str | None = None,
    descriptors: Mapping[str, str] | None = None,
) -> ProcessResult:
    """Run argv to its end in its own process group and report how it ended.

    - `env` is the whole environment of the child (nothing is inherited).
    - `on_line` gets each stdout line without its newline, in order, as it arrives;
      a line longer than `max_line_bytes` is dropped unseen. An exception from it
      kills the group and is re-raised.
    - A missing or non-executable command gives `facts.spawn_failed`, no exception.
    - The timeout (from spawn), `cancel`, or cancelling this coroutine kill the group:
      SIGTERM, up to `kill_grace_s` for the leader to exit, then SIGKILL. After a
      normal exit, whatever is left of the group is SIGKILLed. Every ending reaps the
      leader and the group's members that are our children before returning (or
      before re-raising the cancellation).
    - `facts.stderr` is the last `stderr_tail_bytes` of stderr from its first whole
      line on, not yet redacted.
    - `on_spawn` gets the leader's pid (= its process group id) once it runs.
    - With a `reaper` and a `sweep_tag` (`NAME=value` in the child's environment),
      every ending also kills and collects what left the group (`Reaper.sweep`).
    - `descriptors` (variable -> value): each value is written to a pipe whose read end
      the child inherits, the variable set to its number (contract §4.7).
    """
    if not argv:
        msg = "argv must name a command"
        raise ValueError(msg)
    check_exec_size(argv, env)
    loop = asyncio.get_running_loop()
    protocol = ProcessProtocol(
        on_line=on_line, max_line_bytes=max_line_bytes, stderr_tail_bytes=stderr_tail_bytes
    )
    transport = await _spawn(loop, protocol, argv, dict(env), cwd, descriptors or {}, reaper)
    if transport is None:
        return ProcessResult(ProcessFacts(exit_code=None, spawn_failed=True), pid=None)
    pid = transport.get_pid()
    # start_new_session makes the leader the leader of a new group: pgid == pid.
    group = ProcessGroup(pid, reaper=reaper, tag=sweep_tag)
    run = _Run(transport, protocol, group, kill_grace_s=kill_grace_s)
    deadline = loop.time() + timeout_s
    try:
        if on_spawn is not None:
            on_spawn(pid)
        _write_stdin(transport, stdin)
        ending = await run.wait_for_ending(deadline, cancel)
    except BaseException:
        await _run_to_completion(run.kill())
        raise
    if ending == "exited":
        # Usually nothing is left to wait for: then it is all done now, without a task.
        if not run.finished_now():
            await _run_to_completion(run.finish_after_exit())
    else:
        await _run_to_completion(run.kill())
    if protocol.error is not None:
        raise protocol.error

    facts = ProcessFacts(
        exit_code=transport.get_returncode(),
        stderr=protocol.stderr_tail(),
        timed_out=ending == "timeout",
        terminated=ending == "cancelled",
    )
    return ProcessResult(facts=facts, pid=pid, cut_lines=protocol.cut_lines)


async def _spawn(
    loop: asyncio.AbstractEventLoop,
    protocol: ProcessProtocol,
    argv: Sequence[str],
    env: dict[str, str],
    cwd: str | Path,
    descriptors: Mapping[str, str],
    reaper: Reaper | None,
) -> asyncio.SubprocessTransport | None:
    """Start argv as the leader of a new process group; None when it cannot be run."""
    handed = descriptor_pipes(descriptors, env)
    with reaper.spawning() if reaper is not None else contextlib.nullcontext():
        try:
            transport, _ = await loop.subprocess_exec(
                lambda: protocol,
                *argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=env,
                cwd=cwd,
                start_new_session=True,
                pass_fds=handed,
            )
        except _SPAWN_ERRORS:
            return None
        finally:
            for fd in handed:
                os.close(fd)
        if reaper is not None:
            reaper.leaders.add(transport.get_pid())
    return transport


# Linux: each argv or environment string is at most 32 pages, and all of them, with
# their pointers, at most ARG_MAX (a quarter of the stack limit).
_MAX_ARG_STRLEN = 32 * os.sysconf("SC_PAGE_SIZE")
_ARG_MAX = os.sysconf("SC_ARG_MAX")
_POINTER = 8


def check_exec_size(argv: Sequence[str], env: Mapping[str, str]) -> None:
    """Raise SpawnTooLarge, naming what is too large, before exec would fail with E2BIG."""
    total = 0
    for name, value in env.items():
        size = _bytes(name) + _bytes(value) + 2
        if size > _MAX_ARG_STRLEN:
            msg = f"the spawn environment's {name} is over {_MAX_ARG_STRLEN} bytes"
            raise SpawnTooLarge(msg)
        total += size + _POINTER
    for index, arg in enumerate(argv):
        size = _bytes(arg) + 1
        if size > _MAX_ARG_STRLEN:
            what = arg.partition("=")[0] if arg.startswith("--") else f"argument {index}"
            msg = f"the spawn's {what} is over {_MAX_ARG_STRLEN} bytes"
            raise SpawnTooLarge(msg)
        total += size + _POINTER
    if total + 2 * _POINTER > _ARG_MAX:
        msg = (
            f"the spawn's arguments and environment take {total} bytes, over the kernel's "
            f"{_ARG_MAX}: check the size of .env"
        )
        raise SpawnTooLarge(msg)


def _bytes(text: str) -> int:
    """The length of `text` in UTF-8 (ASCII, the usual case, without encoding it)."""
    return len(text) if text.isascii() else len(text.encode())


def _write_stdin(transport: asyncio.SubprocessTransport, data: bytes) -> None:
    """Write all of stdin and close it; a child that exits unread is not an error."""
    pipe = transport.get_pipe_transport(0)
    # Duck-typed: uvloop's pipe transport is not an asyncio.WriteTransport subclass.
    if pipe is None:
        return
    pipe = cast(asyncio.WriteTransport, pipe)
    # The pipe transport buffers what the child has not read yet and flushes it
    # before closing; a broken pipe only closes it (logged at debug by asyncio).
    pipe.write(data)
    pipe.close()


async def _run_to_completion(cleanup: Coroutine[Any, Any, None]) -> None:
    """Run a kill/reap to its end even if we are cancelled meanwhile, then re-raise.

    A cancellation arriving mid-cleanup must not leave the group alive or unreaped, so
    the cleanup runs in its own task. anyio (Starlette's request scopes) re-delivers a
    cancellation at every await, which would spin this loop for the whole grace: its
    shield stops that, and the loop covers plain `Task.cancel()`.
    """
    task = asyncio.ensure_future(cleanup)
    interrupted = False
    with anyio.CancelScope(shield=True):
        while not task.done():
            try:
                await asyncio.shield(task)
            except asyncio.CancelledError:
                interrupted = True
    task.result()
    if interrupted:
        raise asyncio.CancelledError


def _resolve(ending: asyncio.Future[None]) -> None:
    if not ending.done():
        ending.set_result(None)


class _Run:
    """One spawned CLI: how to wait for its end, and how to end it leaving nothing behind."""

    def __init__(
        self,
        transport: asyncio.SubprocessTransport,
        protocol: ProcessProtocol,
        group: ProcessGroup,
        *,
        kill_grace_s: float,
    ) -> None:
        self._transport = transport
        self._protocol = protocol
        self._group = group
        self._grace = kill_grace_s

    async def wait_for_ending(self, deadline: float, cancel: asyncio.Event) -> str:
        """Wait for the first ending: `exited`, `failed`, `cancelled` or `timeout`.

        One future, resolved by whichever comes first: the protocol on the exit or a
        callback failure, the cancel event, the deadline (the exit wakes this run in
        one step, with no waiter task in between).
        """
        loop = asyncio.get_running_loop()
        protocol = self._protocol
        if not (protocol.exited.is_set() or protocol.failed.is_set()):
            ending: asyncio.Future[None] = loop.create_future()
            protocol.ending = ending
            canceller = asyncio.ensure_future(cancel.wait())
            canceller.add_done_callback(lambda _: _resolve(ending))
            timer = loop.call_at(deadline, _resolve, ending)
            try:
                await ending
            finally:
                timer.cancel()
                canceller.cancel()
                protocol.ending = None
        # A callback failure must surface even if the process also ended; an exit
        # that raced the cancel or the deadline is a normal end.
        if self._protocol.failed.is_set():
            return "failed"
        if self._protocol.exited.is_set():
            return "exited"
        if cancel.is_set():
            return "cancelled"
        return "timeout"

    async def kill(self) -> None:
        """SIGTERM the group, give the leader the grace, SIGKILL the group, reap all."""
        self._group.signal(signal.SIGTERM)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._protocol.exited.wait(), self._grace)
        # Unconditional: members that ignore SIGTERM outlive a leader that obeyed it.
        self._group.signal(signal.SIGKILL)
        await self._protocol.exited.wait()  # the child watcher has reaped the leader
        await self._group.reap()
        await self._drain_and_close()

    def finished_now(self) -> bool:
        """After the leader exited on its own: finish at once when nothing is left to wait for.

        The usual end: both pipes are at EOF, the group is empty and no escapee
        carries the run's tag. Then this does all `finish_after_exit` would (the
        transport's own `connection_lost` follows in the loop's next step) and returns
        True; otherwise it returns False, and `finish_after_exit` must run.
        """
        protocol = self._protocol
        if not (protocol.stdout_closed.is_set() and protocol.stderr_closed.is_set()):
            return False
        if not self._group.reap_now():
            return False
        self._transport.close()
        return True

    async def finish_after_exit(self) -> None:
        """After the leader exited on its own: kill and reap what is left, read the rest."""
        await self._group.reap()
        await self._drain_and_close()

    async def _drain_and_close(self) -> None:
        """Read stdout/stderr to EOF (bounded), then release the pipes."""
        protocol = self._protocol
        try:
            await asyncio.wait_for(
                asyncio.gather(protocol.stdout_closed.wait(), protocol.stderr_closed.wait()),
                PIPE_DRAIN_S,
            )
        except TimeoutError:
            logger.warning(
                "pipes of process group %d held open outside the group; closing them",
                self._group.pgid,
            )
            protocol.stop_lines()
        self._transport.close()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(protocol.closed.wait(), PIPE_CLOSE_S)
