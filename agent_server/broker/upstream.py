"""One HTTP/1.1 connection to an upstream: a request out, its answer's head, its body relayed.

An asyncio protocol rather than a stream: each read of the upstream's socket is
written to the CLI's connection in the same callback (no task switch, no copy but
the kernel's), and only the body's framing is parsed, to find its end. Flow control
holds both ways: while the CLI reads slower than the upstream writes, the upstream's
socket is not read, and a body read before it has somewhere to go is bounded.

The first bytes of a refusal's body are kept decoded (`kept`), for the exchange.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import httptools

from agent_server.broker.exchange import ERROR_BODY_BYTES
from agent_server.broker.framing import BodyFraming, FramingError

MAX_HEAD_BYTES = 64 * 1024
"""An answer's status line and headers: an API's are about 2 KiB."""
READ_TIMEOUT_S = 600.0
"""A streamed answer may pause between events for minutes (extended thinking)."""
_HELD_BYTES = 256 * 1024
"""A body read before its relay starts (a refusal's first bytes): reading pauses past it."""


class UpstreamError(ConnectionError):
    """The upstream gave no usable answer: unreachable, cut off, or not HTTP/1.1."""


class Sink(Protocol):
    """Where a relayed body goes: the CLI's connection."""

    def write(self, data: bytes) -> None:
        """Send `data` on (never blocks: the transport buffers and applies flow control)."""


@dataclass(frozen=True)
class AnswerHead:
    """An answer's status line and headers, as the upstream sent them."""

    status: int
    reason: bytes
    headers: list[tuple[bytes, bytes]]
    keep_alive: bool


class _HeadParts:
    """httptools' callbacks for one answer head."""

    def __init__(self) -> None:
        self.reason = b""
        self.headers: list[tuple[bytes, bytes]] = []

    def on_status(self, status: bytes) -> None:
        self.reason += status

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name, value))


