"""The answer of a turn: its body, its session id, its redaction and Retry-After."""

from __future__ import annotations

import dataclasses
import json
from datetime import UTC, datetime, timedelta

import pytest

from agent_server.execution.answer import FinishedTurn, build_answer
from agent_server.execution.transcript import Transcript
from agent_server.outcome.classify import ROWS, Outcome
from agent_server.redaction.redactor import MASK, Redactor
from agent_server.runtimes.events import MAX_EVENT_DEPTH, load_event
from agent_server.runtimes.stream import TurnStream
from agent_server.wire.names import OutcomeKind

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
SECRET = "unit-answer-secret-0123456789"


def _outcome(kind: OutcomeKind, message: str = "", resets_at: datetime | None = None) -> Outcome:
    row = ROWS[kind]
    return Outcome(
        kind=kind,
        status=row.status,
        error_code=row.error_code,
        retryable=row.retryable,
        switch_credential=row.switch_credential,
        api_error_status=None,
        resets_at=resets_at,
        rate_limit_type=None,
        message=message,
    )


def _turn(stream: TurnStream, lines: tuple[bytes, ...] = ()) -> FinishedTurn:
    transcript = Transcript(1 << 20)
    for line in lines:
        transcript.append(line)
    return FinishedTurn(
        execution_id="e1",
        auth_route="baseline",
        generation=7,
        fingerprint=None,
        stream=stream,
        exit_code=0,
        transcript=transcript,
    )


def _redactor() -> Redactor:
    redactor = Redactor()
    redactor.add([SECRET])
    return redactor


def test_no_session_id_is_reported_that_the_cli_did_not_report() -> None:
    """A stream without a session id answers null, in the body and in the metadata."""
    answer = build_answer(_outcome(OutcomeKind.SUCCESS), _turn(TurnStream()), NOW)
    assert answer.session_id is None
    assert answer.body["session_id"] is None
    assert answer.body["metadata"]["session_id"] is None


def test_the_cli_session_id_is_reported() -> None:
    """The id the CLI's stream carried is the answer's."""
    stream = TurnStream(session_id="abc-123", result_text="done", has_result=True)
    answer = build_answer(_outcome(OutcomeKind.SUCCESS), _turn(stream), NOW)
    assert (answer.session_id, answer.body["response"]) == ("abc-123", "done")


def test_every_string_of_a_success_is_redacted_by_the_gate() -> None:
    """The response text and the execution log come out of `Redactor.clean` masked."""
    stream = TurnStream(result_text=f"the key is {SECRET}", has_result=True)
    line = b'{"type": "assistant", "text": "' + SECRET.encode() + b'"}'
    answer = build_answer(_outcome(OutcomeKind.SUCCESS), _turn(stream, (line,)), NOW)
    body = _redactor().clean(answer.body)
    assert SECRET not in str(body)
    assert MASK in body["response"]
    assert body["execution_log"] == [{"type": "assistant", "text": MASK}]


def test_a_line_that_is_no_sound_event_stays_text_in_the_log() -> None:
    """Too deep, non-finite or a lone surrogate: kept as the line's text, never a 500."""
    deep = b"[" * 100_000 + b"]" * 100_000
    lines = (b'{"total_cost_usd": NaN}', b'{"x": 1e999}', b'{"t": "\\ud83d"}', deep, b"plain")
    answer = build_answer(_outcome(OutcomeKind.SUCCESS), _turn(TurnStream(), lines), NOW)
    log = answer.body["execution_log"]
    assert [type(event) for event in log] == [str] * 5
    assert log[-1] == "plain"


@pytest.mark.parametrize("kind", ["object", "array"])
@pytest.mark.parametrize(
    ("levels", "sound"), [(MAX_EVENT_DEPTH, True), (MAX_EVENT_DEPTH + 1, False)]
)
def test_an_event_nests_max_event_depth_levels_at_most(kind: str, levels: int, sound: bool) -> None:
    """MAX_EVENT_DEPTH containers one inside the other are an event; one more is text."""
    value: object = "leaf"
    for _ in range(levels):
        value = {"a": value} if kind == "object" else [value]
    assert (load_event(json.dumps(value)) is not None) is sound


@pytest.mark.parametrize("line", ['{"\\ud83d": 1}', '["ok", "\\udc00x"]'])
def test_a_lone_surrogate_in_a_key_or_a_list_is_no_event(line: str) -> None:
    """Wherever it is, a lone surrogate makes the line no event."""
    assert load_event(line) is None


