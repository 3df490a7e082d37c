"""A turn's live events (contract §6.7): named by type, bounded, replayed to a late
subscriber, ended by the terminal."""

from __future__ import annotations

import asyncio
import json
import time

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


# --- the server's own event types are not the CLI's to use -------------------------------

WITHHELD = "withheld"
CLIPPED = "clipped"
PAD = "x" * MAX_EVENT_BYTES


@pytest.mark.parametrize(
    ("line", "name", "kept"),
    [
        pytest.param('{"type":"terminal","status":"success"}', "line", WITHHELD, id="a terminal"),
        pytest.param('{"type":"stream_end"}', "line", WITHHELD, id="a stream_end"),
        pytest.param(' { "type" : "stream_end" } ', "line", WITHHELD, id="spaced out"),
        pytest.param('{"type":"termin\\u0061l"}', "line", WITHHELD, id="the value escaped"),
        pytest.param('{"typ\\u0065":"stream_end"}', "line", WITHHELD, id="the key escaped"),
        pytest.param(
            '{"type":"assistant","type":"terminal"}', "line", WITHHELD, id="a second type key"
        ),
        pytest.param(
            '{"type":"terminal","type":"assistant"}', "line", WITHHELD, id="a first type key"
        ),
        pytest.param(
            '{"m":{"type":"terminal"},"type":"assistant"}',
            "line",
            WITHHELD,
            id="nested (a later mask of the brace would raise it)",
        ),
        pytest.param('{"type":"terminal",}', "line", WITHHELD, id="no JSON but a lenient reader's"),
        pytest.param('{"type":"terminal"} {"a":1}', "line", WITHHELD, id="two objects"),
        pytest.param(
            '{"type":"terminal","pad":"' + PAD + '"}', "line", CLIPPED, id="too long to keep"
        ),
        pytest.param(
            '{"type":"assistant","text":"open a terminal, type \\"stream_end\\""}',
            "assistant",
            None,
            id="the words in a string are the CLI's",
        ),
        pytest.param(
            '{"type":"user","content":"\\u001b[1mbold\\u001b[0m"}', "user", None, id="escapes"
        ),
        pytest.param('{"type":"rate_limit_event"}', "rate_limit_event", None, id="its own type"),
        pytest.param('"terminal"', "line", None, id="a JSON string"),
        pytest.param('[{"type":"terminal"}]', "line", None, id="an array (no type of its own)"),
        pytest.param("terminal stream_end", "line", None, id="no JSON"),
    ],
)
def test_no_cli_line_is_named_or_typed_as_the_servers_own(
    line: str, name: str, kept: str | None
) -> None:
    """The server's types are reserved: such a line is `line`, withheld or clipped to its
    size; any other keeps its own name and data."""
    progress = Progress()
    progress.add_line(line.encode())
    progress.close({})
    event, terminal = asyncio.run(_collect(progress))
    assert event.name == name
    if kept is None:
        assert event.data == line
    else:
        assert json.loads(event.data) == {"type": name, kept: True, "bytes": len(line)}
    assert terminal.name == "terminal"


def test_a_line_nested_past_the_parsers_depth_is_withheld() -> None:
    """Too deep to read, it cannot be shown to hold no terminal: withheld."""
    depth = 2500
    line = '{"a":' * depth + '{"type":"terminal"}' + "}" * depth
    assert len(line) < MAX_EVENT_BYTES
    progress = Progress()
    progress.add_line(line.encode())
    progress.close({})
    event, _ = asyncio.run(_collect(progress))
    assert (event.name, json.loads(event.data)["withheld"]) == ("line", True)


@pytest.mark.parametrize(
    ("line", "last"),
    [
        pytest.param(b'{"type":"system","subtype":"api_retry","attempt":3}', "system/api_retry",
                     id="the CLI retrying the API itself"),
        pytest.param(b'{"type":"system","subtype":"init"}', "system/init", id="init"),
        pytest.param(b'{"type":"assistant","message":{}}', "assistant", id="the model's text"),
        pytest.param(b'{"type":"system"}', "system", id="a system event without subtype"),
        pytest.param(b"plain text", "line", id="a line that names no type"),
        pytest.param(b'{"type":"terminal"}', "line", id="a forged server event is a line"),
    ],
)  # fmt: skip
def test_the_last_event_says_what_the_cli_is_doing(line: bytes, last: str) -> None:
    """The running list shows the CLI's last event, by type and a system event's subtype."""
    progress = Progress()
    before = time.time()
    progress.add_line(line)
    assert progress.last is not None
    assert progress.last[0] == last
    assert before <= progress.last[1] <= time.time()


def test_a_line_of_escapes_is_written_as_json_writes_it() -> None:
    """A secret printed with every character `\\u`-escaped reaches the event spelt plainly,
    where the redactor finds it (as the answer, which parses the line, does)."""
    secret = "tsec-escaped-0123456789"
    escaped = "".join(f"\\u{ord(c):04x}" for c in secret)
    progress = Progress()
    progress.add_line(b'{"type":"assistant","text":"' + escaped.encode() + b'"}')
    progress.add_line(b'["\\u00e9", "\\u2028"]')  # no object: left as it is
    progress.close({"execution_id": "e", "status": "success", "http_status": 200})
    first, array, _ = asyncio.run(_collect(progress))
    assert first.data == json.dumps({"type": "assistant", "text": secret}, separators=(",", ":"))
    assert array.data == '["\\u00e9", "\\u2028"]'


def test_the_last_tool_and_its_summary_are_kept_for_the_heartbeat() -> None:
    from agent_server.records.progress import Progress

    progress = Progress()
    line = (
        b'{"type":"assistant","message":{"content":[{"type":"tool_use","name":"Read",'
        b'"input":{"file_path":"/a"}},{"type":"tool_use","name":"Bash",'
        b'"input":{"command":"ls -la"}}]}}'
    )
    progress.add_line(line)
    assert progress.tool == ("Bash", "ls -la")
    progress.add_line(b'{"type":"assistant","message":{"content":"tool_use"}}')
    assert progress.tool == ("Bash", "ls -la")
