"""A running turn watched live (contract §6.7): an SSE client joins mid-turn and gets
every event in order, then the terminal, with no secret; Trinity's `/stream` shape too.

The hostile stand-in CLI cannot pass for the server on either route (no line of it is a
`terminal` or a `stream_end`), and a subscriber that stops reading while it floods is
reset at the send deadline with one INFO line (contract §8).
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from agent_server.client_limits import ClientLimits
from agent_server.records.progress import SERVER_EVENT_TYPES
from tests.conftest import SecretRegistry
from tests.e2e.conftest import TurnServers, wait_listed
from tests.support.hostile_cli import FLOOD_SIGNAL, FORGED_SERVER_EVENTS
from tests.support.raw_client import TCP_ESTABLISHED, tcp_state
from tests.support.server import HOSTILE_CLI, ServerProcess

pytestmark = pytest.mark.timeout(120)


@dataclass(frozen=True)
class Event:
    name: str | None
    id: str | None
    data: str


def read_events(response: httpx.Response) -> Iterator[Event]:
    """Server-sent events from a streaming response (comments and pings skipped)."""
    name: str | None = None
    event_id: str | None = None
    data: list[str] = []
    for line in response.iter_lines():
        if not line:
            if data:
                yield Event(name, event_id, "\n".join(data))
            name, event_id, data = None, None, []
        elif line.startswith(":"):
            continue
        else:
            field, _, value = line.partition(":")
            value = value.removeprefix(" ")
            if field == "event":
                name = value
            elif field == "id":
                event_id = value
            elif field == "data":
                data.append(value)


@pytest.fixture
def server(turn_servers: TurnServers, secret_registry: SecretRegistry) -> ServerProcess:
    return turn_servers.start(CLAUDE_CODE_OAUTH_TOKEN=secret_registry.new("live_baseline"))


def _turn(server: ServerProcess, body: dict[str, Any]) -> httpx.Response:
    with server.client(timeout=60) as client:
        return client.post("/api/task", json=body)


def test_a_late_subscriber_gets_every_event_in_order_and_no_secret(
    server: ServerProcess, secret_registry: SecretRegistry
) -> None:
    """Joined during the turn's sleep: the history, then the live events, each the CLI's
    line in the order of the turn's log, ids 1..n without a gap, then `terminal`."""
    echo = "@echo-env CLAUDE_CODE_OAUTH_TOKEN"
    body = {"message": f"{echo}\n@sleep 1.5\n{echo}", "execution_id": "watched"}
    with ThreadPoolExecutor(1) as pool:
        turn = pool.submit(_turn, server, body)
        wait_listed(server, "watched")
        time.sleep(0.5)  # the first echo is history by now
        assert not turn.done()
        with (
            server.client(timeout=60) as client,
            client.stream("GET", "/api/executions/watched/events") as response,
        ):
            assert response.status_code == 200
            assert response.headers["content-type"].startswith("text/event-stream")
            raw: list[str] = []
            events = []
            for event in read_events(response):
                events.append(event)
                raw.append(event.data)
        answer = turn.result(timeout=60)
    assert answer.status_code == 200
    assert [e.id for e in events] == [str(n) for n in range(1, len(events) + 1)]
    *lines, terminal = events
    assert terminal.name == "terminal"
    assert json.loads(terminal.data) == {
        "type": "terminal",
        "execution_id": "watched",
        "status": "success",
        "http_status": 200,
        "error_code": None,
    }
    log = answer.json()["execution_log"]
    assert [json.loads(e.data) for e in lines] == log
    assert [e.name for e in lines] == [entry["type"] for entry in log]
    assert [e.name for e in lines][:2] == ["system", "assistant"]
    assert "[REDACTED]" in lines[1].data
    assert not secret_registry.leaks(raw)


def test_the_stream_route_is_trinitys_shape(server: ServerProcess) -> None:
    """`…/stream`: the same lines unnamed, the terminal, then `stream_end`."""
    with ThreadPoolExecutor(1) as pool:
        turn = pool.submit(_turn, server, {"message": "@sleep 1", "execution_id": "streamed"})
        wait_listed(server, "streamed")
        with (
            server.client(timeout=60) as client,
            client.stream("GET", "/api/executions/streamed/stream") as response,
        ):
            events = list(read_events(response))
        assert turn.result(timeout=60).status_code == 200
    assert {e.name for e in events} == {None}
    types = [json.loads(e.data)["type"] for e in events]
    assert types[0] == "system"
    assert types[-2:] == ["terminal", "stream_end"]


def test_a_finished_turn_replays_and_an_unknown_one_is_404(server: ServerProcess) -> None:
    """Just after the end the events are still there; an id never seen is 404."""
    assert _turn(server, {"message": "quick", "execution_id": "done-1"}).status_code == 200
    with server.client(timeout=30) as client:
        with client.stream("GET", "/api/executions/done-1/events") as response:
            names = [e.name for e in read_events(response)]
        missing = client.get("/api/executions/nope/events")
    assert names[0] == "system"
    assert names[-1] == "terminal"
    assert missing.status_code == 404
    assert missing.json()["detail"]["error_code"] == "not_found"


