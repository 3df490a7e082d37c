"""A turn's live progress: its CLI events as they arrive, for `GET …/events` (contract §6.7).

Each line the CLI prints (already redacted on arrival) becomes one event named by the
line's own `type` (`system`, `assistant`, `user`, `rate_limit_event`, `result`, …;
`line` when it names none), its data the line itself. A line past
`MAX_EVENT_BYTES` (a tool's whole output, say) is summed up as its type and size.
The history is bounded (`MAX_EVENTS`, `MAX_HISTORY_BYTES`, oldest dropped first), so
a late subscriber gets what is left of it, then live events, then `terminal`.

The server's own event types (`SERVER_EVENT_TYPES`) are reserved: no CLI line is named
with one, and a line a JSON reader could see one in, as a `type` of any object of it,
is withheld (summed up as its size), so that neither a reader that takes the first of
two keys nor a later redaction that masks part of the line can make it the server's.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import json
import re
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

MAX_EVENTS = 1024
MAX_HISTORY_BYTES = 256 * 1024
MAX_EVENT_BYTES = 16 * 1024
TERMINAL = "terminal"
"""The last event of `…/events`: how the turn ended."""
STREAM_END = "stream_end"
"""The last event of `…/stream`, after the terminal (Trinity's shape)."""
SERVER_EVENT_TYPES = frozenset({TERMINAL, STREAM_END})
"""Only the server emits these: no CLI line is named with one or carries one."""
_TYPE = re.compile(rb'"type"\s*:\s*"([A-Za-z0-9_.]{1,40})"')
_SUBTYPE = re.compile(rb'"subtype"\s*:\s*"([A-Za-z0-9_.]{1,40})"')
_JSON_SPACE = " \t\r\n\ufeff"


def _last_event(name: str, line: bytes) -> str:
    """`name`, or `name/subtype` for a system event (`system/api_retry`)."""
    if name != "system":
        return name
    found = _SUBTYPE.search(line, 0, 512)
    return f"{name}/{found.group(1).decode()}" if found else name


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
        self.last: tuple[str, float] | None = None
        """The CLI's last event (`type`, or `type/subtype` for a system event such as
        `system/api_retry`) and when it came (`time.time()`): a turn stuck in its
        CLI's own retries shows as such in the running list."""
        self.tool: tuple[str, str | None] | None = None
        """The last tool the CLI called and a summary of its input (the heartbeat's)."""

    def add_line(self, line: bytes) -> None:
        """Record one (redacted) stdout line of the CLI."""
        found = _TYPE.search(line, 0, 512)
        name = found.group(1).decode() if found else "line"
        if name in SERVER_EVENT_TYPES:
            name = "line"
        self.last = (_last_event(name, line), time.time())
        if name == "assistant" and b'"tool_use"' in line and len(line) <= MAX_EVENT_BYTES:
            self.tool = _last_tool(line) or self.tool
        if len(line) > MAX_EVENT_BYTES:
            data = json.dumps({"type": name, "clipped": True, "bytes": len(line)})
        else:
            data = line.decode("utf-8", errors="replace")
            if claims_server_type(data):
                name = "line"
                data = json.dumps({"type": name, "withheld": True, "bytes": len(line)})
            else:
                data = _unescaped(data)
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


def claims_server_type(data: str) -> bool:
    """Whether a JSON reader could see one of `SERVER_EVENT_TYPES` as a `type` in `data`,
    now or once a later redaction has masked part of it.

    A mask adds only `[REDACTED]`: it cannot spell a reserved word nor start an object,
    and it can bring a nested `type` to the top (by masking a brace) but not make one;
    so a line that is no object, or that holds neither a reserved word nor a `\\u`
    escape (which could spell one), is safe as it is. Any other is read, and refused
    when it fails to parse or when any object in it has a reserved `type`.
    """
    if not data.lstrip(_JSON_SPACE).startswith("{"):
        return False
    if "\\u" not in data and not any(word in data for word in SERVER_EVENT_TYPES):
        return False
    try:
        json.loads(data, object_pairs_hook=_refuse_server_type)
    except (ValueError, RecursionError):
        return True
    return False


def _unescaped(data: str) -> str:
    """`data`, a JSON line holding `\\u` escapes, written again as JSON writes it.

    Its value is the same; but a secret the CLI printed with every character escaped
    is now spelt as the redactor knows it (and as the answer, which parses the line,
    shows it), so the live event masks it too.
    """
    if "\\u" not in data or not data.lstrip(_JSON_SPACE).startswith("{"):
        return data
    try:
        return json.dumps(json.loads(data), separators=(",", ":"))
    except (ValueError, RecursionError):
        return data


class _ServerType(ValueError):
    """An object of the line has a reserved `type`."""


def _refuse_server_type(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    for key, value in pairs:
        if key == "type" and isinstance(value, str) and value in SERVER_EVENT_TYPES:
            raise _ServerType
    return dict(pairs)


def _last_tool(line: bytes) -> tuple[str, str | None] | None:
    """The last `tool_use` block of an assistant line: its name and input summary."""
    try:
        content = json.loads(line)["message"]["content"]
    except (ValueError, KeyError, TypeError):
        return None
    found = None
    for block in content if isinstance(content, list) else []:
        if isinstance(block, dict) and block.get("type") == "tool_use":
            tool_input = block.get("input")
            summary = None
            if isinstance(tool_input, dict):
                for key in ("description", "command", "file_path", "pattern", "url"):
                    if isinstance(tool_input.get(key), str):
                        summary = tool_input[key][:512]
                        break
            found = (str(block.get("name"))[:512], summary)
    return found
