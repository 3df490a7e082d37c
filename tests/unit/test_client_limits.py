"""The slow-client guard (contract §8): each phase's deadline, on a real loopback socket.

Each test serves an ASGI app through the guarded protocol (uvicorn's httptools one) on
a real event loop and a real 127.0.0.1 socket, with deadlines of a fraction of a second, and plays
the client with asyncio streams: partial headers, a stalled or trickled body, a slow
app, keep-alive, pipelining and the connection cap.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

import pytest
import uvicorn
from pydantic import SecretStr
from starlette.types import ASGIApp, Receive, Scope, Send
from uvicorn.server import ServerState

from agent_server.__main__ import uvicorn_config
from agent_server.app import create_app
from agent_server.auth import ControllerAuth
from agent_server.client_limits import (
    BODY_TIMEOUT_S,
    HEADER_TIMEOUT_S,
    MAX_HEAD_BYTES,
    SEND_TIMEOUT_S,
    ClientLimits,
    GuardedProtocol,
    Phase,
    connection_cap,
    guarded_protocol,
)
from agent_server.services import Services
from tests.support.in_process import TOKEN, fake_cli_services, wait_until
from tests.support.raw_client import TCP_ESTABLISHED, close, tcp_state, trickle, until_closed

pytestmark = pytest.mark.timeout(60)

HEADER_S = 0.4
BODY_S = 0.7
EARLY = 0.05
"""How much sooner than its deadline a close may be seen (the two clocks' start)."""
SLACK = 0.6
"""How much later than its deadline a close may be seen on a busy 2-core machine."""
LIMITS = ClientLimits(header_timeout_s=HEADER_S, body_timeout_s=BODY_S, max_connections=8)
WITHIN_S = 2.0
"""How long `wait_until` waits for a server-side change."""

PARTIAL_HEAD = b"GET /slow HTTP/1.1\r\nHost: a\r\nX-Slow: "


def head(path: str = "/", *, length: int | None = None, extra: str = "") -> bytes:
    """A complete request head (POST with a Content-Length when `length` is given)."""
    method = "GET" if length is None else "POST"
    framing = "" if length is None else f"Content-Length: {length}\r\n"
    return f"{method} {path} HTTP/1.1\r\nHost: a\r\n{framing}{extra}\r\n".encode()


@dataclass
class RecordingApp:
    """Reads the whole body (recording each message), waits for `release`, answers 200."""

    release: asyncio.Event = field(default_factory=asyncio.Event)
    received: list[str] = field(default_factory=list)
    read_body: bool = True
    answer: bytes = b"ok"

    def __post_init__(self) -> None:
        self.release.set()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """One request."""
        assert scope["type"] == "http"
        while self.read_body:
            message = await receive()
            self.received.append(message["type"])
            if message["type"] == "http.disconnect":
                return
            if not message.get("more_body", False):
                break
        await self.release.wait()
        headers = [(b"content-length", str(len(self.answer)).encode())]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": self.answer})


@dataclass
class Served:
    """A guarded server on a loopback port, and every protocol instance it made."""

    port: int
    state: ServerState
    protocols: list[GuardedProtocol]

    async def connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """A raw client connection."""
        return await asyncio.open_connection("127.0.0.1", self.port)


@contextlib.asynccontextmanager
async def serving(app: ASGIApp, limits: ClientLimits = LIMITS) -> AsyncIterator[Served]:
    """Serve `app` through `guarded_protocol(limits)`; uvicorn's keep-alive is kept out of it."""
    protocol = guarded_protocol(limits)
    config = uvicorn.Config(
        app, http=protocol, lifespan="off", log_config=None, timeout_keep_alive=60
    )
    config.load()
    state = ServerState()
    protocols: list[GuardedProtocol] = []

    def factory() -> GuardedProtocol:
        made = protocol(config=config, server_state=state, app_state={})
        protocols.append(made)
        return made

    server = await asyncio.get_running_loop().create_server(factory, "127.0.0.1", 0)
    try:
        yield Served(server.sockets[0].getsockname()[1], state, protocols)
    finally:
        server.close()
        for connection in list(state.connections):
            connection.transport.abort()
        for task in list(state.tasks):
            task.cancel()
        await asyncio.sleep(0.05)
        await server.wait_closed()


def run(scenario: Callable[[], Coroutine[Any, Any, None]]) -> None:
    """Run one scenario on a fresh event loop."""
    asyncio.run(scenario())


async def closed_while(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, sending: Awaitable[None]
) -> tuple[float, bytes]:
    """Run `sending` until the server closes; the seconds it took and what it answered."""
    started = time.monotonic()
    task = asyncio.ensure_future(sending)
    try:
        answer = await until_closed(reader, within=10)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await close(writer)
    return time.monotonic() - started, answer


def assert_at_deadline(elapsed: float, deadline: float) -> None:
    """Closed by that deadline's timer: not before it, and not long after."""
    assert deadline - EARLY <= elapsed <= deadline + SLACK, (elapsed, deadline)


def assert_one_quiet_line(caplog: pytest.LogCaptureFixture, ending: str) -> None:
    """The guard logged one line, ending so; nothing at WARNING or with a traceback."""
    guard = [r.getMessage() for r in caplog.records if r.name == "agent_server.client_limits"]
    assert len(guard) == 1
    assert guard[0].endswith(ending)
    noisy = [r for r in caplog.records if r.levelno >= logging.WARNING or r.exc_info]
    assert not noisy, [(r.name, r.getMessage()) for r in noisy]


# --- the header phase -----------------------------------------------------------------


@pytest.mark.parametrize("sends", ["nothing", "a header a byte at a time"])
def test_a_request_without_complete_headers_is_closed_at_the_header_deadline(sends: str) -> None:
    """Silent or trickling, the connection is closed at the deadline without an answer."""
    app = RecordingApp()

    async def scenario() -> None:
        async with serving(app) as served:
            reader, writer = await served.connect()
            if sends == "nothing":
                sending: Awaitable[None] = asyncio.sleep(60)
            else:
                writer.write(PARTIAL_HEAD)
                sending = trickle(writer)
            elapsed, answer = await closed_while(reader, writer, sending)
            assert_at_deadline(elapsed, HEADER_S)
            assert answer == b""
            await wait_until(lambda: not served.state.connections, WITHIN_S)

    run(scenario)
    assert app.received == []


def test_the_header_deadline_runs_again_after_each_response() -> None:
    """Kept alive, each request has its own deadline; partial headers after one are closed."""
    app = RecordingApp()

    async def scenario() -> None:
        async with serving(app) as served:
            reader, writer = await served.connect()
            # Four requests 0.6 deadline apart: 1.8 deadlines on one connection, all served.
            for _ in range(4):
                await asyncio.sleep(HEADER_S * 0.6)
                writer.write(head())
                assert (await reader.readuntil(b"ok")).startswith(b"HTTP/1.1 200 ")
            writer.write(PARTIAL_HEAD)
            elapsed, answer = await closed_while(reader, writer, trickle(writer))
            assert_at_deadline(elapsed, HEADER_S)
            assert answer == b""

    run(scenario)


@pytest.mark.parametrize("where", ["the first request", "a pipelined request"])
def test_a_head_that_keeps_growing_is_a_400_long_before_its_deadline(where: str) -> None:
    """Header lines sent fast and never ended: a 400 once the head is past its bound,
    not a buffer that grows until the deadline (the parser keeps a head until it is
    whole). Behind a request the app is still running too."""
    pipelined = where == "a pipelined request"
    app = RecordingApp()
    if pipelined:
        app.release.clear()  # the first request's app runs on
    line = b"X-Pad: " + b"p" * 1017 + b"\r\n"  # 1 KiB a header line

    async def scenario() -> None:
        async with serving(app) as served:
            reader, writer = await served.connect()
            if pipelined:
                writer.write(head("/first"))
                await wait_until(lambda: bool(app.received), WITHIN_S)
            writer.write(b"GET /grows HTTP/1.1\r\nHost: a\r\n")

            async def pad() -> None:
                for _ in range(4 * MAX_HEAD_BYTES // len(line)):
                    writer.write(line)
                    await writer.drain()
                    await asyncio.sleep(0.001)
                await asyncio.sleep(60)

            elapsed, answer = await closed_while(reader, writer, pad())
            assert elapsed < HEADER_S, "closed at the deadline, not at the bound"
            assert answer.startswith(b"HTTP/1.1 400 ")
            assert answer.endswith(b"Request headers too large.")

    run(scenario)
    assert app.received == (["http.request"] if pipelined else [])  # /first's only


def test_a_large_head_within_the_bound_is_served() -> None:
    """Headers of half the bound, sent in pieces: served as usual."""
    app = RecordingApp()
    extra = "".join(f"X-Pad-{n}: {'p' * 1000}\r\n" for n in range(MAX_HEAD_BYTES // 2048))

    async def scenario() -> None:
        async with serving(app) as served:
            reader, writer = await served.connect()
            request = head("/big-head", extra=extra)
            for start in range(0, len(request), 4096):
                writer.write(request[start : start + 4096])
                await writer.drain()
            assert (await reader.readuntil(b"ok")).startswith(b"HTTP/1.1 200 ")
            await close(writer)

    run(scenario)
    assert app.received == ["http.request"]


def test_an_idle_kept_alive_connection_is_closed_at_the_header_deadline() -> None:
    """With uvicorn's keep-alive out of the way (60 s here), the header deadline closes it."""

    async def scenario() -> None:
        async with serving(RecordingApp()) as served:
            reader, writer = await served.connect()
            writer.write(head())
            assert (await reader.readuntil(b"ok")).startswith(b"HTTP/1.1 200 ")
            elapsed, answer = await closed_while(reader, writer, asyncio.sleep(60))
            assert_at_deadline(elapsed, HEADER_S)
            assert answer == b""

    run(scenario)


# --- the body phase -------------------------------------------------------------------


@pytest.mark.parametrize("sends", ["nothing more", "a byte every 0.1 s"])
def test_a_slow_body_is_closed_at_the_body_deadline_and_the_app_sees_a_disconnect(
    sends: str,
) -> None:
    """Stalled or trickled, a body is a deadline (not an idle timeout) from its headers."""
    app = RecordingApp()

    async def scenario() -> None:
        async with serving(app) as served:
            reader, writer = await served.connect()
            writer.write(head("/task", length=1000) + b'{"message": ')
            await writer.drain()
            sending = trickle(writer) if sends != "nothing more" else asyncio.sleep(60)
            elapsed, answer = await closed_while(reader, writer, sending)
            assert_at_deadline(elapsed, BODY_S)
            assert answer == b""
            await wait_until(lambda: not served.state.tasks, WITHIN_S)

    run(scenario)
    assert app.received[0] == "http.request"
    assert app.received[-1] == "http.disconnect"


def test_a_body_sent_in_pieces_within_its_deadline_is_served() -> None:
    """Slow but in time: the request is answered."""

    async def scenario() -> None:
        async with serving(RecordingApp()) as served:
            reader, writer = await served.connect()
            writer.write(head("/task", length=4))
            for byte in b"abcd":
                await asyncio.sleep(BODY_S / 8)
                writer.write(bytes([byte]))
            assert (await reader.readuntil(b"ok")).startswith(b"HTTP/1.1 200 ")
            await close(writer)

    run(scenario)


def test_an_answer_before_the_body_ends_the_body_phase() -> None:
    """An app that answers without reading the body: the rest is bounded by the header deadline."""

    async def scenario() -> None:
        async with serving(RecordingApp(read_body=False)) as served:
            reader, writer = await served.connect()
            writer.write(head("/task", length=1000))
            started = time.monotonic()
            assert (await reader.readuntil(b"ok")).startswith(b"HTTP/1.1 200 ")
            task = asyncio.ensure_future(trickle(writer))
            try:
                await until_closed(reader, within=10)
            finally:
                task.cancel()
                await close(writer)
            assert_at_deadline(time.monotonic() - started, HEADER_S)

    run(scenario)


def test_a_pipelined_request_gets_its_own_body_deadline() -> None:
    """Two requests in one write: the first is answered, the second's stalled body is closed."""

    async def scenario() -> None:
        async with serving(RecordingApp()) as served:
            reader, writer = await served.connect()
            writer.write(head("/one", length=2) + b"{}" + head("/two", length=1000) + b"{")
            started = time.monotonic()
            answer = await until_closed(reader, within=10)
            await close(writer)
            assert answer.startswith(b"HTTP/1.1 200 ")
            assert answer.count(b"HTTP/1.1") == 1
            assert_at_deadline(time.monotonic() - started, BODY_S)

    run(scenario)


def record_writes(transport: Any) -> list[bytes]:
    """Every write the connection's transport is asked for, from now on."""
    writes: list[bytes] = []
    real_write = transport.write

    def recording_write(data: bytes) -> None:
        writes.append(data)
        real_write(data)

    transport.write = recording_write
    return writes


def test_an_answer_leaves_in_one_write() -> None:
    """Head and body are written together: one segment, the client woken once."""

    async def scenario() -> None:
        async with serving(RecordingApp()) as served:
            reader, writer = await served.connect()
            await wait_until(lambda: bool(served.protocols), WITHIN_S)
            writes = record_writes(served.protocols[0].transport)
            for path in ("/one", "/two"):  # and again on the kept-alive connection
                writer.write(head(path, length=2) + b"{}")
                assert (await reader.readuntil(b"ok")).startswith(b"HTTP/1.1 200 ")
            await close(writer)
            assert len(writes) == 2, writes
            assert all(w.startswith(b"HTTP/1.1 200 ") and w.endswith(b"ok") for w in writes)

    run(scenario)


def test_a_large_answer_is_not_copied_into_one_write() -> None:
    """Past 64 KiB, head and body are written as they are: joining them would hold a
    second copy of the answer in memory."""
    answer = b"x" * (1 << 20)

    async def scenario() -> None:
        async with serving(RecordingApp(answer=answer)) as served:
            reader, writer = await served.connect()
            await wait_until(lambda: bool(served.protocols), WITHIN_S)
            writes = record_writes(served.protocols[0].transport)
            writer.write(head("/big", length=2) + b"{}")
            assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200 ")
            assert await reader.readexactly(len(answer)) == answer
            await close(writer)
            assert [len(w) < 1024 for w in writes] == [True, False], [len(w) for w in writes]
            assert writes[1] is answer

    run(scenario)


# --- the app phase --------------------------------------------------------------------


def test_the_app_phase_has_no_deadline_and_the_phases_follow_the_request() -> None:
    """headers -> body -> app (held past every deadline) -> headers; none once closed."""
    app = RecordingApp()
    app.release.clear()

    async def scenario() -> None:
        async with serving(app) as served:
            reader, writer = await served.connect()
            await wait_until(lambda: len(served.protocols) == 1, WITHIN_S)
            guard = served.protocols[0]
            assert guard.phase is Phase.HEADERS
            writer.write(head("/task", length=4) + b"ab")
            await wait_until(lambda: guard.phase is Phase.BODY, WITHIN_S)
            writer.write(b"cd")
            await wait_until(lambda: guard.phase is Phase.APP, WITHIN_S)
            await asyncio.sleep(HEADER_S + BODY_S + 0.2)
            assert guard.phase is Phase.APP
            app.release.set()
            assert (await reader.readuntil(b"ok")).startswith(b"HTTP/1.1 200 ")
            await wait_until(lambda: guard.phase is Phase.HEADERS, WITHIN_S)
            await close(writer)
            await wait_until(lambda: guard.phase is None, WITHIN_S)
            assert not served.state.connections

    run(scenario)


# --- the send deadline ----------------------------------------------------------------

SEND_S = 0.8
SEND_LIMITS = ClientLimits(
    header_timeout_s=30, body_timeout_s=30, max_connections=8, send_timeout_s=SEND_S
)
CHUNK = b"x" * 65536


@dataclass
class EndlessApp:
    """Streams chunks until the client is gone (or `total` bytes are out), then ends."""

    total: int | None = None
    ended: asyncio.Event = field(default_factory=asyncio.Event)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """One request."""
        await receive()
        gone = asyncio.ensure_future(receive())  # http.disconnect, once the client is gone
        await send({"type": "http.response.start", "status": 200, "headers": []})
        sent = 0
        while not gone.done() and (self.total is None or sent < self.total):
            await send({"type": "http.response.body", "body": CHUNK, "more_body": True})
            sent += len(CHUNK)
            await asyncio.sleep(0)  # a step a chunk: the guard writes what a step held
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        gone.cancel()
        self.ended.set()


async def small_window_client(port: int, request: bytes, window: int = 4096) -> socket.socket:
    """A connection with a `window`-byte receive buffer that sent `request`, read nothing."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, window)
    sock.setblocking(False)
    loop = asyncio.get_running_loop()
    await loop.sock_connect(sock, ("127.0.0.1", port))
    await loop.sock_sendall(sock, request)
    return sock


def test_a_client_that_reads_none_of_its_answer_is_reset_at_the_send_deadline(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Its socket buffers full, the server waits `send_timeout_s`, then resets it (one INFO
    line, no error): the app sees the disconnect and ends, the connection is gone."""
    app = EndlessApp()

    async def scenario() -> None:
        async with serving(app, SEND_LIMITS) as served:
            started = time.monotonic()
            with await small_window_client(served.port, head("/endless")) as sock:
                await wait_until(lambda: tcp_state(sock) != TCP_ESTABLISHED, SEND_S + 5)
                assert_at_deadline(time.monotonic() - started, SEND_S)
            await wait_until(app.ended.is_set, WITHIN_S)
            await wait_until(lambda: not served.state.connections, WITHIN_S)

    with caplog.at_level(logging.DEBUG):
        run(scenario)
    assert_one_quiet_line(caplog, f"it read none of its answer for {SEND_S:g} s")


def test_a_client_that_drains_its_answer_in_time_keeps_its_connection(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """It leaves the server waiting a while, then reads until the server writes again,
    and again: each time the deadline is lifted; the whole answer arrives. (Waits of a
    tenth of the deadline: a busy machine may stretch them.)"""
    total = 128 * len(CHUNK)
    end = b"\r\n0\r\n\r\n"
    limits = ClientLimits(header_timeout_s=30, body_timeout_s=30, send_timeout_s=3.0)

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        async with serving(EndlessApp(total=total), limits) as served:
            # A window a tiny one would make slow to drain (one 40 ms delayed ACK each).
            window = 256 * 1024
            with await small_window_client(served.port, head("/endless"), window) as sock:
                received, waited_on = b"", 0

                async def read() -> None:
                    nonlocal received
                    chunk = await asyncio.wait_for(loop.sock_recv(sock, 65536), 5)
                    assert chunk, "closed before the end of the answer"
                    received += chunk

                while not received.endswith(end):
                    await asyncio.sleep(limits.send_timeout_s / 10)
                    flow = served.protocols[0].flow
                    if flow.write_paused:  # read until the server writes again
                        waited_on += 1
                        while flow.write_paused:
                            await read()
                    else:  # all of it is written: read the rest
                        while not received.endswith(end):
                            await read()
                assert received.count(b"x") == total
                assert waited_on >= 2, "the server never waited on this client"

    with caplog.at_level(logging.INFO, logger="agent_server.client_limits"):
        run(scenario)
    assert not [r for r in caplog.records if r.name == "agent_server.client_limits"]


# --- the connection cap ---------------------------------------------------------------


CAP = 3
CAP_LIMITS = ClientLimits(header_timeout_s=30, body_timeout_s=30, max_connections=CAP)
WITH_TOKEN = f"X-Trinity-Agent-Token: {TOKEN}\r\n"


@dataclass
class HoldingApp:
    """Answers `ok` at once, except a path that starts with /hold: after `release`."""

    release: asyncio.Event = field(default_factory=asyncio.Event)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """One request."""
        if scope["path"].startswith("/hold"):
            await self.release.wait()
        headers = [(b"content-length", b"2")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": b"ok"})


def behind_auth(app: ASGIApp, token: str | None = TOKEN) -> ControllerAuth:
    """`app` behind the controller authentication, as the product serves it."""
    return ControllerAuth(app, SecretStr(token) if token is not None else None)


Stream = tuple[asyncio.StreamReader, asyncio.StreamWriter]


async def served_once(served: Served, request: bytes) -> Stream:
    """A new connection that sent `request` and read its whole answer (200), kept open."""
    reader, writer = await served.connect()
    writer.write(request)
    assert (await reader.readuntil(b"ok")).startswith(b"HTTP/1.1 200 ")
    return reader, writer


async def assert_closed_unanswered(stream: Stream) -> None:
    """The server closed this connection (soon) without a byte of answer."""
    assert await until_closed(stream[0], within=2) == b""
    await close(stream[1])


def test_at_the_cap_a_new_connection_closes_the_oldest_anonymous_one(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Idle connections cannot keep a new one out: it is served, the oldest one without
    the token is closed with no answer (never a 503); one warning a spell, and one
    once a connection arrives under the cap again."""

    async def scenario() -> None:
        async with serving(behind_auth(HoldingApp()), CAP_LIMITS) as served:
            held = [await served.connect() for _ in range(CAP)]
            await wait_until(lambda: len(served.state.connections) == CAP, WITHIN_S)
            for _ in range(4):
                started = time.monotonic()
                newest = await served_once(served, head("/health"))
                assert time.monotonic() - started < 0.5
                await assert_closed_unanswered(held.pop(0))
                held.append(newest)  # idle now, and still without the token
            assert len(served.state.connections) == CAP
            for stream in held:
                await close(stream[1])
            await wait_until(lambda: not served.state.connections, WITHIN_S)
            await close((await served_once(served, head("/health")))[1])

    with caplog.at_level(logging.INFO, logger="agent_server.client_limits"):
        run(scenario)
    messages = [r.getMessage() for r in caplog.records if r.name == "agent_server.client_limits"]
    assert messages == [
        "3 connections without the controller token are open, the cap: "
        "each new connection closes the oldest of them",
        "below the connection cap again: 4 connections without the controller token "
        "were closed to make room",
    ]


def test_a_connection_that_proved_the_token_keeps_its_slot() -> None:
    """Older than every anonymous one, idle or with its request running, it is passed over;
    it serves its answer and its next request."""
    app = HoldingApp()

    async def scenario() -> None:
        async with serving(behind_auth(app), CAP_LIMITS) as served:
            idle = await served_once(served, head("/api/credentials/status", extra=WITH_TOKEN))
            running = await served.connect()
            running[1].write(head("/hold/api/task", extra=WITH_TOKEN))
            anonymous = [await served.connect() for _ in range(CAP)]
            await wait_until(lambda: len(served.state.connections) == CAP + 2, WITHIN_S)
            assert [p.authenticated for p in served.protocols] == [True, True] + [False] * CAP

            newest = await served_once(served, head("/health"))
            await assert_closed_unanswered(anonymous[0])
            app.release.set()
            assert (await running[0].readuntil(b"ok")).startswith(b"HTTP/1.1 200 ")
            idle[1].write(head("/api/executions/running", extra=WITH_TOKEN))
            assert (await idle[0].readuntil(b"ok")).startswith(b"HTTP/1.1 200 ")
            for stream in [idle, running, *anonymous[1:], newest]:
                await close(stream[1])

    run(scenario)


@pytest.mark.parametrize(
    ("request_head", "token", "authenticated"),
    [
        pytest.param(head("/api/x", extra=WITH_TOKEN), TOKEN, True, id="the token on a route"),
        pytest.param(head("/health", extra=WITH_TOKEN), TOKEN, True, id="the token on /health"),
        pytest.param(head("/health"), TOKEN, False, id="/health without the token"),
        pytest.param(
            b"OPTIONS /api/x HTTP/1.1\r\nHost: a\r\n\r\n", TOKEN, False, id="OPTIONS without it"
        ),
        pytest.param(
            head("/health", extra="X-Trinity-Agent-Token: not-the-token-0123456789\r\n"),
            TOKEN,
            False,
            id="a wrong token on /health",
        ),
        pytest.param(head("/api/x"), None, True, id="any request when authentication is off"),
    ],
)
def test_which_requests_mark_their_connection_as_the_controllers(
    request_head: bytes, token: str | None, authenticated: bool
) -> None:
    """Only a request that carries the token (any request with authentication off)."""

    async def scenario() -> None:
        async with serving(behind_auth(HoldingApp(), token), CAP_LIMITS) as served:
            await close((await served_once(served, request_head))[1])
            assert served.protocols[0].authenticated is authenticated

    run(scenario)


def test_a_wrong_token_is_refused_and_marks_nothing() -> None:
    """401, and the connection stays anonymous."""

    async def scenario() -> None:
        async with serving(behind_auth(HoldingApp()), CAP_LIMITS) as served:
            reader, writer = await served.connect()
            writer.write(head("/api/x", extra="X-Trinity-Agent-Token: not-it-0123456789\r\n"))
            assert (await reader.readuntil(b"}")).startswith(b"HTTP/1.1 401 ")
            assert served.protocols[0].authenticated is False
            await close(writer)

    run(scenario)


def test_the_authenticated_connections_have_a_cap_of_their_own() -> None:
    """Past it, one more proves the token but stays anonymous: the oldest to close."""

    async def scenario() -> None:
        async with serving(behind_auth(HoldingApp()), CAP_LIMITS) as served:
            streams = [
                await served_once(served, head("/api/x", extra=WITH_TOKEN)) for _ in range(CAP + 1)
            ]
            assert [p.authenticated for p in served.protocols] == [True] * CAP + [False]
            anonymous = [await served.connect() for _ in range(CAP - 1)]
            newest = await served_once(served, head("/health"))
            await assert_closed_unanswered(streams.pop())
            for stream in [*streams, *anonymous, newest]:
                await close(stream[1])

    run(scenario)


def test_an_anonymous_request_in_progress_does_not_keep_its_slot() -> None:
    """An anonymous answer the client never reads could otherwise hold a slot for ever:
    the oldest anonymous connection is closed whatever its request is doing."""
    app = HoldingApp()

    async def scenario() -> None:
        async with serving(behind_auth(app), CAP_LIMITS) as served:
            running = await served.connect()
            running[1].write(b"OPTIONS /hold HTTP/1.1\r\nHost: a\r\n\r\n")  # exempt: no token
            others = [await served.connect() for _ in range(CAP - 1)]
            await wait_until(lambda: len(served.state.tasks) == 1, WITHIN_S)
            newest = await served_once(served, head("/health"))
            await assert_closed_unanswered(running)
            app.release.set()
            for stream in [*others, newest]:
                await close(stream[1])

    run(scenario)


@pytest.mark.parametrize(
    ("max_parallel", "cap"), [(1, 256), (32, 256), (64, 256), (65, 260), (500, 2000)]
)
def test_the_cap_follows_the_turn_slots(max_parallel: int, cap: int) -> None:
    """max(256, 4 x AGENT_SERVER_MAX_PARALLEL), as contract §8 says."""
    assert connection_cap(max_parallel) == cap
    assert ClientLimits.for_max_parallel(max_parallel).max_connections == cap


# --- the product's wiring -------------------------------------------------------------


@pytest.fixture
def app_services(environ: dict[str, str]) -> Services:
    """Services of a Claude agent with a controller token, 70 turn slots."""
    return fake_cli_services(environ, AGENT_SERVER_MAX_PARALLEL="70")


def test_uvicorn_serves_through_the_guard(app_services: Services) -> None:
    """`agent-server serve` hands uvicorn the guarded protocol with the product's limits."""
    settings = app_services.settings
    limits = ClientLimits.for_max_parallel(settings.max_parallel)
    config = uvicorn_config(create_app(settings, app_services), settings, limits)
    assert isinstance(config.http, type)
    assert issubclass(config.http, GuardedProtocol)
    assert config.http.limits == ClientLimits(HEADER_TIMEOUT_S, BODY_TIMEOUT_S, 280)
    assert config.ws == "none"
    assert config.loop == "asyncio", "uvloop refuses the SIGCHLD reaper: never 'auto'"
    assert config.proxy_headers is False, "the agent on the loopback could forge the caller"
    assert (HEADER_TIMEOUT_S, BODY_TIMEOUT_S, SEND_TIMEOUT_S) == (10.0, 30.0, 30.0)


def test_the_real_app_ends_a_closed_body_quietly(
    app_services: Services, caplog: pytest.LogCaptureFixture
) -> None:
    """POST /api/task whose body stalls: one INFO line from the guard, no error, no traceback."""
    app = create_app(app_services.settings, app_services)

    async def scenario() -> None:
        async with serving(app) as served:
            reader, writer = await served.connect()
            writer.write(head("/api/task", length=100, extra=f"X-Trinity-Agent-Token: {TOKEN}\r\n"))
            writer.write(b'{"message": "hel')
            elapsed, answer = await closed_while(reader, writer, asyncio.sleep(60))
            assert_at_deadline(elapsed, BODY_S)
            assert answer == b""
            await wait_until(lambda: not served.state.tasks, WITHIN_S)

    with caplog.at_level(logging.DEBUG):
        run(scenario)
    assert_one_quiet_line(caplog, f"the request body was not complete within {BODY_S:g} s")
