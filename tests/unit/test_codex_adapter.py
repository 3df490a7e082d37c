"""Codex: argv with the prompt on stdin, the `exec --json` parser, its failure texts."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from agent_server.execution.outcome import classify_outcome
from agent_server.execution.runner import ProcessFacts
from agent_server.names import OutcomeKind
from agent_server.runtimes.base import RuntimeAdapter, TurnSpec
from agent_server.runtimes.codex import CodexAdapter, CodexStreamParser
from agent_server.runtimes.stream import TurnStream
from tests.support.transcripts import SAMPLES, replay, stderr_beside

CODEX = SAMPLES / "codex"
NOW = datetime(2025, 11, 30, 7, 51, tzinfo=UTC)


def parse_sample(name: str) -> tuple[TurnStream, list[bool]]:
    return replay(CodexStreamParser(), CODEX / f"{name}.jsonl")


def stderr_of(name: str) -> str:
    return stderr_beside(CODEX / f"{name}.jsonl")


@pytest.mark.parametrize(
    ("turn", "expected"),
    [
        pytest.param(
            TurnSpec(prompt="hi", permission_mode="bypassPermissions"),
            ["codex", "exec", "--json", "--skip-git-repo-check", "-"],
            id="a fresh turn reads its prompt from stdin",
        ),
        pytest.param(
            TurnSpec(prompt="hi", permission_mode="bypassPermissions", model="gpt-5-codex"),
            ["codex", "exec", "--json", "--model", "gpt-5-codex", "--skip-git-repo-check", "-"],
            id="a model is passed with --model",
        ),
        pytest.param(
            TurnSpec(prompt="hi", permission_mode="x", resume_session_id="0199a213-81c0",
                     new_session_id="ignored", system_prompt="ignored", max_turns=4),
            ["codex", "exec", "--json", "--skip-git-repo-check", "resume", "0199a213-81c0", "-"],
            id="a resumed turn uses the resume subcommand after the exec flags",
        ),
    ],
)  # fmt: skip
def test_argv(turn: TurnSpec, expected: list[str]) -> None:
    """argv never carries the prompt; `-` makes Codex read it from stdin."""
    assert CodexAdapter().argv("codex", turn) == expected


def test_stdin_and_protocol() -> None:
    """The prompt is stdin; Codex takes no Claude credential and reports no mode."""
    adapter: RuntimeAdapter = CodexAdapter()
    assert adapter.stdin(TurnSpec(prompt="ünï", permission_mode="x")) == "ünï".encode()
    assert (adapter.name, adapter.hints.label) == ("codex", "Codex")
    assert adapter.supports_auth_override is False
    assert adapter.reports_permission_mode is False
    assert isinstance(adapter.new_parser(), CodexStreamParser)


def test_success_sample_fields() -> None:
    """thread id, the agent message and usage are read; only turn.completed is final."""
    stream, finals = parse_sample("success")
    assert finals == [False] * 5 + [True]
    assert stream.session_id == "0199a213-81c0-7800-8aa1-bbab2a035a53"
    assert stream.result_text == stream.assistant_text[-1]
    assert stream.assistant_text == [
        "The handler returns 401 when the OAuth token expired; the rate limit resets 3pm."
    ]
    assert (stream.input_tokens, stream.output_tokens) == (24763, 122)
    assert stream.has_result and not stream.is_error
    assert stream.error_texts == []


def test_failed_turn_fields() -> None:
    """turn.failed is the final, failed result and its text is on the error channel."""
    stream, finals = parse_sample("usage_limit")
    assert finals[-1] is True
    assert stream.has_result and stream.is_error
    assert stream.error_texts == [
        "You've hit your usage limit. Upgrade to Pro (https://openai.com/chatgpt/pricing) "
        "or try again at 3:29 PM."
    ]


@pytest.mark.parametrize(
    ("sample", "exit_code", "kind", "status", "resets_at"),
    [
        pytest.param(
            "success", 0, OutcomeKind.SUCCESS, 200, None,
            id="a reply that talks about 401 and rate limits is a success",
        ),
        pytest.param(
            "reconnected", 0, OutcomeKind.SUCCESS, 200, None,
            id="a turn that completed after a reconnect error is a success",
        ),
        pytest.param(
            "usage_limit", 1, OutcomeKind.RATE_LIMIT, 429,
            datetime(2025, 11, 30, 15, 29, tzinfo=UTC),
            id="the usage limit is a rate limit resetting at the quoted clock time",
        ),
        pytest.param(
            "refresh_token_expired", 1, OutcomeKind.AUTH, 503, None,
            id="an expired refresh token is auth",
        ),
        pytest.param(
            "unauthorized", 1, OutcomeKind.AUTH, 503, None,
            id="a 401 on stderr with no result is auth",
        ),
    ],
)  # fmt: skip
def test_classification(
    sample: str, exit_code: int, kind: OutcomeKind, status: int, resets_at: datetime | None
) -> None:
    """Codex's failure texts reach the right §7 row through the error channels."""
    stream, _ = parse_sample(sample)
    outcome = classify_outcome(
        stream,
        ProcessFacts(exit_code=exit_code, stderr=stderr_of(sample)),
        hints=CodexAdapter.hints,
        expected_permission_mode=None,
        now=NOW,
    )
    assert (outcome.kind, outcome.status) == (kind, status)
    assert outcome.resets_at == resets_at
    assert outcome.switch_credential is (kind in {OutcomeKind.RATE_LIMIT, OutcomeKind.AUTH})


def test_missing_codex_is_the_container_fault_the_controller_knows() -> None:
    """A missing runtime answers the one literal message the controller never switches on."""
    outcome = classify_outcome(
        TurnStream(),
        ProcessFacts(exit_code=None, spawn_failed=True),
        hints=CodexAdapter.hints,
        expected_permission_mode=None,
        now=NOW,
    )
    assert outcome.message == "Claude Code is not available in this container"


@pytest.mark.parametrize(
    "line",
    [
        pytest.param(b"", id="an empty line"),
        pytest.param(b"Reading prompt from stdin...", id="a progress line"),
        pytest.param(b'{"type": "item.completed", "item": "x"}', id="a malformed item"),
        pytest.param(b'{"type": "turn.failed", "error": "x"}', id="a malformed failure"),
        pytest.param(b'{"type": "turn.completed", "usage": 5}', id="malformed usage"),
        pytest.param(b"\xff{", id="invalid UTF-8"),
    ],
)
def test_garbage_never_raises(line: bytes) -> None:
    """Lines that are not well-formed events never raise."""
    CodexStreamParser().feed(line)


def test_legacy_item_type_field() -> None:
    """Older builds' `item_type: assistant_message` is the reply too."""
    parser = CodexStreamParser()
    line = b'{"type":"item.completed","item":{"item_type":"assistant_message","text":"hey"}}'
    parser.feed(line)
    assert parser.stream.result_text == "hey"
