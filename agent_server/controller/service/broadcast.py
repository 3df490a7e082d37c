"""The service's events, fanned out to every `GET /v1/events` subscriber.

`publish` never waits: each subscriber has a bounded queue, and a subscriber whose
queue is full (a slow reader) is dropped rather than let stall a walk, whose event
hook calls `publish` synchronously. A dropped subscriber's stream ends; its client
reconnects and refetches `/v1/pool`.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

QUEUE_SIZE = 256
"""Events held for one subscriber before it counts as too slow."""
KEEPALIVE_S = 15.0
"""A comment line this often, so proxies and the page see a live stream."""
_CLOSED = None


class Broadcast:
    """Subscribers' queues; `publish` offers each event to all of them."""

    def __init__(self, queue_size: int = QUEUE_SIZE) -> None:
        self._queue_size = queue_size
        self._queues: set[asyncio.Queue[tuple[str, dict[str, Any]] | None]] = set()
        self.dropped = 0
        self._closed = False

    @property
    def subscribers(self) -> int:
        """How many streams are open."""
        return len(self._queues)

    def publish(self, kind: str, data: dict[str, Any]) -> None:
        """Offer one event (`kind`: its SSE `event:` name) to every subscriber, now."""
        for queue in list(self._queues):
            try:
                queue.put_nowait((kind, data))
            except asyncio.QueueFull:
                self._drop(queue)

    def _drop(self, queue: asyncio.Queue[tuple[str, dict[str, Any]] | None]) -> None:
        self._queues.discard(queue)
        self.dropped += 1
        if queue.full():  # room for the end marker: the oldest event gives way to it
            queue.get_nowait()
        queue.put_nowait(_CLOSED)

    def close(self) -> None:
        """End every stream, and every one opened later (the service is shutting down)."""
        self._closed = True
        for queue in list(self._queues):
            self._drop(queue)

    async def stream(self, keepalive_s: float = KEEPALIVE_S) -> AsyncIterator[str]:
        """One subscriber's server-sent events, until it is dropped or the service closes."""
        if self._closed:  # opened after the shutdown began: it would hold the shutdown
            return
        queue: asyncio.Queue[tuple[str, dict[str, Any]] | None] = asyncio.Queue(self._queue_size)
        self._queues.add(queue)
        try:
            yield ": connected\n\n"
            while True:
                try:
                    item = await asyncio.wait_for(queue.get(), keepalive_s)
                except TimeoutError:
                    yield ": keepalive\n\n"
                    continue
                if item is _CLOSED:
                    return
                kind, data = item
                yield f"event: {kind}\ndata: {json.dumps(data)}\n\n"
        finally:
            self._queues.discard(queue)
