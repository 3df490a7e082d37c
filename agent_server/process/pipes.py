"""A CLI's pipes: stdout as bounded lines, stderr as a safe tail, credentials on descriptors.

Stdout and stderr work on chunks as they arrive, so nothing buffers more than one
line (at most `max_line_bytes`) or the tail's limit, however fast the CLI prints;
stdout's lines are handed on a slice at a time (`ProcessProtocol`), so however many
lines a chunk holds, they never hold the event loop for long.
A credential the CLI takes on a descriptor is written to a pipe of its own before
the spawn (contract §4.7).
"""

from __future__ import annotations

import asyncio
import collections
import os
import time
from collections.abc import Callable, Iterator, Mapping
from typing import cast

from agent_server.errors import SpawnTooLarge
from agent_server.process.timings import LINE_SLICE_S


class LineSplitter:
    """Splits stdout chunks into lines, dropping any line longer than the limit.

    A dropped line is counted (`cut`) and never seen: no part of it is parsed, and
    no cut can leave half a secret for the redactor to miss.
    """

    def __init__(self, on_line: Callable[[bytes], None], max_line_bytes: int) -> None:
        self._on_line = on_line
        self._max = max_line_bytes
        self._partial = bytearray()
        # True while inside an over-long line: its bytes are skipped until its newline.
        self._discarding = False
        self.cut = 0
        """How many lines were over the limit (dropped unseen)."""

    def feed(self, chunk: bytes) -> None:
        """Hand every line `chunk` completes to `on_line`."""
        for line in self.lines(chunk):
            self._on_line(line)

    def lines(self, chunk: bytes) -> Iterator[bytes]:
        """The lines `chunk` completes, one at a time (exhaust it before the next chunk)."""
        view = memoryview(chunk)
        start = 0
        while True:
            newline = chunk.find(b"\n", start)
            end = len(chunk) if newline < 0 else newline
            whole = newline >= 0 and not self._partial and not self._discarding
            if whole and end - start <= self._max:  # the usual line, in one chunk: one copy
                yield chunk[start:end]
                start = newline + 1
                continue
            if not self._discarding:
                if len(self._partial) + (end - start) > self._max:
                    # Too long: forget what we held and skip the rest of it.
                    self._partial = bytearray()
                    self._discarding = True
                    self.cut += 1
                else:
                    self._partial += view[start:end]
            if newline < 0:
                return
            if self._discarding:
                self._discarding = False
            else:
                line = bytes(self._partial)
                self._partial.clear()
                yield line
            start = newline + 1

    def close(self) -> None:
        """At EOF: an unterminated last line is still a line (unless over-long)."""
        if self._partial and not self._discarding:
            line = bytes(self._partial)
            self._partial.clear()
            self._on_line(line)
        self._discarding = False


class StderrTail:
    """The last `limit` bytes of stderr, read back from its first whole line.

    A cut can fall inside a secret, whose remaining end no redactor can recognise:
    once bytes were dropped, the partial first line goes too.
    """

    def __init__(self, limit: int) -> None:
        self._kept = bytearray()
        self._limit = limit
        self._cut = False

    def feed(self, data: bytes) -> None:
        """Keep `data`, dropping the oldest bytes past the limit."""
        self._kept += data
        excess = len(self._kept) - self._limit
        if excess > 0:
            del self._kept[:excess]
            self._cut = True

    def text(self) -> str:
        """The kept tail, decoded leniently (not yet redacted)."""
        tail = bytes(self._kept)
        if self._cut:
            tail = tail.partition(b"\n")[2]
        return tail.decode("utf-8", errors="replace")