class UpstreamConnection(asyncio.Protocol):
    """One kept-alive connection; one request at a time."""

    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.reusable = False
        """True once an answer ended cleanly on a connection the upstream keeps open."""
        self.served = 0
        self.kept = bytearray()
        self._head: asyncio.Future[AnswerHead] | None = None
        self._done: asyncio.Future[None] | None = None
        self._buffer = bytearray()
        self._framing: BodyFraming | None = None
        self._keep_alive = False
        self._capture = False
        self._sink: Sink | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._bodiless = False
        self._before_end: Callable[[], None] | None = None
        self._last_read = 0.0
        self._watchdog: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)  # noqa: S101 - a stream socket's
        self.transport = transport

    def send(self, head: bytes, body: bytes, *, bodiless: bool) -> asyncio.Future[AnswerHead]:
        """Write one request; the future is its answer's head (`bodiless`: a HEAD request)."""
        assert self.transport is not None  # noqa: S101 - `dial` answers connected protocols
        self.reusable, self.kept = False, bytearray()
        self._buffer.clear()
        self._framing, self._sink, self._before_end = None, None, None
        self._bodiless = bodiless
        self._head = self.loop.create_future()
        self._done = self.loop.create_future()
        for future in (self._head, self._done):  # a request given up leaves its failure unread
            future.add_done_callback(_read_failure)
        self.served += 1
        # The last answer's end may have left reading paused (its CLI was behind).
        self.transport.resume_reading()
        self.transport.write(head + body if len(body) < 65536 else head)
        if len(body) >= 65536:  # a long conversation: not copied whole once more
            self.transport.write(body)
        self._read_at()
        return self._head

    def relay(self, sink: Sink, before_end: Callable[[], None]) -> asyncio.Future[None]:
        """Relay the body to `sink` from its first byte; `before_end` runs before its last
        bytes go. The future ends with the body (an `UpstreamError` if it was cut short)."""
        assert self._done is not None and self.transport is not None  # noqa: S101
        held = bytes(self._buffer)
        self._buffer.clear()
        if self._framing is not None and self._framing.done:
            before_end()
        if held:
            sink.write(held)
        if not self._done.done():
            self._sink, self._before_end = sink, before_end
            self.transport.resume_reading()
        return self._done

    async def read_refusal(self) -> bytes:
        """Wait until the refusal's first `ERROR_BODY_BYTES` (decoded of chunks) or its
        whole body arrived; answer them (its raw bytes stay held for `relay`)."""
        assert self._done is not None  # noqa: S101
        while not self._done.done() and len(self.kept) < ERROR_BODY_BYTES:
            self._waiter = self.loop.create_future()
            await asyncio.wait((self._waiter, self._done), return_when=asyncio.FIRST_COMPLETED)
        self._waiter = None
        if self._done.done() and self._done.exception() is not None:
            raise UpstreamError(str(self._done.exception()))
        return bytes(self.kept)

    @property
    def until_close(self) -> bool:
        """True when the answer's body ends only with the connection."""
        return self._framing is not None and self._framing.until_close

    def close(self) -> None:
        """Drop the connection (an answer not read to its end leaves it unusable)."""
        self.reusable = False
        if self.transport is not None:
            self.transport.abort()

    def data_received(self, data: bytes) -> None:
        self._last_read = self.loop.time()
        if self._framing is None:
            self._head_bytes(data)
        else:
            self._body_bytes(data)

    def eof_received(self) -> bool:
        return False  # the transport closes, and `connection_lost` settles the answer

    def connection_lost(self, exc: Exception | None) -> None:
        self.reusable = False
        if self._watchdog is not None:
            self._watchdog.cancel()
        if self._head is not None and not self._head.done():
            self._head.set_exception(UpstreamError("the upstream closed before answering"))
        elif self._framing is not None and self._done is not None and not self._done.done():
            try:
                self._framing.feed_eof()
            except FramingError as cut:
                self._done.set_exception(UpstreamError(str(cut)))
                return
            if self._before_end is not None:
                self._before_end()
            self._finish()

    def pause_reading(self) -> None:
        """The CLI's buffer is full: stop reading the upstream until it drains."""
        if self.transport is not None:
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        """The CLI drained its buffer: read the upstream again."""
        self._last_read = self.loop.time()
        if self.transport is not None:
            self.transport.resume_reading()

    def _head_bytes(self, data: bytes) -> None:
        """Gather the answer's head; parse it once whole, and pass on what follows it."""
        self._buffer += data
        end = self._buffer.find(b"\r\n\r\n")
        if end < 0:
            if len(self._buffer) > MAX_HEAD_BYTES:
                self._fail("the upstream's answer head is too long")
            return
        raw, rest = bytes(self._buffer[: end + 4]), bytes(self._buffer[end + 4 :])
        self._buffer.clear()
        try:
            head = _parse_head(raw)
            if 100 <= head.status < 200:  # an interim answer (100 Continue): the final follows
                if rest:
                    self._head_bytes(rest)
                return
            self._framing = _framing_of(head, bodiless=self._bodiless)
        except (httptools.HttpParserError, ValueError) as broken:
            self._fail(f"the upstream's answer head is not HTTP/1.1: {broken}")
            return
        self._keep_alive = head.keep_alive and not self._framing.until_close
        self._capture = head.status >= 400
        if self._head is None or self._head.done():  # its request was given up
            self.close()
            return
        self._head.set_result(head)
        if rest or self._framing.done:
            self._body_bytes(rest)

    def _body_bytes(self, data: bytes) -> None:
        """Pass the body's bytes on (or hold them), and settle the answer at its end."""
        framing = self._framing
        assert framing is not None  # noqa: S101
        try:
            taken = framing.feed(data, self.kept if self._capture else None, ERROR_BODY_BYTES)
        except FramingError as broken:
            self._fail(str(broken))
            return
        if taken < len(data):
            data = data[:taken]
            self._keep_alive = False  # bytes past the answer's end: the connection is unsafe
        if framing.done and self._before_end is not None:
            self._before_end()
        if self._sink is not None:
            self._sink.write(data)
        else:
            self._buffer += data
            if len(self._buffer) > _HELD_BYTES and self.transport is not None:
                self.transport.pause_reading()
            if self._waiter is not None and not self._waiter.done():
                self._waiter.set_result(None)
        if framing.done:
            self._finish()

    def _finish(self) -> None:
        self.reusable = self._keep_alive and self.transport is not None
        self._sink, self._before_end = None, None
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._watchdog = None
        if self._done is not None and not self._done.done():
            self._done.set_result(None)

    def _fail(self, why: str) -> None:
        failure = UpstreamError(why)
        for future in (self._head, self._done):
            if future is not None and not future.done():
                future.set_exception(failure)
        self.close()

    def _read_at(self) -> None:
        """Arm the read timeout: a request waits at most `READ_TIMEOUT_S` between bytes."""
        self._last_read = self.loop.time()
        if self._watchdog is None:
            self._watchdog = self.loop.call_later(READ_TIMEOUT_S, self._check_reads)

    def _check_reads(self) -> None:
        self._watchdog = None
        idle = self.loop.time() - self._last_read
        if idle >= READ_TIMEOUT_S:
            self._fail("the upstream sent nothing for too long")
        elif self._done is not None and not self._done.done():
            self._watchdog = self.loop.call_later(READ_TIMEOUT_S - idle, self._check_reads)


def _read_failure(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()


def _parse_head(raw: bytes) -> AnswerHead:
    """An answer head (status line and headers, through the empty line) parsed strictly."""
    parts = _HeadParts()
    parser = httptools.HttpResponseParser(parts)
    parser.feed_data(raw)
    return AnswerHead(
        parser.get_status_code(), parts.reason, parts.headers, parser.should_keep_alive()
    )


def _framing_of(head: AnswerHead, *, bodiless: bool) -> BodyFraming:
    """How the answer's body is framed (RFC 9112 §6.3): none, chunked, a length, or the close."""
    chunked, lengths = False, set()
    for name, value in head.headers:
        lowered = name.lower()
        if lowered == b"transfer-encoding":
            chunked = value.rsplit(b",", 1)[-1].strip().lower() == b"chunked"
        elif lowered == b"content-length":
            lengths.add(value.strip())
    if len(lengths) > 1 or not all(length.isdigit() for length in lengths):
        msg = "the answer's content-length is not one number"
        raise ValueError(msg)
    empty = bodiless or head.status in (204, 304)
    length = int(next(iter(lengths))) if lengths and not chunked else None
    return BodyFraming(empty=empty, chunked=chunked, length=length)
