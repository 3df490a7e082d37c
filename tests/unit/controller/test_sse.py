"""`text/event-stream` read a line at a time, as the live-events route writes it."""

from __future__ import annotations

import pytest

from agent_server.controller.sse import EventStreamReader
from agent_server.wire.results import LiveEvent


def _read(text: str) -> list[LiveEvent]:
    reader = EventStreamReader()
    events = [reader.feed(line) for line in text.split("\n")]
    return [event for event in events if event is not None]


@pytest.mark.parametrize(
    ("stream", "expected"),
    [
        pytest.param(
            'event: assistant\nid: 1\ndata: {"type": "assistant"}\n\n',
            [LiveEvent(event="assistant", id="1", data='{"type": "assistant"}')],
            id="a named event with its id",
        ),
        pytest.param(
            "data: one\ndata: two\n\n",
            [LiveEvent(data="one\ntwo")],
            id="several data lines join with a line break",
        ),
        pytest.param(
            ": ping\n\nevent: terminal\ndata: {}\n\n",
            [LiveEvent(event="terminal", data="{}")],
            id="a keep-alive comment is no event",
        ),
        pytest.param("event: x\n\n", [], id="an event with no data is no event"),
        pytest.param("data:no-space\n\n", [LiveEvent(data="no-space")], id="the space is optional"),
        pytest.param(
            "retry: 3000\ndata: a\n\nretry: soon\ndata: b\n\n",
            [LiveEvent(data="a", retry=3000), LiveEvent(data="b")],
            id="retry takes digits only",
        ),
        pytest.param(
            "id: 7\ndata: a\n\ndata: b\n\n",
            [LiveEvent(id="7", data="a"), LiveEvent(id="7", data="b")],
            id="the last event id carries over, as the standard says",
        ),
        pytest.param("bogus: 1\ndata: a\n\n", [LiveEvent(data="a")], id="unknown fields ignored"),
    ],
)
def test_event_stream(stream: str, expected: list[LiveEvent]) -> None:
    """Each stream reads as exactly these events."""
    assert _read(stream) == expected