class ProcessProtocol(asyncio.SubprocessProtocol):
    """Receives the child's pipes and exit; all state of one run's I/O.

    Stdout lines are handed on in slices of at most `LINE_SLICE_S`: a chunk of a
    hundred thousand empty lines must not hold the loop. Past a slice, reading
    stdout pauses (so at most one chunk waits here, and the CLI blocks on its full
    pipe) and the rest goes on at the loop's next step.
    """

    def __init__(
        self, *, on_line: Callable[[bytes], None], max_line_bytes: int, stderr_tail_bytes: int
    ) -> None:
        self._on_line = on_line
        self._lines = LineSplitter(on_line, max_line_bytes)
        self._stderr = StderrTail(stderr_tail_bytes)
        self._transport: asyncio.SubprocessTransport | None = None
        self._backlog: collections.deque[bytes] = collections.deque()
        self._current: Iterator[bytes] | None = None
        self._stdout_eof = False
        self._stopped = False
        self.exited = asyncio.Event()
        self.stdout_closed = asyncio.Event()
        self.stderr_closed = asyncio.Event()
        self.closed = asyncio.Event()
        self.failed = asyncio.Event()
        self.error: Exception | None = None
        self.ending: asyncio.Future[None] | None = None
        """Resolved by the exit or a callback failure (`runner._Run.wait_for_ending`)."""

    @property
    def cut_lines(self) -> int:
        """Stdout lines over the line limit, dropped unseen."""
        return self._lines.cut

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.SubprocessTransport, transport)

    def pipe_data_received(self, fd: int, data: bytes) -> None:
        if fd == 1:
            self._backlog.append(data)
            if len(self._backlog) == 1:
                self._pump()
        elif fd == 2:
            self._stderr.feed(data)

    def pipe_connection_lost(self, fd: int, exc: Exception | None) -> None:
        if fd == 1:
            self._stdout_eof = True
            if not self._backlog:
                self._close_stdout()
        elif fd == 2:
            self.stderr_closed.set()

    def _pump(self) -> None:
        """Hand on the waiting lines until the backlog is empty or the slice is spent."""
        started = time.perf_counter()
        while self._backlog and self.error is None and not self._stopped:
            if self._current is None:
                self._current = self._lines.lines(self._backlog[0])
            for line in self._current:
                self._deliver_line(line)
                if self.error is None and time.perf_counter() - started > LINE_SLICE_S:
                    self._pause_stdout(True)
                    asyncio.get_running_loop().call_soon(self._pump)
                    return
            self._current = None
            self._backlog.popleft()
        self._backlog.clear()  # after a callback failure: nothing more is read
        if self._stdout_eof:
            self._close_stdout()
        else:
            self._pause_stdout(False)

    def stop_lines(self) -> None:
        """Hand on no more lines (the pipes are being closed under a late writer)."""
        self._stopped = True
        self._backlog.clear()
        self._current = None
        if self._stdout_eof:
            self.stdout_closed.set()

    def _pause_stdout(self, pause: bool) -> None:
        pipe = self._transport.get_pipe_transport(1) if self._transport is not None else None
        if isinstance(pipe, asyncio.ReadTransport) and not pipe.is_closing():
            if pause:
                pipe.pause_reading()
            else:
                pipe.resume_reading()

    def _close_stdout(self) -> None:
        if not self._stopped:
            self._deliver(self._lines.close)
        self.stdout_closed.set()

    def _deliver_line(self, line: bytes) -> None:
        if self.error is not None:
            return
        try:
            self._on_line(line)
        except Exception as exc:
            self._fail(exc)

    def process_exited(self) -> None:
        self.exited.set()
        self._end()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed.set()

    def stderr_tail(self) -> str:
        return self._stderr.text()

    def _deliver(self, step: Callable[[], None]) -> None:
        # A callback error cannot propagate out of a protocol callback: keep it for
        # run_process to re-raise, and stop delivering (the group is being killed).
        if self.error is not None:
            return
        try:
            step()
        except Exception as exc:
            self._fail(exc)

    def _fail(self, exc: Exception) -> None:
        self.error = exc
        self.failed.set()
        self._end()

    def _end(self) -> None:
        if self.ending is not None and not self.ending.done():
            self.ending.set_result(None)


def descriptor_pipes(descriptors: Mapping[str, str], env: dict[str, str]) -> list[int]:
    """A pipe per value, written whole and closed; `env` names each read end. The read
    ends are returned for the child to inherit (and the caller to close after the spawn).

    The write end never blocks: a value that does not fit the pipe at once (64 KiB
    usually, one page when the user's pipe quota is spent) is refused, no credential is.
    """
    read_ends: list[int] = []
    try:
        for name, value in descriptors.items():
            read_end, write_end = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
            read_ends.append(read_end)
            os.set_blocking(read_end, True)  # the CLI reads it as a plain blocking fd
            data = value.encode()
            try:
                written = os.write(write_end, data)
            except BlockingIOError:
                written = 0
            finally:
                os.close(write_end)
            if written != len(data):
                msg = f"the spawn's {name} does not fit a pipe ({len(data)} bytes)"
                raise SpawnTooLarge(msg)
            env[name] = str(read_end)
    except BaseException:
        for fd in read_ends:
            os.close(fd)
        raise
    return read_ends
