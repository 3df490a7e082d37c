"""Slow clients are bounded (contract §8): uvicorn's httptools protocol with a deadline a phase.

uvicorn closes an idle keep-alive connection (`timeout_keep_alive`), but that timer
is cancelled by the first byte a client sends, and nothing bounds how long the
request's headers or body may take: a client that trickles them holds its
connection, and the socket the image listens on (0.0.0.0) is unauthenticated. Its
`limit_concurrency` answers 503, which the controller reads as an auth failure
(and a 429 would read as a rate limit): it would walk its credential pool.

So each connection carries one timer, and is in one of three phases:

- *headers*: from the connection's start, and again from each response's end,
  until a request's headers are complete: `HEADER_TIMEOUT_S` in all.
- *body*: the headers are in, the body is not: `BODY_TIMEOUT_S` in all (a deadline,
  not an idle timeout, so a body trickled a byte at a time ends too).
- *app*: the request is whole and the app runs (a turn may last an hour): no limit.

A request's head is bounded in size too: the parser keeps a head until it is whole,
so past `MAX_HEAD_BYTES` still incomplete it is a 400 and the connection closes
(h11, which this protocol replaced for its speed, bounded it itself).

Each answer also leaves in one write: uvicorn writes a response's head and its body
separately, two TCP segments on a `TCP_NODELAY` socket, which wake the client twice.
The response's writes are held and written together when the response completes
(or, for a response still streaming, at the end of the loop's step); past 64 KiB
they are written as they are, since joining them would copy the answer.

One more deadline runs beside the phases: a client that stops reading its answer
(the transport holds more than its high-water mark of it, so it paused our writes)
for `SEND_TIMEOUT_S` is reset. That also ends a live-event stream nobody reads.

When a deadline passes the connection is closed; a client that was sending its body
makes the app see a disconnect. Either way the client gets no HTTP answer: never a
503 or a 429, which the controller would act on.

The connection cap keeps room for the controller, which may share the loopback with
the agent. A connection is *anonymous* until a request on it carries the controller
token (the auth middleware calls `mark()` of the `AUTHENTICATED_CONNECTION` scope
extension); from then on it keeps its slot (up to `max_connections` authenticated
connections). At `ClientLimits.max_connections` anonymous connections, a new one
resets the oldest anonymous one, whatever it is doing: idle connections cannot keep
anyone out, and neither can anonymous answers left unread (the only ones are /health,
/metrics and 401s, each answered at once).
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import socket
import struct
from dataclasses import dataclass
from typing import Any, ClassVar, cast

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from agent_server.wire.names import AUTHENTICATED_CONNECTION

logger = logging.getLogger("agent_server.client_limits")

HEADER_TIMEOUT_S = 10.0
"""From a connection's start (or its last response's end) until a request's headers are in."""
BODY_TIMEOUT_S = 30.0
"""From a request's headers until its whole body is in (16 MiB at most: >= 560 KB/s)."""
SEND_TIMEOUT_S = 30.0
"""How long a client may leave its answer unread (our writes paused) before it is reset."""
MIN_CONNECTIONS = 256
"""The connection cap never goes below this."""
CONNECTIONS_PER_TURN = 4
"""Connections allowed per turn slot: the turn's own, and the controller's other calls."""
MAX_HEAD_BYTES = 64 * 1024
"""A request head still incomplete past this many bytes is a 400 (one read more may be
held: the read that started the head is not counted)."""


def connection_cap(max_parallel: int) -> int:
    """How many anonymous connections (and as many authenticated) may be open at once for
    `max_parallel` turn slots."""
    return max(MIN_CONNECTIONS, CONNECTIONS_PER_TURN * max_parallel)


@dataclass(frozen=True)
class ClientLimits:
    """The deadlines of a request's headers and body and of an unread answer, and the
    connection cap (of anonymous connections, and of authenticated ones)."""

    header_timeout_s: float = HEADER_TIMEOUT_S
    body_timeout_s: float = BODY_TIMEOUT_S
    max_connections: int = MIN_CONNECTIONS
    send_timeout_s: float = SEND_TIMEOUT_S

    @classmethod
    def for_max_parallel(cls, max_parallel: int) -> ClientLimits:
        """The product's limits: the default deadlines, the cap derived from the turn slots."""
        return cls(max_connections=connection_cap(max_parallel))


