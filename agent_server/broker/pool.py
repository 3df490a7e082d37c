"""The broker's kept-alive connections to its upstreams, and one request sent on one of them.

A CLI keeps its connection to the API open between requests; so does the broker with
the upstream (a TLS handshake per request would cost more than the broker may). A
kept connection the upstream closed while it was idle is found out by the request
sent on it: that request goes once more on a fresh connection (nothing was answered).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

from agent_server.broker.dial import Dialer, Origin, Route
from agent_server.broker.upstream import AnswerHead, UpstreamConnection, UpstreamError

KEEPALIVE_S = 5.0
"""How long an idle connection is kept (httpx's default, which the broker used before)."""
MAX_IDLE = 32
"""Idle connections kept per upstream: one per turn running at once."""


class Pool:
    """Idle connections by upstream, and the dialer that opens new ones."""

    def __init__(self, dialer: Dialer | None = None) -> None:
        self.dialer = dialer or Dialer()
        self._idle: dict[Route, list[tuple[float, UpstreamConnection]]] = {}

    async def send(
        self,
        origin: Origin,
        method: str,
        path: str,
        headers: Iterable[tuple[bytes, bytes]],
        body: bytes,
    ) -> tuple[Route, UpstreamConnection, AnswerHead]:
        """Send one request to `origin` (`path` after its base path); answer the
        connection and its answer's head (the body is the connection's to relay)."""
        route = self.dialer.route(origin)
        target = origin.prefix + path
        if route.absolute:
            target = f"http://{origin.netloc}{target}"
        head = _request_head(method, target, route, headers, len(body))
        while True:
            connection, reused = self._idle_connection(route)
            if connection is None:
                connection = await self.dialer.dial(route)
            try:
                answer = await connection.send(head, body, bodiless=method == "HEAD")
            except UpstreamError:
                connection.close()
                if reused:
                    continue  # closed while idle: nothing was answered, the request goes again
                raise
            except BaseException:
                connection.close()
                raise
            return route, connection, answer

    def release(self, route: Route, connection: UpstreamConnection) -> None:
        """Keep `connection` for the next request to its route, or close it."""
        idle = self._idle.setdefault(route, [])
        if not connection.reusable or len(idle) >= MAX_IDLE:
            connection.close()
            return
        idle.append((asyncio.get_running_loop().time(), connection))

    def close(self) -> None:
        """Close every idle connection."""
        for idle in self._idle.values():
            for _, connection in idle:
                connection.close()
        self._idle.clear()

    def _idle_connection(self, route: Route) -> tuple[UpstreamConnection | None, bool]:
        """The most recently used idle connection still open, and whether there was one."""
        idle = self._idle.get(route)
        now = asyncio.get_running_loop().time()
        while idle:
            since, connection = idle.pop()
            transport = connection.transport
            if now - since < KEEPALIVE_S and transport is not None and not transport.is_closing():
                return connection, True
            connection.close()
        return None, False


def _request_head(
    method: str, target: str, route: Route, headers: Iterable[tuple[bytes, bytes]], length: int
) -> bytes:
    """The request line and headers: `Host` the upstream's, the body's length, the rest as given."""
    lines = [
        f"{method} {target} HTTP/1.1\r\n".encode("latin-1"),
        b"host: " + route.origin.netloc.encode("ascii") + b"\r\n",
    ]
    lines += [name + b": " + value + b"\r\n" for name, value in headers]
    if route.absolute and route.proxy_authorization:
        lines.append(b"proxy-authorization: " + route.proxy_authorization + b"\r\n")
    lines.append(b"content-length: %d\r\n\r\n" % length)
    return b"".join(lines)
