"""`text/event-stream`, read a line at a time into the contract's `LiveEvent`s (§6.7).

The format is small enough to read here rather than add a client dependency: a
`field: value` line sets a field, a line starting `:` is a comment (the server's
keep-alive), and a blank line ends an event. Several `data` lines join with `\\n`;
an event with no data is no event; unknown fields are ignored, as the standard says.
Lines end at CR LF, CR or LF only, as the standard says and a browser's EventSource
splits them: not at every break `str.splitlines` knows (U+2028, U+0085, …), which a
line of the agent's could hold to pass for an event of the server's (`text`).
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from agent_server.wire.results import LiveEvent

_LINE_BREAK = re.compile("\r\n|\r|\n")
MAX_LINE_CHARS = 1024 * 1024
"""A longer line is no line of the server's: it is dropped, never held."""


class EventStreamReader:
    """Turns the lines of one event stream into events, one call a line."""

    def __init__(self) -> None:
        self._event: str | None = None
        self._id: str | None = None
        self._retry: int | None = None
        self._data: list[str] = []
        self._partial = ""
        self._after_cr = False

    def text(self, chunk: str) -> Iterator[LiveEvent]:
        """Read a chunk of the stream's text, cut anywhere; the events it completes."""
        buffer = self._partial + chunk
        if self._after_cr and buffer.startswith("\n"):
            buffer = buffer[1:]  # the LF of a CR LF split between two chunks
        self._after_cr = buffer.endswith("\r")
        *lines, self._partial = _LINE_BREAK.split(buffer)
        if len(self._partial) > MAX_LINE_CHARS:
            self._partial = ""
        for line in lines:
            event = self.feed(line)
            if event is not None:
                yield event

    def feed(self, line: str) -> LiveEvent | None:
        """Read one line (without its line break); the event it completes, if any."""
        if not line:
            return self._dispatch()
        if line.startswith(":"):
            return None
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._event = value or None
        elif name == "id" and "\0" not in value:
            self._id = value
        elif name == "retry" and value.isdigit():
            self._retry = int(value)
        return None

    def _dispatch(self) -> LiveEvent | None:
        data, self._data = self._data, []
        event, self._event = self._event, None
        retry, self._retry = self._retry, None
        if not data:
            return None
        return LiveEvent(event=event, id=self._id, data="\n".join(data), retry=retry)
