"""A turn's live progress: its CLI events as they arrive, for `GET …/events` (contract §6.7).

Each line the CLI prints (already redacted on arrival) becomes one event named by the
line's own `type` (`system`, `assistant`, `user`, `rate_limit_event`, `result`, …;
`line` when it names none), its data the line itself. A line past
`MAX_EVENT_BYTES` (a tool's whole output, say) is summed up as its type and size.
The history is bounded (`MAX_EVENTS`, `MAX_HISTORY_BYTES`, oldest dropped first), so
a late subscriber gets what is left of it, then live events, then `terminal`.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import json
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass

MAX_EVENTS = 1024
MAX_HISTORY_BYTES = 256 * 1024
MAX_EVENT_BYTES = 16 * 1024
TERMINAL = "terminal"
_TYPE = re.compile(rb'"type"\s*:\s*"([A-Za-z0-9_.]{1,40})"')


@dataclass(frozen=True)
class ProgressEvent:
    """One server-sent event: its sequence number (from 1), name and JSON data."""

    seq: int
    name: str
    data: str


class Progress:
    """One turn's events: a bounded history and a wake-up for the subscribers."""

    def __init__(self) -> None:
        self._events: collections.deque[ProgressEvent] = collections.deque()
        self._bytes = 0
        self._seq = 0
        self._wake: asyncio.Event | None = None
        """Set by the next event; made only when a subscriber waits (usually none does)."""
        self.closed = False

    def add_line(self, line: bytes) -> None:
        """Record one (redacted) stdout line of the CLI."""
        found = _TYPE.search(line, 0, 512)
        name = found.group(1).decode() if found else "line"
        if len(line) > MAX_EVENT_BYTES:
            data = json.dumps({"type": name, "clipped": True, "bytes": len(line)})
        else:
            data = line.decode("utf-8", errors="replace")
        self._add(name, data)

    def close(self, terminal: dict[str, object]) -> None:
        """Record the turn's end (status, HTTP status, error code); no event follows."""
        if not self.closed:
            data = json.dumps({"type": TERMINAL, **terminal}, separators=(",", ":"))
            self._add(TERMINAL, data)
            self.closed = True

    async def follow(self, after: int = 0) -> AsyncIterator[ProgressEvent]:
        """Every event past `after` still held, then each new one, until the terminal."""
        while True:
            wake = self._wake = self._wake or asyncio.Event()
            first = self._events[0].seq if self._events else self._seq + 1
            for event in list(itertools.islice(self._events, max(0, after + 1 - first), None)):
                after = event.seq
                yield event
            if after < self._seq:  # more came while the subscriber was busy
                continue
            if self.closed:
                return
            await wake.wait()

    def _add(self, name: str, data: str) -> None:
        self._seq += 1
        self._events.append(ProgressEvent(self._seq, name, data))
        self._bytes += len(data)
        while len(self._events) > MAX_EVENTS or (
            self._bytes > MAX_HISTORY_BYTES and len(self._events) > 1
        ):
            self._bytes -= len(self._events.popleft().data)
        wake, self._wake = self._wake, None
        if wake is not None:
            wake.set()
