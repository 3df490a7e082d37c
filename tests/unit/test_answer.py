"""The answer of a turn: its body, its session id, its redaction and Retry-After."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from agent_server.execution.answer import FinishedTurn, build_answer
from agent_server.execution.outcome import ROWS, Outcome
from agent_server.execution.transcript import Transcript
from agent_server.names import OutcomeKind
from agent_server.redaction import MASK, Redactor
from agent_server.runtimes.stream import TurnStream

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
    transcript = Transcript(1024)
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
    answer = build_answer(_outcome(OutcomeKind.SUCCESS), _turn(TurnStream()), Redactor(), NOW)
    assert answer.session_id is None
    assert answer.body["session_id"] is None
    assert answer.body["metadata"]["session_id"] is None


def test_the_cli_session_id_is_reported() -> None:
    """The id the CLI's stream carried is the answer's."""
    stream = TurnStream(session_id="abc-123", result_text="done", has_result=True)
    answer = build_answer(_outcome(OutcomeKind.SUCCESS), _turn(stream), Redactor(), NOW)
    assert (answer.session_id, answer.body["response"]) == ("abc-123", "done")


def test_every_string_of_a_success_is_redacted() -> None:
    """The response text and the execution log pass the redactor."""
    stream = TurnStream(result_text=f"the key is {SECRET}", has_result=True)
    line = b'{"type": "assistant", "text": "' + SECRET.encode() + b'"}'
    answer = build_answer(_outcome(OutcomeKind.SUCCESS), _turn(stream, (line,)), _redactor(), NOW)
    assert SECRET not in str(answer.body)
    assert MASK in answer.body["response"]


def test_an_error_is_the_contract_body_with_retry_after() -> None:
    """A rate limit with a known reset: 429, the §7 detail, Retry-After in whole seconds."""
    outcome = _outcome(
        OutcomeKind.RATE_LIMIT, f"limit for {SECRET}", resets_at=NOW + timedelta(seconds=90.2)
    )
    answer = build_answer(outcome, _turn(TurnStream()), _redactor(), NOW)
    assert answer.status == 429
    detail = answer.body["detail"]
    assert (detail["error_code"], detail["switch_credential"]) == ("rate_limit", True)
    assert detail["resets_at"] == "2026-12-01T12:01:31Z"
    assert answer.headers == {"Retry-After": "91"}
    assert SECRET not in detail["message"]