class Phase(enum.Enum):
    """Where a connection is in its current request."""

    HEADERS = "headers"
    BODY = "body"
    APP = "app"


class _Slots:
    """The open connections by standing, and how many were closed to make room."""

    def __init__(self) -> None:
        self.anonymous: dict[GuardedProtocol, None] = {}
        """Connections no request has yet proved the controller token on, oldest first."""
        self.authenticated: set[GuardedProtocol] = set()
        self.closed = 0
        """Anonymous connections closed to make room since the cap was reached (one log a spell)."""


class GuardedProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with the header, body and send deadlines, the head's
    size bound and the connection cap.

    Use `guarded_protocol(limits)`: it binds the limits to a subclass of this.
    """

    limits: ClassVar[ClientLimits] = ClientLimits()
    _slots: ClassVar[_Slots] = _Slots()

    _phase: Phase | None = None
    _timer: asyncio.TimerHandle | None = None
    _unread: asyncio.TimerHandle | None = None
    _head_open: bool = False
    _head_bytes: int = 0

    @property
    def phase(self) -> Phase | None:
        """The connection's phase (None once it is closed)."""
        return self._phase

    @property
    def authenticated(self) -> bool:
        """Whether a request on this connection proved the controller token (it keeps its slot)."""
        return self in self._slots.authenticated

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        """At the cap, close the oldest anonymous connection; start the header deadline."""
        slots = self._slots
        if len(slots.anonymous) >= self.limits.max_connections:
            self._make_room()
        elif slots.closed:
            logger.warning(
                "below the connection cap again: %d connections without the controller token "
                "were closed to make room",
                slots.closed,
            )
            slots.closed = 0
        super().connection_made(transport)  # type: ignore[arg-type]
        slots.anonymous[self] = None
        self._enter(Phase.HEADERS)

    def mark_authenticated(self) -> None:
        """A request on this connection proved the controller token: it keeps its slot
        (while the authenticated connections are under their cap)."""
        slots = self._slots
        if self in slots.anonymous and len(slots.authenticated) < self.limits.max_connections:
            del slots.anonymous[self]
            slots.authenticated.add(self)

    def data_received(self, data: bytes) -> None:
        """uvicorn's, then follow the request; a head that grows past `MAX_HEAD_BYTES`
        unfinished is a 400."""
        open_before = self._head_open
        super().data_received(data)
        if self._head_open and open_before and not self.transport.is_closing():
            self._head_bytes += len(data)
            if self._head_bytes > MAX_HEAD_BYTES:
                logger.info(
                    "closed a connection from %s: a request head over %d bytes",
                    _address(self.client),
                    MAX_HEAD_BYTES,
                )
                self.send_400_response("Request headers too large.")
        self._follow()

    def on_message_begin(self) -> None:
        """uvicorn's (a request's scope, which gets the `mark()` of this connection); a
        head starts."""
        super().on_message_begin()
        self.scope["extensions"] = {AUTHENTICATED_CONNECTION: {"mark": self.mark_authenticated}}
        self._head_open, self._head_bytes = True, 0

    def on_headers_complete(self) -> None:
        """uvicorn's (a request cycle starts), its writes held to leave in one."""
        self._head_open = False
        super().on_headers_complete()
        cycle = self.cycle
        if cycle is not None and not isinstance(cycle.transport, _OneWrite):
            cycle.transport = cast(asyncio.Transport, _OneWrite(cycle.transport, self.loop))

    def on_response_complete(self) -> None:
        """Write the answer; uvicorn's (it may start a pipelined request); the next deadline."""
        if self.cycle is not None and isinstance(self.cycle.transport, _OneWrite):
            self.cycle.transport.flush()
        super().on_response_complete()
        self._follow()

    def pause_writing(self) -> None:
        """uvicorn's (the answer waits); the client has `send_timeout_s` to read some of it."""
        super().pause_writing()
        if self._unread is None:
            self._unread = self.loop.call_later(self.limits.send_timeout_s, self._unread_expired)

    def resume_writing(self) -> None:
        """uvicorn's (the client read); no send deadline until the next pause."""
        super().resume_writing()
        self._stop_unread()

    def connection_lost(self, exc: Exception | None) -> None:
        """Stop the timers and give up the slot; uvicorn's own bookkeeping."""
        self._stop()
        self._stop_unread()
        self._slots.anonymous.pop(self, None)
        self._slots.authenticated.discard(self)
        super().connection_lost(exc)

    def _make_room(self) -> None:
        slots = self._slots
        oldest = next(iter(slots.anonymous))
        del slots.anonymous[oldest]
        if not slots.closed:
            logger.warning(
                "%d connections without the controller token are open, the cap: "
                "each new connection closes the oldest of them",
                self.limits.max_connections,
            )
        slots.closed += 1
        oldest._reset()

    def _unread_expired(self) -> None:
        self._unread = None
        logger.info(
            "closed a connection from %s: it read none of its answer for %g s",
            _address(self.client),
            self.limits.send_timeout_s,
        )
        self._reset()

    def _stop_unread(self) -> None:
        if self._unread is not None:
            self._unread.cancel()
            self._unread = None

    def _reset(self) -> None:
        # A reset, not a close: a close would leave the kernel still trying to deliver
        # what is left of our answer to a client that does not read it.
        with contextlib.suppress(OSError, AttributeError):
            linger = struct.pack("ii", 1, 0)
            self.transport.get_extra_info("socket").setsockopt(
                socket.SOL_SOCKET, socket.SO_LINGER, linger
            )
        self.transport.abort()

    def _current(self) -> Phase:
        cycle = self.cycle
        if cycle is None or cycle.response_complete:
            return Phase.HEADERS
        return Phase.BODY if cycle.more_body else Phase.APP

    def _follow(self) -> None:
        if self.transport.is_closing():
            self._stop()
            return
        phase = self._current()
        if phase is not self._phase:
            self._enter(phase)

    def _enter(self, phase: Phase) -> None:
        self._stop()
        self._phase = phase
        if phase is Phase.HEADERS:
            self._timer = self.loop.call_later(self.limits.header_timeout_s, self._expire, phase)
        elif phase is Phase.BODY:
            self._timer = self.loop.call_later(self.limits.body_timeout_s, self._expire, phase)

    def _stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._phase = None

    def _expire(self, phase: Phase) -> None:
        self._timer = None
        if self.transport.is_closing():
            return
        if phase is Phase.HEADERS:
            why = f"no complete request headers within {self.limits.header_timeout_s:g} s"
        else:
            why = f"the request body was not complete within {self.limits.body_timeout_s:g} s"
        logger.info("closed a connection from %s: %s", _address(self.client), why)
        # abort, not close: close would first flush whatever is left of our last answer,
        # to a client that may have stopped reading. (An idle kept-alive connection is
        # closed gracefully by uvicorn's own keep-alive timeout, 5 s, before this fires.)
        self.transport.abort()


