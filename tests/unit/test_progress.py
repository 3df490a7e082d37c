"""A turn's live events (contract §6.7): named by type, bounded, replayed to a late
subscriber, ended by the terminal."""

from __future__ import annotations

import asyncio
import json

import pytest

from agent_server.records.progress import (
    MAX_EVENT_BYTES,
    MAX_EVENTS,
    MAX_HISTORY_BYTES,
    Progress,
    ProgressEvent,
)

pytestmark = pytest.mark.timeout(30)


async def _collect(progress: Progress, after: int = 0) -> list[ProgressEvent]:
    return [event async for event in progress.follow(after)]


def test_events_are_named_by_the_lines_type_and_end_with_the_terminal() -> None:
    """A line's `type` names its event, `line` when it has none; the terminal is last."""
    progress = Progress()
    progress.add_line(b'{"type":"system","subtype":"init"}')
    progress.add_line(b"not json at all")
    progress.add_line(b'{"type": "rate_limit_event", "x": 1}')
    progress.close({"execution_id": "e", "status": "success", "http_status": 200})
    events = asyncio.run(_collect(progress))
    assert [(e.seq, e.name) for e in events] == [
        (1, "system"),
        (2, "line"),
        (3, "rate_limit_event"),
        (4, "terminal"),
    ]
    assert json.loads(events[-1].data)["type"] == "terminal"


def test_a_late_subscriber_gets_the_history_then_live_events() -> None:
    """Joining mid-turn: what came before, then each new line, in order, then the end."""

    async def scenario() -> list[int]:
        progress = Progress()
        progress.add_line(b'{"type":"assistant","n":1}')
        seen: list[int] = []

        async def subscriber() -> None:
            async for event in progress.follow():
                seen.append(event.seq)

        task = asyncio.create_task(subscriber())
        await asyncio.sleep(0.01)
        for n in range(2, 5):
            progress.add_line(f'{{"type":"assistant","n":{n}}}'.encode())
            await asyncio.sleep(0)
        progress.add_line(b'{"type":"result"}')  # two at once, no await between
        progress.close({"status": "success"})
        await asyncio.wait_for(task, 5)
        return seen

    assert asyncio.run(scenario()) == [1, 2, 3, 4, 5, 6]


def test_last_event_id_resumes_after_it() -> None:
    """`after` skips what the subscriber already has."""
    progress = Progress()
    for n in range(5):
        progress.add_line(f'{{"type":"assistant","n":{n}}}'.encode())
    progress.close({})
    assert [e.seq for e in asyncio.run(_collect(progress, after=3))] == [4, 5, 6]


def test_a_huge_line_is_summed_up() -> None:
    """A tool's whole output is not an event: its type and size are."""
    line = b'{"type":"user","content":"' + b"x" * MAX_EVENT_BYTES + b'"}'
    progress = Progress()
    progress.add_line(line)
    progress.close({})
    (event, _) = asyncio.run(_collect(progress))
    assert json.loads(event.data) == {"type": "user", "clipped": True, "bytes": len(line)}


def test_the_history_is_bounded_by_count_and_bytes() -> None:
    """Oldest first out: never more than MAX_EVENTS, nor much more than MAX_HISTORY_BYTES."""
    progress = Progress()
    for n in range(MAX_EVENTS * 2):
        progress.add_line(f'{{"type":"assistant","n":{n}}}'.encode())
    progress.close({})
    events = asyncio.run(_collect(progress))
    assert len(events) == MAX_EVENTS
    assert events[-1].name == "terminal"
    assert events[0].seq == MAX_EVENTS * 2 + 1 - MAX_EVENTS + 1
    big = Progress()
    for _ in range(100):
        big.add_line(b'{"type":"assistant","t":"' + b"y" * (MAX_EVENT_BYTES - 40) + b'"}')
    big.close({})
    held = asyncio.run(_collect(big))
    assert sum(len(e.data) for e in held) <= MAX_HISTORY_BYTES + MAX_EVENT_BYTES
    assert held[-1].name == "terminal"


def test_invalid_utf8_is_replaced_never_an_error() -> None:
    """Bytes that are no UTF-8 become U+FFFD in the event's data."""
    progress = Progress()
    progress.add_line(b'{"type":"assistant","t":"\xff\xfe"}')
    progress.close({})
    (event, _) = asyncio.run(_collect(progress))
    assert "\ufffd" in event.data
