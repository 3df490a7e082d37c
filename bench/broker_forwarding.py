"""Figure 10: what the broker costs a CLI's exchange with its API (contract §4.8).

Three processes: this one (the client, a blocking `http.client` connection kept
alive, as the CLI keeps its own), a loopback upstream, and the server's own `Broker`
in front of it (`bench.broker_peers`). Requests go direct and through the broker in
turn, so a busy moment of the machine weighs on both alike:

- time to first byte of a short answer: the broker's median minus the direct median;
- a 10 MB answer streamed: the direct time over the broker's (the broker's rate as a
  fraction of the direct rate);
- reload-token p99 while 32 turns stream their API's answers through the broker (the
  stand-in CLI's `@stream-api`), against idle: figure 3's measure, with the broker on.
"""

from __future__ import annotations

import http.client
import socket
import statistics
import subprocess
import sys
import time
from urllib.parse import urlsplit

from bench import reload_latency
from bench.plan import Plan
from bench.report import Figure
from bench.server import Workspace

BIG_BYTES = 10 * 1000 * 1000


def _peer(*args: str) -> tuple[subprocess.Popen[str], list[str]]:
    process = subprocess.Popen(
        [sys.executable, "-m", "bench.broker_peers", *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None
    return process, process.stdout.readline().split()


def _connection(url: str) -> http.client.HTTPConnection:
    """A kept-alive connection with Nagle off, as Node's (the CLI's) are: `http.client`
    sends a request's head and body apart, and would wait for a delayed ACK between."""
    parts = urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=30)
    connection.connect()
    assert connection.sock is not None
    connection.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return connection


def _timed(connection: http.client.HTTPConnection, path: str, headers: dict[str, str]) -> float:
    """Seconds from sending the request to the whole answer read."""
    started = time.perf_counter()
    connection.request("POST", path, body=b'{"model": "m"}', headers=headers)
    response = connection.getresponse()
    while response.read(1024 * 1024):
        pass
    return time.perf_counter() - started


async def measure_reloads(workspace: Workspace, plan: Plan) -> list[Figure]:
    """Figure 3's reload-token p99, with every turn's API traffic through the broker."""
    upstream, (upstream_url,) = _peer("upstream")
    try:
        env = {
            "AGENT_SERVER_BROKER": "1",
            "ANTHROPIC_BASE_URL": upstream_url,
            "CLAUDE_CODE_OAUTH_TOKEN": "sk-ant-oat01-bench-broker-baseline-aaaaaaaa",
        }
        return await reload_latency.measure(
            workspace, plan, figure="10", server_env=env, directive="@stream-api"
        )
    finally:
        if upstream.stdin is not None:
            upstream.stdin.close()
        upstream.wait(timeout=10)


def measure(plan: Plan) -> list[Figure]:
    """Figure 10's time to first byte and streamed rate."""
    upstream, (upstream_url,) = _peer("upstream")
    broker, (broker_url, placeholder) = _peer("broker", upstream_url)
    try:
        direct, brokered = _connection(upstream_url), _connection(broker_url)
        key = {"x-api-key": placeholder}
        rounds = 100 if plan.quick else 1000
        small: dict[str, list[float]] = {"direct": [], "broker": []}
        for _ in range(rounds):
            small["direct"].append(_timed(direct, "/small", {"x-api-key": "bench-key"}))
            small["broker"].append(_timed(brokered, "/small", key))
        big: dict[str, list[float]] = {"direct": [], "broker": []}
        for _ in range(3 if plan.quick else 15):
            big["direct"].append(_timed(direct, f"/big?bytes={BIG_BYTES}", {}))
            big["broker"].append(_timed(brokered, f"/big?bytes={BIG_BYTES}", key))
    finally:
        for process in (broker, upstream):
            if process.stdin is not None:
                process.stdin.close()
            process.wait(timeout=10)
    added_ms = (statistics.median(small["broker"]) - statistics.median(small["direct"])) * 1000
    rate = statistics.median(big["direct"]) / statistics.median(big["broker"])
    return [
        Figure.limited(
            f"10: time to first byte added by the broker (median of {rounds} each)",
            added_ms,
            "ms",
            1.0,
            note=f"direct {statistics.median(small['direct']) * 1000:.2f} ms",
        ),
        Figure(
            "10: a 10 MB streamed answer through the broker / direct (rate)",
            rate,
            "x",
            target=">= 0.9x",
            verdict="PASS" if rate >= 0.9 else "FAIL",
            note=f"direct {BIG_BYTES / statistics.median(big['direct']) / 1e6:.0f} MB/s",
        ),
    ]
