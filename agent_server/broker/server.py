"""The broker's own listener: uvicorn on a loopback port, inside the server's event loop.

Started in the app's lifespan and stopped at its end. It never takes the process's
signals (the server's own uvicorn does): uvicorn's `serve` would install handlers of
its own, so this runs its startup, main loop and shutdown itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket

import uvicorn

from agent_server.broker.forward import Forwarder

logger = logging.getLogger("agent_server.broker")

LOOPBACK = "127.0.0.1"


class BrokerServer:
    """One loopback listener serving a `Forwarder`; `url` is known once it started."""

    def __init__(self, forwarder: Forwarder) -> None:
        self.forwarder = forwarder
        self.url = ""
        self._server: uvicorn.Server | None = None
        self._socket: socket.socket | None = None
        self._loop_task: asyncio.Task[None] | None = None

    async def start(self) -> str:
        """Listen on a free loopback port; return the base URL a spawn is given."""
        # IPPROTO_TCP named: asyncio turns Nagle off only on sockets that say TCP (a
        # head and a body written apart would otherwise wait on a delayed ACK).
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((LOOPBACK, 0))
        sock.set_inheritable(False)
        config = uvicorn.Config(
            self.forwarder,
            interface="asgi3",
            lifespan="off",
            log_config=None,
            access_log=False,
            server_header=False,
            date_header=False,
            timeout_keep_alive=75,
        )
        config.load()
        server = uvicorn.Server(config)
        server.lifespan = config.lifespan_class(config)
        await server.startup(sockets=[sock])
        self._server, self._socket = server, sock
        self._loop_task = asyncio.create_task(server.main_loop(), name="broker")
        self.url = f"http://{LOOPBACK}:{sock.getsockname()[1]}"
        logger.info("broker listening on %s", self.url)
        return self.url

    async def stop(self) -> None:
        """Stop listening and close the upstream client (idempotent)."""
        server, self._server = self._server, None
        if server is not None:
            server.should_exit = True
            if self._loop_task is not None:
                with contextlib.suppress(asyncio.CancelledError):
                    await self._loop_task
            await server.shutdown(sockets=[self._socket] if self._socket else None)
        if self._socket is not None:
            self._socket.close()
            self._socket = None
        await self.forwarder.aclose()
