"""Slow clients are bounded (issue 12, item 5; contract §8), on a real server.

Fifty slowloris connections (25 that trickle a header a byte every 0.5 s, 25 that
send complete headers and then trickle or stall their body) are all closed at their
deadline, without an answer, while `/health` and an authenticated
`/api/credentials/status` keep answering in well under a second. The deadlines are
10 s and 30 s in the product; this server runs with 2 s and 3 s through
`tests/support/limited_server.py` (the product takes no setting for them).

Over the connection cap a new connection is closed at once, with no HTTP answer
(never a 503 or a 429, which the controller would read as an auth failure or a rate
limit); that test runs the product's own `agent-server serve`, whose cap follows
`AGENT_SERVER_MAX_PARALLEL`, and whose 10 s header deadline it also sees.
"""

from __future__ import annotations

import asyncio
import contextlib
import select
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest

from agent_server.client_limits import HEADER_TIMEOUT_S, ClientLimits, connection_cap
from tests.e2e.conftest import TurnServers
from tests.support.raw_client import close, trickle, until_closed
from tests.support.server import CONTROLLER_TOKEN, ServerProcess

pytestmark = pytest.mark.timeout(120)

HEADER_S = 2.0
BODY_S = 3.0
LIMITS = ClientLimits(header_timeout_s=HEADER_S, body_timeout_s=BODY_S, max_connections=256)
EARLY_S = 0.1
"""How much sooner than its deadline a close may be seen (connect and write come first)."""
SLACK_S = 1.5
"""How much later than its deadline a close may be seen on a busy 2-core machine."""
PROMPT_S = 1.0
"""Every normal request answers within this, during the attack too."""
TRICKLE_EVERY_S = 0.5
SLOWLORIS = 25
"""Connections of each kind: partial headers, slow body."""

PARTIAL_HEAD = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slowloris: "


def body_head(port: int) -> bytes:
    """The complete, authenticated head of a turn whose 4 KiB body will not come."""
    return (
        f"POST /api/task HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"X-Trinity-Agent-Token: {CONTROLLER_TOKEN}\r\nContent-Type: application/json\r\n"
        f"Content-Length: 4096\r\n\r\n"
    ).encode() + b'{"message": "'


@dataclass
class Closed:
    """One slowloris connection: its kind, when the server closed it, what it answered."""

    kind: str
    elapsed_s: float
    answer: bytes


async def slowloris(port: int, kind: str) -> Closed:
    """`headers`, `body-trickle` or `body-stall`: hold a connection until the server closes it.

    The time runs from the start of the phase whose deadline applies: the connection
    for partial headers, the end of the head for a slow body.
    """
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    started = time.monotonic()
    writer.write(PARTIAL_HEAD if kind == "headers" else body_head(port))
    await writer.drain()
    if kind != "headers":
        started = time.monotonic()
    sending = asyncio.ensure_future(
        trickle(writer, TRICKLE_EVERY_S) if kind != "body-stall" else asyncio.sleep(60)
    )
    try:
        answer = await until_closed(reader, within=BODY_S + 10)
        return Closed(kind, time.monotonic() - started, answer)
    finally:
        sending.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await sending
        await close(writer)


async def attack(port: int) -> list[Closed]:
    """All fifty at once."""
    kinds = ["headers"] * SLOWLORIS + [
        "body-trickle" if i % 2 else "body-stall" for i in range(SLOWLORIS)
    ]
    return await asyncio.gather(*(slowloris(port, kind) for kind in kinds))


@dataclass
class Probes:
    """Normal requests in a thread of their own, each timed: (path, status, seconds)."""

    server: ServerProcess
    timings: list[tuple[str, int, float]] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        """`/health` on a new connection, status on a kept-alive one, until stopped."""
        with self.server.client(timeout=10) as controller:
            while not self.stop.is_set():
                self._timed("/health", lambda: self.server.get("/health").status_code)
                self._timed(
                    "/api/credentials/status",
                    lambda: controller.get("/api/credentials/status").status_code,
                )
                self.stop.wait(0.1)

    def _timed(self, path: str, call: Callable[[], int]) -> None:
        started = time.monotonic()
        try:
            status = call()
        except Exception:  # a refused or dropped probe is a failed probe
            status = 0
        self.timings.append((path, status, time.monotonic() - started))


