"""A CLI's connection to the broker: its requests parsed, each one handled in turn.

httptools (the C parser uvicorn uses) reads each request: its method, target and
headers, and its body up to the bound (past it, the request is answered without
the rest being read, and the connection closes). Requests are handled one at a time
in their order; reading stops while one is handled, so a CLI cannot queue more.
While the CLI reads an answer slower than it comes, its `producer` (the upstream's
connection) is paused.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

import httptools

logger = logging.getLogger("agent_server.broker")

MAX_HEAD_BYTES = 64 * 1024
"""A request's target and headers: Claude Code's are about 2 KiB."""


@dataclass(frozen=True)
class Request:
    """One request of a CLI, whole (`body` None: it was over the bound, and not read)."""

    method: str
    target: bytes
    """The path and query, as the CLI sent them."""
    headers: list[tuple[bytes, bytes]]
    body: bytes | None
    keep_alive: bool


class Producer(Protocol):
    """What feeds an answer to the CLI (the upstream's connection)."""

    def pause_reading(self) -> None:
        """Stop reading: the CLI's side is full."""

    def resume_reading(self) -> None:
        """Read again: the CLI's side drained."""


Handler = Callable[[Request, "CliConnection"], Awaitable[None]]


class CliConnection(asyncio.Protocol):
    """One CLI's connection; `handler` answers each of its requests through `write`."""

    def __init__(
        self, handler: Handler, max_body: int, live: set[CliConnection] | None = None
    ) -> None:
        self.handler = handler
        self.max_body = max_body
        self._live = live if live is not None else set()
        self.transport: asyncio.Transport | None = None
        self.producer: Producer | None = None
        self._paused = False
        self._parser = httptools.HttpRequestParser(self)
        self._queue: deque[Request] = deque()
        self._worker: asyncio.Task[None] | None = None
        self._ignoring = False
        self._begin()

    # asyncio's side

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)  # noqa: S101 - a stream socket's
        self.transport = transport
        self._live.add(self)

    def data_received(self, data: bytes) -> None:
        if self._ignoring:
            return
        try:
            self._parser.feed_data(data)
        except (httptools.HttpParserError, httptools.HttpParserUpgrade):
            self._ignoring = True
            self._queue.clear()
            if self._worker is not None:  # an answer is on its way: a 400 would break into it
                self.abort()
                return
            self.write(_BAD_REQUEST)
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self._live.discard(self)
        self._ignoring = True
        self._queue.clear()
        if self._worker is not None:
            self._worker.cancel()
        self.transport = None

    def pause_writing(self) -> None:
        self._paused = True
        if self.producer is not None:
            self.producer.pause_reading()

    def resume_writing(self) -> None:
        self._paused = False
        if self.producer is not None:
            self.producer.resume_reading()

    # the handler's side

    def write(self, data: bytes) -> None:
        """Send bytes of the answer (buffered by the transport, never blocking)."""
        if self.transport is not None:
            self.transport.write(data)

    def feed_from(self, producer: Producer | None) -> None:
        """Name what feeds the answer now; it is paused at once if the CLI is behind."""
        self.producer = producer
        if producer is not None and self._paused:
            producer.pause_reading()

    def close(self) -> None:
        """Close after what was written is sent."""
        if self.transport is not None:
            self.transport.close()

    def abort(self) -> None:
        """Cut the connection (an answer cut short must not look whole to the CLI)."""
        if self.transport is not None:
            self.transport.abort()

    # httptools' callbacks

    def _begin(self) -> None:
        self._head_bytes = 0
        self._target = bytearray()
        self._headers: list[tuple[bytes, bytes]] = []
        self._body: bytearray | None = bytearray()

    def on_message_begin(self) -> None:
        self._begin()

    def on_url(self, url: bytes) -> None:
        self._target += url
        self._count_head(len(url))

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers.append((name, value))
        self._count_head(len(name) + len(value))

    def _count_head(self, size: int) -> None:
        """Bound what a request's head may hold (httptools itself bounds nothing)."""
        self._head_bytes += size
        if self._head_bytes > MAX_HEAD_BYTES:
            msg = "the request's head is too long"
            raise httptools.HttpParserError(msg)

    def on_headers_complete(self) -> None:
        for name, value in self._headers:
            too_long = value.isdigit() and int(value) > self.max_body
            if too_long and name.lower() == b"content-length":
                self._over_bound()

    def on_body(self, body: bytes) -> None:
        if self._body is None:
            return
        if len(self._body) + len(body) > self.max_body:
            self._over_bound()
            return
        self._body += body

    def on_message_complete(self) -> None:
        if self._body is not None:
            self._dispatch(bytes(self._body), self._parser.should_keep_alive())

    def _over_bound(self) -> None:
        """Answer now, without the rest of the body; nothing after it is read."""
        self._body = None
        self._dispatch(None, keep_alive=False)
        self._ignoring = True

    def _dispatch(self, body: bytes | None, keep_alive: bool) -> None:
        if self._ignoring:
            return
        method = self._parser.get_method().decode("ascii")
        self._queue.append(Request(method, bytes(self._target), self._headers, body, keep_alive))
        if self.transport is not None:
            self.transport.pause_reading()
        if self._worker is None:
            self._worker = asyncio.get_running_loop().create_task(self._serve())

    async def _serve(self) -> None:
        """Handle the queued requests in order; read again when none is left."""
        try:
            while self._queue:
                request = self._queue.popleft()
                try:
                    await self.handler(request, self)
                except Exception:  # a fault of the broker's own: this CLI's connection ends
                    logger.exception("broker: a request failed")
                    self._ignoring = True
                    self.abort()
                    return
                self.feed_from(None)
                if not request.keep_alive:
                    self._ignoring = True
                    self.close()
                    return
        finally:
            self._worker = None
        if self.transport is not None and not self._ignoring:
            self.transport.resume_reading()


_BAD_REQUEST = (
    b"HTTP/1.1 400 Bad Request\r\ncontent-type: text/plain\r\n"
    b"content-length: 11\r\nconnection: close\r\n\r\nbad request"
)
