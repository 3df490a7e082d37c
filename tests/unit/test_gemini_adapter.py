"""Gemini CLI: argv with the prompt on stdin, the stream-json parser, its failures."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from agent_server.execution.outcome import classify_outcome
from agent_server.execution.runner import ProcessFacts
from agent_server.names import OutcomeKind
from agent_server.runtimes.base import RuntimeAdapter, TurnSpec
from agent_server.runtimes.gemini import GeminiAdapter, GeminiStreamParser, error_body_facts
from agent_server.runtimes.stream import TurnStream
from tests.support.transcripts import SAMPLES, replay, stderr_beside

GEMINI = SAMPLES / "gemini"
NOW = datetime(2025, 11, 30, 7, 51, tzinfo=UTC)


def parse_sample(name: str) -> tuple[TurnStream, list[bool]]:
    return replay(GeminiStreamParser(), GEMINI / f"{name}.jsonl")


@pytest.mark.parametrize(
    ("turn", "expected"),
    [
        pytest.param(
            TurnSpec(prompt="hi", permission_mode="bypassPermissions"),
            ["gemini", "--output-format", "stream-json", "--yolo"],
            id="a bare turn",
        ),
        pytest.param(
            TurnSpec(prompt="hi", permission_mode="x", model="gemini-2.5-pro"),
            ["gemini", "--output-format", "stream-json", "--model", "gemini-2.5-pro", "--yolo"],
            id="a model is passed with --model",
        ),
    ],
)
def test_argv(turn: TurnSpec, expected: list[str]) -> None:
    """argv never carries the prompt, and never a `-p` flag."""
    argv = GeminiAdapter().argv("gemini", turn)
    assert argv == expected
    assert "-p" not in argv
    assert "--prompt" not in argv


def test_stdin_and_protocol() -> None:
    """The prompt is stdin; Gemini takes no Claude credential and reports no mode."""
    adapter: RuntimeAdapter = GeminiAdapter()
    assert adapter.stdin(TurnSpec(prompt="ünï", permission_mode="x")) == "ünï".encode()
    assert (adapter.name, adapter.hints.label) == ("gemini-cli", "Gemini CLI")
    assert adapter.supports_auth_override is False
    assert adapter.reports_permission_mode is False
    assert isinstance(adapter.new_parser(), GeminiStreamParser)


def test_success_sample_fields() -> None:
    """init, assistant deltas and stats are read; the user echo and tools are not prose."""
    stream, finals = parse_sample("success")
    assert finals == [False] * 6 + [True]
    assert stream.session_id == "c5d7a0a4-2f3e-4a55-9d8e-1f0b7e6c3a21"
    assert stream.model == "gemini-2.5-pro"
    assert stream.result_text == "The log shows a 401 and a RESOURCE_EXHAUSTED quota error."
    assert (stream.input_tokens, stream.output_tokens, stream.duration_ms) == (1410, 122, 2200)
    assert stream.has_result and not stream.is_error
    assert stream.error_texts == []


def test_error_bodies_become_structured_facts() -> None:
    """The quoted Google error body gives api_error_status and its status name."""
    stream, finals = parse_sample("resource_exhausted")
    assert finals[-1] is True
    assert stream.is_error
    assert stream.api_error_status == 429
    assert stream.api_error_type == "RESOURCE_EXHAUSTED"


@pytest.mark.parametrize(
    ("text", "facts"),
    [
        pytest.param('{"error":{"code":429,"status":"RESOURCE_EXHAUSTED"}}',
                     (429, "RESOURCE_EXHAUSTED"), id="a JSON body"),
        pytest.param("[API Error: got status: 503 Service Unavailable.]", (503, None),
                     id="a status quoted in prose"),
        pytest.param("something broke", (None, None), id="no body"),
    ],
)  # fmt: skip
def test_error_body_facts(text: str, facts: tuple[int | None, str | None]) -> None:
    """Codes and status names are read from Gemini's error texts."""
    assert error_body_facts(text) == facts


@pytest.mark.parametrize(
    ("sample", "exit_code", "kind", "status", "resets_at"),
    [
        pytest.param(
            "success", 0, OutcomeKind.SUCCESS, 200, None,
            id="prose and tool output quoting 429 and bad keys stay a success",
        ),
        pytest.param(
            "resource_exhausted", 1, OutcomeKind.RATE_LIMIT, 429,
            NOW + timedelta(hours=1, minutes=49, seconds=8),
            id="exhausted capacity is a rate limit resetting after 1h49m8s",
        ),
        pytest.param(
            "api_key_invalid", 1, OutcomeKind.AUTH, 503, None,
            id="an invalid API key is auth although Google says 400",
        ),
        pytest.param(
            "auth_exit_41", 41, OutcomeKind.AUTH, 503, None,
            id="exit 41 is auth",
        ),
        pytest.param(
            "turn_limit", 53, OutcomeKind.MAX_TURNS, 422, None,
            id="exit 53 is the turn limit",
        ),
    ],
)  # fmt: skip
def test_classification(
    sample: str, exit_code: int, kind: OutcomeKind, status: int, resets_at: datetime | None
) -> None:
    """Gemini's failures reach the right §7 row."""
    stream, _ = parse_sample(sample)
    outcome = classify_outcome(
        stream,
        ProcessFacts(exit_code=exit_code, stderr=stderr_beside(GEMINI / f"{sample}.jsonl")),
        hints=GeminiAdapter.hints,
        expected_permission_mode="bypassPermissions",
        now=NOW,
    )
    assert (outcome.kind, outcome.status) == (kind, status)
    assert outcome.resets_at == resets_at


def test_resource_exhausted_on_stderr_alone_is_a_rate_limit() -> None:
    """With no stream at all, the stderr error body is enough for a rate limit."""
    stderr = stderr_beside(GEMINI / "resource_exhausted.jsonl")
    outcome = classify_outcome(
        TurnStream(),
        ProcessFacts(exit_code=1, stderr=stderr),
        hints=GeminiAdapter.hints,
        expected_permission_mode=None,
        now=NOW,
    )
    assert outcome.kind is OutcomeKind.RATE_LIMIT
    assert outcome.resets_at == NOW + timedelta(hours=1, minutes=49, seconds=8)


@pytest.mark.parametrize(
    "line",
    [
        pytest.param(b"", id="an empty line"),
        pytest.param(b"Loaded cached credentials.", id="a progress line"),
        pytest.param(b'{"type": "result", "error": "x", "stats": 3}', id="a malformed result"),
        pytest.param(b'{"type": "message", "role": "assistant", "content": 5}', id="bad content"),
        pytest.param(b'{"type": "error", "message": null}', id="an empty error"),
    ],
)
def test_garbage_never_raises(line: bytes) -> None:
    """Lines that are not well-formed events never raise."""
    GeminiStreamParser().feed(line)
