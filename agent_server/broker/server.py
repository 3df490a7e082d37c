"""The broker's own listener: a loopback port served on a thread and event loop of its own.

Started in the app's lifespan and stopped at its end. Its loop runs on its own thread,
so 32 turns streaming their API's answers through it never queue in front of the
control routes (a reload-token, /health) on the server's loop; and each read of an
upstream's answer is passed on in one short callback (`upstream`), so the thread
hands the interpreter back to the server's loop at once.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import socket
import threading

from agent_server.broker.forward import Forwarder
from agent_server.broker.inbound import CliConnection

logger = logging.getLogger("agent_server.broker")

LOOPBACK = "127.0.0.1"
START_TIMEOUT_S = 10.0


class BrokerServer:
    """One loopback listener serving a `Forwarder`; `url` is known once it started."""

    def __init__(self, forwarder: Forwarder) -> None:
        self.forwarder = forwarder
        self.url = ""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None
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
        started = threading.Event()
        self._thread = threading.Thread(
            target=self._run, args=(sock, started), name="broker", daemon=True
        )
        self._thread.start()
        await asyncio.to_thread(started.wait, START_TIMEOUT_S)
        if self._stopping is None:
            msg = f"the broker did not start: {self._failed!r}"
            raise RuntimeError(msg)
        self.url = f"http://{LOOPBACK}:{sock.getsockname()[1]}"
        logger.info("broker listening on %s", self.url)
        return self.url

    def _run(self, sock: socket.socket, started: threading.Event) -> None:
        """The broker thread: its own loop, from listening to the upstream connections' close."""

        async def serve() -> None:
            forwarder = self.forwarder
            live: set[CliConnection] = set()
            factory = functools.partial(CliConnection, forwarder, forwarder.max_request_bytes, live)
            try:
                server = await asyncio.get_running_loop().create_server(
                    factory, sock=sock, backlog=1024
                )
                self._loop, self._stopping = asyncio.get_running_loop(), asyncio.Event()
            finally:
                started.set()
            await self._stopping.wait()
            server.close()
            for connection in list(live):  # a CLI's kept-alive connection ends with the broker
                connection.abort()
            forwarder.close()
            await asyncio.sleep(0)  # the aborted transports' close callbacks run
            await server.wait_closed()

        try:
            asyncio.run(serve())
        except BaseException as failed:  # reported by `start`, or logged at `stop`
            self._failed = failed
            started.set()
        finally:
            sock.close()

    async def stop(self) -> None:
        """Stop listening and close the upstream connections (idempotent)."""
        loop, self._loop = self._loop, None
        thread, self._thread = self._thread, None
        if loop is None or thread is None or self._stopping is None:
            return
        loop.call_soon_threadsafe(self._stopping.set)
        await asyncio.to_thread(thread.join, START_TIMEOUT_S)
        if self._failed is not None:
            logger.warning("the broker stopped on an error: %r", self._failed)