_JOIN_BYTES = 64 * 1024
"""Held writes up to this many bytes in all are joined into one."""


class _OneWrite:
    """A request's view of its connection's transport: writes are held, then written as one.

    `flush` writes what is held (the protocol calls it when the response is
    complete); a response that is still streaming is flushed at the end of the
    loop's step. `close` flushes first. Everything else is the transport's.
    """

    def __init__(self, transport: Any, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._held: list[bytes] = []

    def write(self, data: bytes) -> None:
        """Hold `data` until the response completes or the loop's step ends."""
        if not data:
            return
        self._held.append(data)
        if len(self._held) == 1:
            self._loop.call_soon(self.flush)

    def flush(self) -> None:
        """Write whatever is held: in one write, unless joining would copy a large answer
        (it takes many segments anyway)."""
        held, self._held = self._held, []
        if held and not self._transport.is_closing():
            if sum(map(len, held)) <= _JOIN_BYTES:
                self._transport.write(b"".join(held))
            else:
                for data in held:
                    self._transport.write(data)

    def close(self) -> None:
        """Flush, then close the transport (which sends what it buffered, then closes)."""
        self.flush()
        self._transport.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


def _address(client: tuple[str, int] | None) -> str:
    return f"{client[0]}:{client[1]}" if client else "an unknown client"


def guarded_protocol(limits: ClientLimits) -> type[GuardedProtocol]:
    """The protocol class to pass as `uvicorn.Config(http=...)`, bound to `limits`."""
    bound = limits

    class BoundGuardedProtocol(GuardedProtocol):
        limits = bound
        _slots = _Slots()

    return BoundGuardedProtocol
