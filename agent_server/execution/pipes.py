"""What the runner makes of a CLI's pipes: stdout as bounded lines, stderr as a safe tail.

Both work on chunks as they arrive, so nothing buffers more than one line (at most
`max_line_bytes`) or the tail's limit, however fast the CLI prints.
"""

from __future__ import annotations

from collections.abc import Callable


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
