"""The broker's own listener: uvicorn on a loopback port, in a thread of its own.

Started in the app's lifespan and stopped at its end. It runs its own event loop on
its own thread, so 32 turns streaming their API's answers through it never queue in
front of the control routes (a reload-token, /health) on the server's loop. It never
takes the process's signals (the server's own uvicorn does): uvicorn's `serve` would
install handlers of its own, so this runs its startup, main loop and shutdown itself.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import threading

import uvicorn

from agent_server.broker.forward import Forwarder

logger = logging.getLogger("agent_server.broker")

LOOPBACK = "127.0.0.1"
START_TIMEOUT_S = 10.0


class BrokerServer:
    """One loopback listener serving a `Forwarder`; `url` is known once it started."""

    def __init__(self, forwarder: Forwarder) -> None:
        self.forwarder = forwarder
        self.url = ""
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self._failed: BaseException | None = None

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
        started = threading.Event()
        self._server = server
        self._thread = threading.Thread(
            target=self._run, args=(server, sock, started), name="broker", daemon=True
        )
        self._thread.start()
        await asyncio.to_thread(started.wait, START_TIMEOUT_S)
        if not server.started:
            msg = f"the broker did not start: {self._failed!r}"
            raise RuntimeError(msg)
        self.url = f"http://{LOOPBACK}:{sock.getsockname()[1]}"
        logger.info("broker listening on %s", self.url)
        return self.url

    def _run(self, server: uvicorn.Server, sock: socket.socket, started: threading.Event) -> None:
        """The broker thread: its own loop, from startup to the upstream client's close."""

        async def serve() -> None:
            try:
                await server.startup(sockets=[sock])
            finally:
                started.set()
            await server.main_loop()
            await server.shutdown(sockets=[sock])
            await self.forwarder.aclose()

        try:
            asyncio.run(serve())
        except BaseException as failed:  # reported by `start`, or logged at `stop`
            self._failed = failed
            started.set()
        finally:
            sock.close()

    async def stop(self) -> None:
        """Stop listening and close the upstream client (idempotent)."""
        server, self._server = self._server, None
        thread, self._thread = self._thread, None
        if server is None or thread is None:
            return
        server.should_exit = True
        await asyncio.to_thread(thread.join, START_TIMEOUT_S)
        if self._failed is not None:
            logger.warning("the broker stopped on an error: %r", self._failed)
