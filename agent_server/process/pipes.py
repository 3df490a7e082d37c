"""A CLI's pipes: stdout as bounded lines, stderr as a safe tail, credentials on descriptors.

Stdout and stderr work on chunks as they arrive, so nothing buffers more than one
line (at most `max_line_bytes`) or the tail's limit, however fast the CLI prints.
A credential the CLI takes on a descriptor is written to a pipe of its own before
the spawn (contract §4.7).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping

from agent_server.errors import SpawnTooLarge


class LineSplitter:
    """Splits stdout chunks into lines, dropping any line longer than the limit."""

    def __init__(self, on_line: Callable[[bytes], None], max_line_bytes: int) -> None:
        self._on_line = on_line
        self._max = max_line_bytes
        self._partial = bytearray()
        # True while inside an over-long line: its bytes are skipped until its newline.
        self._discarding = False

    def feed(self, chunk: bytes) -> None:
        view = memoryview(chunk)
        start = 0
        while True:
            newline = chunk.find(b"\n", start)
            end = len(chunk) if newline < 0 else newline
            whole = newline >= 0 and not self._partial and not self._discarding
            if whole and end - start <= self._max:  # the usual line, in one chunk: one copy
                self._on_line(chunk[start:end])
                start = newline + 1
                continue
            if not self._discarding:
                if len(self._partial) + (end - start) > self._max:
                    # Too long: forget what we held and skip the rest of it.
                    self._partial = bytearray()
                    self._discarding = True
                else:
                    self._partial += view[start:end]
            if newline < 0:
                return
            if self._discarding:
                self._discarding = False
            else:
                line = bytes(self._partial)
                self._partial.clear()
                self._on_line(line)
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
