"""The two processes of figure 10: a loopback upstream, and a broker in front of it.

`python -m bench.broker_peers upstream`: serves `POST /small` (a short answer) and
`POST /big?bytes=N` (N bytes streamed in 64 KiB chunks) and `POST /stream` (chunks
at an interval, as a model streams), and prints its URL.
`python -m bench.broker_peers broker <upstream URL>`: starts the server's own
`Broker` (as the server runs it), issues one grant for that upstream, and prints
its URL and the placeholder. Each runs until stdin closes.
"""

from __future__ import annotations

import asyncio
import socket
import sys
from collections.abc import AsyncIterator

import uvicorn
from pydantic import SecretStr
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from agent_server.broker import Broker, Grant

CHUNK = 64 * 1024
_BLOCK = b"x" * CHUNK


async def _small(request: Request) -> Response:
    await request.body()
    return Response(b'{"ok": true}', media_type="application/json")


async def _big(request: Request) -> Response:
    await request.body()
    total = int(request.query_params.get("bytes", "0"))

    async def chunks() -> AsyncIterator[bytes]:
        sent = 0
        while sent < total:
            piece = _BLOCK[: min(CHUNK, total - sent)]
            sent += len(piece)
            yield piece

    return StreamingResponse(chunks(), media_type="application/octet-stream")


async def _stream(request: Request) -> Response:
    """A chunk of `bytes` every `interval` s for `seconds`: a model streaming its answer."""
    await request.body()
    seconds = float(request.query_params.get("seconds", "1"))
    size = int(request.query_params.get("bytes", "1024"))
    interval = float(request.query_params.get("interval", "0.01"))

    async def chunks() -> AsyncIterator[bytes]:
        end = asyncio.get_running_loop().time() + seconds
        while asyncio.get_running_loop().time() < end:
            yield b"z" * size
            await asyncio.sleep(interval)

    return StreamingResponse(chunks(), media_type="text/event-stream")


async def _until_stdin_closes() -> None:
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)


async def _upstream() -> None:
    app = Starlette(
        routes=[
            Route("/small", _small, methods=["POST"]),
            Route("/big", _big, methods=["POST"]),
            Route("/stream", _stream, methods=["POST"]),
        ]
    )
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(app, lifespan="off", log_config=None, access_log=False)
    config.load()
    server = uvicorn.Server(config)
    server.lifespan = config.lifespan_class(config)
    await server.startup(sockets=[sock])
    print(f"http://127.0.0.1:{sock.getsockname()[1]}", flush=True)
    await _until_stdin_closes()
    server.should_exit = True
    await server.shutdown(sockets=[sock])


async def _broker(upstream: str) -> None:
    broker = Broker()
    url = await broker.start()
    placeholder = broker.grants.issue(Grant("x-api-key", SecretStr("bench-key"), upstream), "")
    print(url, placeholder, flush=True)
    await _until_stdin_closes()
    await broker.stop()


if __name__ == "__main__":
    if sys.argv[1] == "upstream":
        asyncio.run(_upstream())
    else:
        asyncio.run(_broker(sys.argv[2]))