def test_fifty_slowloris_connections_are_closed_while_requests_are_served(
    turn_servers: TurnServers,
) -> None:
    """All 50 closed at their deadline, no answer; every probe a 200 within a second."""
    server = turn_servers.start(limits=LIMITS)
    probes = Probes(server)
    thread = threading.Thread(target=probes.run, daemon=True)
    thread.start()
    try:
        closed = asyncio.run(attack(server.port))
    finally:
        probes.stop.set()
        thread.join(15)

    by_kind: dict[str, list[float]] = {}
    for one in closed:
        by_kind.setdefault(one.kind, []).append(round(one.elapsed_s, 2))
        assert one.answer == b"", one
    print(f"closed after (s): {by_kind}")
    for kind, deadline in (("headers", HEADER_S), ("body-trickle", BODY_S), ("body-stall", BODY_S)):
        elapsed = by_kind[kind]
        assert all(deadline - EARLY_S <= e <= deadline + SLACK_S for e in elapsed), (kind, elapsed)

    latencies = [seconds for _, _, seconds in probes.timings]
    for path in ("/health", "/api/credentials/status"):
        mine = sorted(s for p, _, s in probes.timings if p == path)
        median, slowest = mine[len(mine) // 2], mine[-1]
        print(f"{path}: {len(mine)} probes, median {median:.3f} s, max {slowest:.3f} s")
    assert all(status == 200 for _, status, _ in probes.timings), probes.timings
    assert len(probes.timings) >= 10, probes.timings
    assert max(latencies) < PROMPT_S, probes.timings

    records = server.log_messages()
    guard = [r["message"] for r in records if r["logger"] == "agent_server.client_limits"]
    assert sum("no complete request headers within 2 s" in m for m in guard) == SLOWLORIS
    assert sum("request body was not complete within 3 s" in m for m in guard) == SLOWLORIS
    noisy = [r for r in records if r["level"] in ("ERROR", "CRITICAL") or "exception" in r]
    assert not noisy, noisy
    assert server.get("/health").status_code == 200


# --- the connection cap, on the product's own server ---------------------------------------


def _recv_until_closed(sock: socket.socket, within: float) -> bytes:
    sock.settimeout(within)
    data = b""
    with contextlib.suppress(ConnectionResetError):
        while chunk := sock.recv(65536):
            data += chunk
    return data


def _health_on(sock: socket.socket) -> bytes:
    """GET /health on an open connection: the status line of the answer."""
    sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    sock.settimeout(5)
    data = b""
    while b"\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, "closed without an answer"
        data += chunk
    return data.split(b"\r\n", 1)[0]


def test_over_the_cap_a_connection_is_closed_without_an_answer(turn_servers: TurnServers) -> None:
    """cap = max(256, 4 x 70) = 280 held; 10 more closed at once; served once released."""
    server = turn_servers.start(AGENT_SERVER_MAX_PARALLEL="70")
    cap = connection_cap(70)
    assert cap == 280
    time.sleep(0.5)  # the harness's own /health connection has surely ended
    held: list[socket.socket] = []
    try:
        for _ in range(cap):
            held.append(socket.create_connection(("127.0.0.1", server.port), timeout=5))
        opened = time.monotonic()
        partial = held[-2:]  # these two meet the product's 10 s header deadline below
        for sock in partial:
            sock.sendall(PARTIAL_HEAD)

        refused_in: list[float] = []
        for _ in range(10):
            with socket.create_connection(("127.0.0.1", server.port), timeout=5) as extra:
                started = time.monotonic()
                with contextlib.suppress(ConnectionError):
                    extra.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
                assert _recv_until_closed(extra, within=5) == b"", "an extra got an answer"
                refused_in.append(time.monotonic() - started)
        print(f"extras closed after (s): {[round(s, 3) for s in refused_in]}")
        assert max(refused_in) < PROMPT_S

        readable, _, _ = select.select(held, [], [], 0)
        assert readable == [], f"{len(readable)} held connections were closed"
        assert _health_on(held[0]).startswith(b"HTTP/1.1 200 ")
        assert _health_on(held[-3]).startswith(b"HTTP/1.1 200 ")

        for sock in held[:-2]:
            sock.close()
        deadline = time.monotonic() + 5
        while True:  # the server reads the 278 ends within a moment
            started = time.monotonic()
            try:
                status = server.get("/health").status_code
                break
            except Exception:
                assert time.monotonic() < deadline, "/health never answered after the release"
                time.sleep(0.05)
        assert status == 200
        assert time.monotonic() - started < PROMPT_S

        for sock in partial:
            assert _recv_until_closed(sock, within=HEADER_TIMEOUT_S + 5) == b""
            elapsed = time.monotonic() - opened
            assert HEADER_TIMEOUT_S - EARLY_S <= elapsed <= HEADER_TIMEOUT_S + SLACK_S, elapsed
    finally:
        for sock in held:
            sock.close()

    messages = [r["message"] for r in server.log_messages()]
    assert "280 connections are open, the cap: closing new connections until one ends" in messages
    assert any(m.startswith("accepting connections again; ") for m in messages)
    assert not any(" 503" in m or " 429" in m for m in messages)
