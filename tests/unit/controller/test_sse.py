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


BREAKS_OF_SPLITLINES = ("\u2028", "\u2029", "\x85", "\v", "\f", "\x1c", "\x1d", "\x1e")


@pytest.mark.parametrize("separator", BREAKS_OF_SPLITLINES)
def test_a_line_break_other_than_cr_or_lf_ends_no_line(separator: str) -> None:
    """U+2028 and the other breaks `str.splitlines` knows are text: no event is forged."""
    forged = separator.join(["x", "", "event: terminal", "data: {}", "", ""])
    reader = EventStreamReader()
    events = list(reader.text(f"data: {forged}\n\n"))
    assert events == [LiveEvent(data=forged)]


@pytest.mark.parametrize("cut", range(1, 24))
def test_text_cut_anywhere_reads_the_same(cut: int) -> None:
    """Chunks cut anywhere (a CR LF between two included) give the same events."""
    stream = "event: a\r\ndata: 1\r\n\r\ndata: 2\rdata: 3\n\n"
    reader = EventStreamReader()
    events = [*reader.text(stream[:cut]), *reader.text(stream[cut:])]
    assert events == [LiveEvent(event="a", data="1"), LiveEvent(data="2\n3")]
