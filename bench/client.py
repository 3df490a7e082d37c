"""A minimal HTTP/1.1 keep-alive client over asyncio streams, for loopback benchmarks.

Why not httpx: on this class of machine its async client costs about 1.2 ms of the
benchmark process's CPU per request (a GET /health takes 1.7 ms through it and 0.4 ms
through http.client), which would be charged to the server and, on two cores, taken
from it. This client does only what the benchmarks need: JSON bodies, answers with
Content-Length, one connection per request in flight, reused afterwards.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any


class ClientError(RuntimeError):
    """The server answered something this client cannot read, or not at all."""


@dataclass(frozen=True)
class Answer:
    """One HTTP answer: status and raw body."""

    status: int
    body: bytes

    def json(self) -> Any:
        """The body parsed as JSON."""
        return json.loads(self.body)


_Connection = tuple[asyncio.StreamReader, asyncio.StreamWriter]


class LoopbackClient:
    """Requests to 127.0.0.1:`port`, at most `max_connections` in flight."""

    def __init__(self, port: int, headers: dict[str, str], max_connections: int = 64) -> None:
        self._port = port
        self._headers = "".join(f"{name}: {value}\r\n" for name, value in headers.items())
        self._idle: list[_Connection] = []
        self._slots = asyncio.Semaphore(max_connections)

    async def __aenter__(self) -> LoopbackClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Close every idle connection."""
        while self._idle:
            _, writer = self._idle.pop()
            writer.close()

    async def get(self, path: str, timeout_s: float = 60.0) -> Answer:
        """GET `path`."""
        return await self.request("GET", path, None, timeout_s)

    async def post(self, path: str, payload: object, timeout_s: float = 60.0) -> Answer:
        """POST `payload` as JSON to `path`."""
        return await self.request("POST", path, payload, timeout_s)

    async def request(
        self, method: str, path: str, payload: object | None, timeout_s: float = 60.0
    ) -> Answer:
        """One request; a reused connection the server closed meanwhile is retried once."""
        body = b"" if payload is None else json.dumps(payload).encode()
        head = (
            f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{self._port}\r\n{self._headers}"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        ).encode()
        async with self._slots:
            for fresh in (False, True):
                connection = await self._connect(fresh)
                try:
                    # Not `wait_for`, whose task around the exchange costs the answer a
                    # step of this loop: this client's time is counted as the server's.
                    async with asyncio.timeout(timeout_s):
                        answer = await self._exchange(connection, head + body)
                except (ConnectionError, asyncio.IncompleteReadError):
                    connection[1].close()
                    if fresh:
                        raise
                    continue
                except BaseException:
                    connection[1].close()
                    raise
                self._idle.append(connection)
                return answer
        msg = "unreachable: the second attempt returns or raises"
        raise ClientError(msg)

    async def _connect(self, fresh: bool) -> _Connection:
        if self._idle and not fresh:
            return self._idle.pop()
        return await asyncio.open_connection("127.0.0.1", self._port, limit=2**24)

    @staticmethod
    async def _exchange(connection: _Connection, request: bytes) -> Answer:
        reader, writer = connection
        writer.write(request)
        await writer.drain()
        status_line = await reader.readuntil(b"\r\n")
        status = int(status_line.split(b" ", 2)[1])
        length = None
        while True:
            line = await reader.readuntil(b"\r\n")
            if line == b"\r\n":
                break
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value.strip())
        if length is None:
            msg = f"answer without Content-Length (status {status})"
            raise ClientError(msg)
        return Answer(status, await reader.readexactly(length))
