"""A raw asyncio-streams client for the slow-client tests: read until closed, trickle, close;
and the kernel's view of a socket that is not read."""

from __future__ import annotations

import asyncio
import contextlib
import socket

TCP_ESTABLISHED = 1
"""`tcp_state` of an open connection (linux/tcp_states.h)."""


async def until_closed(reader: asyncio.StreamReader, within: float) -> bytes:
    """What the server sent before it closed the connection (fails after `within` s)."""
    data = b""
    with contextlib.suppress(ConnectionResetError):
        async with asyncio.timeout(within):
            while chunk := await reader.read(65536):
                data += chunk
    return data


async def trickle(writer: asyncio.StreamWriter, every: float = 0.1) -> None:
    """A byte every `every` seconds until cancelled or the connection breaks."""
    with contextlib.suppress(ConnectionError):
        while True:
            await asyncio.sleep(every)
            writer.write(b"a")
            await writer.drain()


async def close(writer: asyncio.StreamWriter) -> None:
    """Close a client connection whatever state the server left it in."""
    writer.close()
    with contextlib.suppress(ConnectionError):
        await writer.wait_closed()


def tcp_state(sock: socket.socket) -> int:
    """The kernel's TCP state of `sock` (tcpi_state), seen without reading what it holds:
    no longer `TCP_ESTABLISHED` once the server reset (or closed) the connection."""
    return sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 8)[0]