@pytest.mark.parametrize(
    ("line", "event"),
    [
        pytest.param(b'{"t": "\\ud83d"}', None, id="an escaped lone surrogate"),
        pytest.param(b'{"t": "\xed\xa0\xbd"}', None, id="an encoded lone surrogate"),
        pytest.param(b'{"t": "\xff"}', None, id="bytes that are not UTF-8"),
        pytest.param(b'{"\\uDC00": 1}', None, id="an upper-case escape in a key"),
        pytest.param(b'{"x": Infinity}', None, id="Infinity"),
        pytest.param(b'{"x": [-Infinity]}', None, id="-Infinity in a list"),
        pytest.param(b'{"x": -1e999}', None, id="a number past the floats"),
        pytest.param(b'{"x": 1e308}', {"x": 1e308}, id="the largest floats are numbers"),
        pytest.param(b'{"t": "\\ud83d\\ude00"}', {"t": "\U0001f600"}, id="an escaped pair"),
        pytest.param('{"t": "é ✓"}'.encode(), {"t": "é ✓"}, id="UTF-8 beyond ASCII"),
        pytest.param(
            b'{"t": "\\\\ud800"}', {"t": "\\ud800"}, id="an escaped backslash before ud800"
        ),
        pytest.param(
            b'{"t": "' + b"{[" * 40 + b'"}', {"t": "{[" * 40}, id="brackets inside a string"
        ),
    ],
)
def test_a_line_is_an_event_exactly_when_it_is_sound(line: bytes, event: object) -> None:
    """A raw output line is read as the walk over its value would judge it, whether the
    text alone can tell (few brackets, no surrogate escape) or the walk must."""
    assert load_event(line) == event


@pytest.mark.parametrize("kind", ["object", "array"])
@pytest.mark.parametrize(
    ("levels", "sound"), [(MAX_EVENT_DEPTH, True), (MAX_EVENT_DEPTH + 1, False)]
)
def test_a_raw_line_nests_max_event_depth_levels_at_most(
    kind: str, levels: int, sound: bool
) -> None:
    """The depth limit holds for a raw output line too, at the count the text check and
    the walk meet."""
    value: object = "leaf"
    for _ in range(levels):
        value = {"a": value} if kind == "object" else [value]
    assert (load_event(json.dumps(value).encode()) is not None) is sound


def test_an_error_is_the_contract_body_with_retry_after() -> None:
    """A rate limit with a known reset: 429, the §7 detail, Retry-After in whole seconds."""
    outcome = _outcome(
        OutcomeKind.RATE_LIMIT, f"limit for {SECRET}", resets_at=NOW + timedelta(seconds=90.2)
    )
    answer = build_answer(outcome, _turn(TurnStream()), NOW)
    assert answer.status == 429
    detail = _redactor().clean(answer.body)["detail"]
    assert (detail["error_code"], detail["switch_credential"]) == ("rate_limit", True)
    assert detail["resets_at"] == "2026-12-01T12:01:31Z"
    assert answer.headers == {"Retry-After": "91"}
    assert SECRET not in detail["message"]


def test_metadata_carries_the_cache_and_the_window() -> None:
    """The last call's cache reads and writes, and the CLI's window; a task has no session."""
    stream = TurnStream(
        model="claude-opus-5-5",
        call_input_tokens=4,
        cache_read_tokens=1200,
        cache_creation_tokens=300,
        context_window=1_000_000,
        has_result=True,
    )
    answer = build_answer(_outcome(OutcomeKind.SUCCESS), _turn(stream), NOW)
    metadata = answer.body["metadata"]
    assert (metadata["cache_read_tokens"], metadata["cache_creation_tokens"]) == (1200, 300)
    assert metadata["context_window"] == 1_000_000
    assert "session" not in answer.body


def test_unreported_cache_is_zero_and_the_window_comes_from_the_table() -> None:
    """A CLI that names neither: 0 and 0, and the model family's window."""
    stream = TurnStream(model="claude-sonnet-4-5[1m]", has_result=True)
    metadata = build_answer(_outcome(OutcomeKind.SUCCESS), _turn(stream), NOW).body["metadata"]
    assert (metadata["cache_read_tokens"], metadata["cache_creation_tokens"]) == (0, 0)
    assert metadata["context_window"] == 1_000_000


def test_a_chat_answer_says_how_full_its_session_is() -> None:
    """`session`: the id, the last call's whole prompt (input + cache) and the window."""
    stream = TurnStream(
        session_id="0f8fad5b-d9cb-469f-a165-70867728950e",
        call_input_tokens=4,
        cache_read_tokens=1200,
        cache_creation_tokens=300,
        has_result=True,
    )
    turn = dataclasses.replace(_turn(stream), chat=True)
    answer = build_answer(_outcome(OutcomeKind.SUCCESS), turn, NOW)
    assert answer.body["session"] == {
        "session_id": "0f8fad5b-d9cb-469f-a165-70867728950e",
        "context_tokens": 1504,
        "context_window": 200_000,
    }