def test_last_event_id_resumes_where_the_client_was(server: ServerProcess) -> None:
    """A reconnect with Last-Event-ID gets only what came after."""
    assert _turn(server, {"message": "quick", "execution_id": "done-2"}).status_code == 200
    with server.client(timeout=30) as client:
        with client.stream("GET", "/api/executions/done-2/events") as response:
            every = [e.id for e in read_events(response)]
        headers = {"Last-Event-ID": "2"}
        with client.stream("GET", "/api/executions/done-2/events", headers=headers) as response:
            rest = [e.id for e in read_events(response)]
    assert rest == every[2:]


# --- the hostile CLI ------------------------------------------------------------------


def types_seen(data: str) -> set[str]:
    """Each `type` a JSON reader could take for the data's own (the first or the last key)."""
    try:
        pairs = json.loads(data, object_pairs_hook=lambda pairs: pairs)
    except ValueError:
        return set()
    if not isinstance(pairs, list) or not all(isinstance(p, tuple) for p in pairs):
        return set()  # an array or a scalar: no type of its own
    return {value for key, value in pairs if key == "type" and isinstance(value, str)}


def test_no_cli_line_passes_for_the_servers_own_event(turn_servers: TurnServers) -> None:
    """The stand-in prints `terminal` and `stream_end` every way a reader could take them:
    on `…/events` none is named or typed so (each is withheld, or clipped); on
    `…/stream` the only ones are the server's own two, last."""
    server = turn_servers.start(AGENT_SERVER_RUNTIME_COMMAND=str(HOSTILE_CLI))
    body = {"message": "case forged-server-events", "execution_id": "forged"}
    assert _turn(server, body).status_code == 200
    with server.client(timeout=30) as client:
        with client.stream("GET", "/api/executions/forged/events") as response:
            named = list(read_events(response))
        with client.stream("GET", "/api/executions/forged/stream") as response:
            unnamed = list(read_events(response))

    *cli, terminal = named
    assert terminal.name == "terminal"
    assert types_seen(terminal.data) == {"terminal"}
    assert not [e for e in cli if e.name in SERVER_EVENT_TYPES]
    assert not [e for e in cli if types_seen(e.data) & SERVER_EVENT_TYPES]
    summed_up = [json.loads(e.data) for e in cli if e.name == "line"]
    assert sum(s.get("withheld", False) for s in summed_up) == len(FORGED_SERVER_EVENTS) - 1
    assert sum(s.get("clipped", False) for s in summed_up) == 1

    types = [types_seen(e.data) & SERVER_EVENT_TYPES for e in unnamed]
    assert types[-2:] == [{"terminal"}, {"stream_end"}]
    assert not any(types[:-2])


SEND_S = 2.0
"""The send deadline of this test's server (30 s in the product)."""


def test_a_subscriber_that_stops_reading_is_reset_at_the_send_deadline(
    turn_servers: TurnServers,
) -> None:
    """A 4 KiB receive window, nothing read, while the turn prints 8 MiB: once the server
    holds back what it cannot send, the subscriber has `SEND_S`; then its connection is
    reset, with one INFO line and no error; the turn runs on and is terminated."""
    home = turn_servers.home()
    server = turn_servers.start(
        home,
        limits=ClientLimits(send_timeout_s=SEND_S),
        AGENT_SERVER_RUNTIME_COMMAND=str(HOSTILE_CLI),
    )
    with ThreadPoolExecutor(1) as pool:
        turn = pool.submit(_turn, server, {"message": "case flood", "execution_id": "flooded"})
        wait_listed(server, "flooded")
        with socket.socket() as subscriber:
            subscriber.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            subscriber.connect(("127.0.0.1", server.port))
            subscriber.sendall(
                f"GET /api/executions/flooded/events HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                f"X-Trinity-Agent-Token: {server.token}\r\n\r\n".encode()
            )
            time.sleep(0.2)  # subscribed
            (home / "work" / FLOOD_SIGNAL).touch()
            started = time.monotonic()
            while tcp_state(subscriber) == TCP_ESTABLISHED:
                assert time.monotonic() - started < SEND_S + 20, "never reset"
                time.sleep(0.02)
            elapsed = time.monotonic() - started
        print(f"subscriber reset {elapsed:.2f} s after the flood began (deadline {SEND_S} s)")
        assert SEND_S <= elapsed <= SEND_S + 5
        assert "flooded" in server.get("/api/executions/running").text
        assert server.post("/api/executions/flooded/terminate").status_code == 200
        assert turn.result(timeout=60).status_code == 200

    records = server.log_messages()
    guard = [r for r in records if r["logger"] == "agent_server.client_limits"]
    assert [(r["level"], r["message"].split(": ", 1)[1]) for r in guard] == [
        ("INFO", f"it read none of its answer for {SEND_S:g} s")
    ]
    noisy = [r for r in records if r["level"] in ("ERROR", "CRITICAL") or "exception" in r]
    assert not noisy, noisy
