"""The events' fan-out: every subscriber gets each event; a slow one is dropped."""

from __future__ import annotations

import asyncio
import json

import pytest

from agent_server.controller.service.broadcast import Broadcast

pytestmark = pytest.mark.anyio


async def test_each_subscriber_gets_each_event_as_sse() -> None:
    """`event:` the kind, `data:` the JSON, after the opening comment."""
    broadcast = Broadcast()
    stream = broadcast.stream()
    assert await anext(stream) == ": connected\n\n"
    reading = asyncio.ensure_future(anext(stream))
    await asyncio.sleep(0)
    broadcast.publish("walk", {"phase": "served"})
    kind, data = (await reading).strip().split("\n")
    assert (kind, json.loads(data.removeprefix("data: "))) == ("event: walk", {"phase": "served"})
    await stream.aclose()
    assert broadcast.subscribers == 0


async def test_a_slow_subscriber_is_dropped_and_never_stalls_publish() -> None:
    """A subscriber that reads nothing: `publish` returns at once; past the queue's size
    the subscriber is dropped and its stream ends; a quick one keeps every event."""
    broadcast = Broadcast(queue_size=4)
    slow, quick = broadcast.stream(), broadcast.stream()
    await anext(slow), await anext(quick)
    got: list[str] = []
    for n in range(10):
        broadcast.publish("walk", {"n": n})
        got.append(await anext(quick))
    assert broadcast.dropped == 1
    assert broadcast.subscribers == 1
    left = [chunk async for chunk in slow]
    assert len(left) == 3  # the oldest event gave way to the end marker
    assert [json.loads(g.split("data: ")[1])["n"] for g in got] == list(range(10))


async def test_a_quiet_stream_sends_keepalive_comments() -> None:
    """No event within the keepalive: a comment line."""
    stream = Broadcast().stream(keepalive_s=0.01)
    await anext(stream)
    assert await anext(stream) == ": keepalive\n\n"
    await stream.aclose()


async def test_closing_ends_every_stream_after_its_events() -> None:
    """At shutdown each stream gets what was queued, then ends."""
    broadcast = Broadcast()
    stream = broadcast.stream()
    await anext(stream)
    broadcast.publish("walk", {"n": 1})
    broadcast.close()
    assert [chunk.split("\n")[0] async for chunk in stream] == ["event: walk"]
    assert broadcast.subscribers == 0


async def test_a_stream_opened_after_closing_ends_at_once() -> None:
    """A client that subscribes while the service shuts down (its request raced the
    signal) gets an empty stream, not one that holds the shutdown for the drain."""
    broadcast = Broadcast()
    broadcast.close()
    assert [chunk async for chunk in broadcast.stream()] == []
    assert broadcast.subscribers == 0
