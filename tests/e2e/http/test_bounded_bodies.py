"""Bounded input: a huge body is refused while it is read, never buffered whole.

A 500 MB authenticated body used to be read in full before the size check (1.07 GB
RSS at the peak). Now a declared Content-Length over 16 MiB is refused at once, and
a chunked body is cut off as soon as its bytes pass 16 MiB: 413 either way, with the
server's peak RSS (VmHWM) barely moved.
"""

from __future__ import annotations

import select
import socket
import time
from pathlib import Path

import pytest

from tests.e2e.conftest import TurnServers
from tests.support.server import CONTROLLER_TOKEN, ServerProcess

pytestmark = pytest.mark.timeout(120)

HUGE = 500 * 1024 * 1024
CHUNK = 1024 * 1024
PEAK_BOUND = 64 * 1024 * 1024


def peak_rss(server: ServerProcess) -> int:
    """The server process's peak resident set size, in bytes (VmHWM)."""
    assert server.process is not None
    for line in Path(f"/proc/{server.process.pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    msg = "no VmHWM in /proc"
    raise AssertionError(msg)


def _head(server: ServerProcess, framing: str) -> bytes:
    return (
        f"POST /api/task HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\n"
        f"X-Trinity-Agent-Token: {CONTROLLER_TOKEN}\r\nContent-Type: application/json\r\n"
        f"{framing}\r\n\r\n"
    ).encode()


def send_until_answered(server: ServerProcess, framing: str, *, chunked: bool) -> bytes:
    """Send up to 500 MB of body; stop as soon as the server answers; return its answer."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        sock.sendall(_head(server, framing))
        sent = 0
        filler = b'{"message":"' + b"x" * (CHUNK - 12)
        while sent < HUGE:
            readable, _, _ = select.select([sock], [], [], 0)
            if readable:
                break
            piece = f"{len(filler):x}\r\n".encode() + filler + b"\r\n" if chunked else filler
            try:
                sock.sendall(piece)
            except (BrokenPipeError, ConnectionResetError):
                break
            sent += len(filler)
        deadline = time.monotonic() + 20
        answer = b""
        while not _complete(answer) and time.monotonic() < deadline:
            try:
                data = sock.recv(65536)
            except ConnectionResetError:
                break
            if not data:
                break
            answer += data
    assert sent < 64 * CHUNK, f"the server let {sent} bytes in before answering"
    return answer


def _complete(answer: bytes) -> bool:
    """Headers and as much body as their Content-Length says."""
    head, found, body = answer.partition(b"\r\n\r\n")
    if not found:
        return False
    for line in head.split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return len(body) >= int(value)
    return True


@pytest.mark.parametrize(
    ("framing", "chunked"),
    [
        pytest.param(f"Content-Length: {HUGE}", False, id="a declared 500 MB body"),
        pytest.param("Transfer-Encoding: chunked", True, id="a chunked body with no length"),
    ],
)
def test_a_500_mb_body_is_a_413_without_buffering_it(
    turn_servers: TurnServers, framing: str, chunked: bool
) -> None:
    """413 payload_too_large, the peak RSS within 64 MiB of before, and still serving."""
    server = turn_servers.start()
    before = peak_rss(server)
    answer = send_until_answered(server, framing, chunked=chunked)
    assert answer.startswith(b"HTTP/1.1 413 "), answer[:200]
    assert b'"error_code":"payload_too_large"' in answer
    assert peak_rss(server) - before < PEAK_BOUND
    assert server.get("/health").status_code == 200
