"""Claude Code: the argv of §6 and the stream-json parser on the real transcripts."""

from __future__ import annotations

import json

import pytest

from agent_server.runtimes.base import RuntimeAdapter, SpawnHost, TurnSpec
from agent_server.runtimes.claude_code import ClaudeCodeAdapter, ClaudeStreamParser
from agent_server.runtimes.context import context_window_for
from agent_server.runtimes.stream import TurnStream
from tests.support.transcripts import REFERENCE_FIXTURES as FIXTURES
from tests.support.transcripts import load_scenario

BASE = [
    "claude", "--print", "--output-format", "stream-json", "--verbose",
    "--permission-mode", "bypassPermissions",
]  # fmt: skip


@pytest.mark.parametrize(
    ("turn", "tail"),
    [
        pytest.param(
            TurnSpec(prompt="hi", permission_mode="bypassPermissions"), [],
            id="a bare turn has only the fixed flags",
        ),
        pytest.param(
            TurnSpec(
                prompt="hi", permission_mode="bypassPermissions", model="claude-opus-5-5",
                max_turns=3, system_prompt="Be brief.", allowed_tools=("Read", "Bash(git:*)"),
                new_session_id="2b7c0c1e-5f6a-4d39-9a55-0f1f3a9d7e11", persist_session=False,
            ),
            ["--model", "claude-opus-5-5", "--max-turns", "3",
             "--append-system-prompt=Be brief.", "--allowedTools", "Read,Bash(git:*)",
             "--session-id", "2b7c0c1e-5f6a-4d39-9a55-0f1f3a9d7e11", "--no-session-persistence"],
            id="every option in the order of the spec",
        ),
        pytest.param(
            TurnSpec(prompt="hi", permission_mode="bypassPermissions", resume_session_id="s-1",
                     new_session_id="ignored"),
            ["--resume", "s-1"],
            id="resume wins over a new session id",
        ),
        pytest.param(
            TurnSpec(prompt="hi", permission_mode="bypassPermissions", max_turns=0,
                     allowed_tools=()),
            ["--max-turns", "0"],
            id="max turns zero is kept and an empty tool list is dropped",
        ),
    ],
)  # fmt: skip
def test_argv(turn: TurnSpec, tail: list[str]) -> None:
    """argv follows §6 exactly and never carries the prompt."""
    argv = ClaudeCodeAdapter().argv("claude", turn)
    assert argv == BASE + tail
    assert "hi" not in argv


def test_permission_mode_is_passed_through() -> None:
    """The configured permission mode is the one on the command line."""
    argv = ClaudeCodeAdapter().argv("/usr/bin/claude", TurnSpec(prompt="p", permission_mode="plan"))
    assert argv[:7] == ["/usr/bin/claude", *BASE[1:6], "plan"]


def test_prompt_goes_to_stdin_as_utf8() -> None:
    """The prompt is stdin, UTF-8, untouched."""
    turn = TurnSpec(prompt="héllo\n--model x", permission_mode="default")
    assert ClaudeCodeAdapter().stdin(turn) == "héllo\n--model x".encode()


def test_adapter_satisfies_the_protocol() -> None:
    """The adapter is a RuntimeAdapter with the names of the spec."""
    adapter: RuntimeAdapter = ClaudeCodeAdapter()
    assert (adapter.name, adapter.hints.label) == ("claude-code", "Claude Code")
    assert adapter.supports_auth_override is True
    assert adapter.reports_permission_mode is True
    assert isinstance(adapter.new_parser(), ClaudeStreamParser)


def test_success_transcript_fields() -> None:
    """init, prose and result land in their TurnStream fields."""
    stream = _load("success_oauth")
    assert stream.session_id == "32a88ec8-43fe-431d-b5da-8196e55009a2"
    assert (stream.model, stream.permission_mode, stream.api_key_source) == (
        "claude-sonnet-5-5", "default", "none"
    )  # fmt: skip
    assert stream.assistant_text == ["served-by kind=bearer fp=feeb305139b8"]
    assert stream.has_result and not stream.is_error
    assert stream.result_text == "served-by kind=bearer fp=feeb305139b8"
    assert (stream.subtype, stream.terminal_reason) == ("success", "completed")
    assert (stream.num_turns, stream.duration_ms) == (1, 280)
    assert (stream.input_tokens, stream.output_tokens) == (10, 5)
    assert stream.cost_usd == pytest.approx(0.00094)
    assert stream.error_texts == []
    assert stream.rate_limit_info is None  # the `allowed` event is no rejection


def test_api_key_source_is_reported() -> None:
    """The CLI's own view of the credential it used is kept."""
    stream = _load("shadow_api_key_beats_oauth")
    assert stream.api_key_source == "ANTHROPIC_API_KEY"


def test_rate_limit_transcript_fields() -> None:
    """The rejection, the API-error message and the error result are all captured."""
    stream = _load("rate_limit_five_hour_oauth")
    assert stream.error_codes == ["rate_limit"]
    assert (stream.api_error_status, stream.api_error, stream.api_error_type) == (
        429, "usage_limit_reached", "rate_limit_error"
    )  # fmt: skip
    assert stream.rate_limit_info is not None
    assert stream.rate_limit_info["resetsAt"] == 1796194041
    assert stream.rate_limit_info["rateLimitType"] == "five_hour"
    # The API-error message is the CLI's, not the model's prose.
    assert stream.assistant_text == []
    assert stream.error_texts == ["You've hit your 5-hour limit · resets 6:47am (UTC)"]
    assert stream.is_error and stream.terminal_reason == "api_error"


def test_retries_are_recorded() -> None:
    """api_retry events are kept with their status and reason."""
    stream = _load("auth_oauth_401")
    assert [(r["error_status"], r["error"]) for r in stream.api_retries] == [
        (401, "authentication_failed"),
        (401, "authentication_failed"),
    ]


def test_a_null_status_on_the_result_keeps_the_assistant_facts() -> None:
    """`api_error_status: null` on the result never erases what came before."""
    stream = _load("not_logged_in")
    assert stream.api_error_status is None
    assert stream.error_codes == ["authentication_failed"]
    stream = _load("model_not_found")
    assert stream.api_error_status == 404


def test_feed_returns_true_only_for_the_result() -> None:
    """The parser says when the final result arrived."""
    lines = (FIXTURES / "billing_credit_low_api_key.stdout.jsonl").read_bytes().splitlines()
    parser = ClaudeStreamParser()
    assert [parser.feed(line) for line in lines] == [False] * (len(lines) - 1) + [True]


@pytest.mark.parametrize(
    "line",
    [
        pytest.param(b"", id="an empty line"),
        pytest.param(b"not json at all", id="plain text"),
        pytest.param(b"{truncated", id="a truncated object"),
        pytest.param(b"\xff\xfe{}", id="invalid UTF-8"),
        pytest.param(b"[1, 2, 3]", id="a JSON array"),
        pytest.param(b'"a string"', id="a JSON string"),
        pytest.param(b"{" * 100_000, id="absurd nesting"),
        pytest.param(b'{"type": "assistant", "message": "oops"}', id="a malformed assistant"),
        pytest.param(b'{"type": "result", "usage": [], "num_turns": "x"}', id="a malformed result"),
        pytest.param(b'{"type": "system", "subtype": "init", "model": 5}', id="a malformed init"),
        pytest.param(b'{"type": "rate_limit_event", "rate_limit_info": 5}', id="bad info"),
    ],
)
def test_garbage_never_raises(line: bytes) -> None:
    """Anything that is not a well-formed event is ignored or read defensively."""
    parser = ClaudeStreamParser()
    parser.feed(line)
    assert parser.stream.error_texts == []


def test_a_malformed_result_still_counts_as_the_result() -> None:
    """A result with odd fields is still the final event."""
    parser = ClaudeStreamParser()
    assert parser.feed(b'{"type": "result", "usage": [], "num_turns": true}') is True
    assert parser.stream.has_result
    assert parser.stream.num_turns is None


def test_error_result_text_goes_to_the_error_channel() -> None:
    """An is_error result's text and `errors` are error texts; a success's is not."""
    parser = ClaudeStreamParser()
    event = {"type": "result", "is_error": True, "result": "boom", "errors": ["e1", 7]}
    parser.feed(json.dumps(event).encode())
    assert parser.stream.error_texts == ["boom", "e1"]


def test_memory_stays_bounded() -> None:
    """A CLI printing without end cannot grow the stream's texts without bound."""
    parser = ClaudeStreamParser()
    block = {"type": "text", "text": "x" * 100_000}
    prose = {"type": "assistant", "message": {"content": [block]}}
    error = {"type": "assistant", "error": "unknown", "message": {"content": [block]}}
    retry = {"type": "system", "subtype": "api_retry", "error_status": 529}
    for index in range(200):
        parser.feed(json.dumps(prose).encode())
        error["message"] = {"content": [{"type": "text", "text": f"{index}" * 10_000}]}
        parser.feed(json.dumps(error).encode())
        parser.feed(json.dumps(retry).encode())
    stream = parser.stream
    assert sum(map(len, stream.assistant_text)) <= 1_048_576
    assert len(stream.error_texts) <= 32
    assert all(len(text) <= 4096 for text in stream.error_texts)
    assert len(stream.api_retries) <= 64


# --- context: what the last model call's prompt held, and the model's window -------------


def test_the_success_transcript_reports_its_context() -> None:
    """2.1.328's success: the call sent 10 tokens, read 1,200 from the cache and wrote 300
    (the stand-in's usage); a 1,000,000 window."""
    stream = _load("success_oauth")
    assert (stream.call_input_tokens, stream.cache_read_tokens) == (10, 1200)
    assert stream.cache_creation_tokens == 300
    assert stream.context_window == 1_000_000


def _assistant(usage: dict[str, int]) -> bytes:
    message = {"content": [{"type": "text", "text": "ok"}], "usage": usage}
    return json.dumps({"type": "assistant", "message": message}).encode()


def test_the_last_model_call_is_the_context_not_the_turns_sum() -> None:
    """Each assistant event replaces the call's usage; the result's sums do not."""
    parser = ClaudeStreamParser()
    parser.feed(_assistant({"input_tokens": 5, "cache_read_input_tokens": 100}))
    parser.feed(
        _assistant(
            {"input_tokens": 7, "cache_read_input_tokens": 900, "cache_creation_input_tokens": 40}
        )
    )
    total = {"input_tokens": 12, "cache_read_input_tokens": 1000, "output_tokens": 3}
    parser.feed(json.dumps({"type": "result", "usage": total}).encode())
    stream = parser.stream
    assert (stream.call_input_tokens, stream.cache_read_tokens) == (7, 900)
    assert stream.cache_creation_tokens == 40
    assert stream.input_tokens == 12  # the turn's total stays the metadata's input_tokens


def test_with_no_assistant_usage_the_result_gives_the_context() -> None:
    """A result-only stream: its usage is the call's."""
    parser = ClaudeStreamParser()
    usage = {"input_tokens": 3, "cache_read_input_tokens": 50, "cache_creation_input_tokens": 2}
    parser.feed(json.dumps({"type": "result", "usage": usage}).encode())
    stream = parser.stream
    assert (stream.call_input_tokens, stream.cache_read_tokens, stream.cache_creation_tokens) == (
        3, 50, 2
    )  # fmt: skip


@pytest.mark.parametrize(
    ("model", "model_usage", "window"),
    [
        pytest.param("m", {"m": {"contextWindow": 200_000}}, 200_000, id="by the model's key"),
        pytest.param(
            "alias",
            {"m-1": {"contextWindow": 7}, "m-2": {"contextWindow": 9, "canonicalModel": "alias"}},
            9,
            id="by its canonical name",
        ),
        pytest.param(None, {"m": {"contextWindow": 5}}, 5, id="the only entry"),
        pytest.param(
            None, {"a": {"contextWindow": 5}, "b": {"contextWindow": 6}}, None, id="ambiguous"
        ),
        pytest.param("m", {"m": {"contextWindow": 0}}, None, id="a zero window is none"),
        pytest.param("m", {"m": {"contextWindow": "big"}}, None, id="not a number"),
        pytest.param("m", {}, None, id="no usage at all"),
        pytest.param("m", [1], None, id="not an object"),
    ],
)
def test_the_context_window_is_the_models_in_model_usage(
    model: str | None, model_usage: object, window: int | None
) -> None:
    """`modelUsage.<model>.contextWindow`, found by key, canonical name or as the only one."""
    parser = ClaudeStreamParser()
    if model is not None:
        parser.feed(json.dumps({"type": "system", "subtype": "init", "model": model}).encode())
    parser.feed(json.dumps({"type": "result", "modelUsage": model_usage}).encode())
    assert parser.stream.context_window == window


@pytest.mark.parametrize(
    ("model", "window"),
    [
        ("claude-sonnet-4-5", 200_000),
        ("claude-sonnet-4-5[1m]", 1_000_000),
        ("opus", 200_000),
        ("gpt-5-codex", 272_000),
        ("gemini-2.5-pro", 1_000_000),
        ("something-else", 200_000),
        (None, 200_000),
    ],
)
def test_the_fallback_window_goes_by_family(model: str | None, window: int) -> None:
    """When the CLI names no window, the documented table by model family does."""
    assert context_window_for(model) == window


def _load(name: str) -> TurnStream:
    """A reference fixture's stream, parsed by the Claude parser."""
    return load_scenario(FIXTURES, name, ClaudeStreamParser())[0]


@pytest.mark.parametrize(
    ("env", "uid", "mode", "refused"),
    [
        pytest.param({}, 0, "bypassPermissions", True, id="root without IS_SANDBOX is refused"),
        pytest.param({"IS_SANDBOX": "1"}, 0, "bypassPermissions", False, id="IS_SANDBOX=1"),
        pytest.param({"IS_SANDBOX": "true"}, 0, "bypassPermissions", True,
                     id="the CLI wants exactly 1"),
        pytest.param({"CLAUDE_CODE_BUBBLEWRAP": "1"}, 0, "bypassPermissions", False,
                     id="its own bubblewrap sandbox"),
        pytest.param({}, 1000, "bypassPermissions", False, id="another uid"),
        pytest.param({}, 0, "acceptEdits", False, id="a mode that skips no prompt"),
    ],
)  # fmt: skip
def test_readiness(env: dict[str, str], uid: int, mode: str, refused: bool) -> None:
    """The refusal Claude Code makes at every spawn, foreseen; no credential is needed here
    (the controller sends one per turn)."""
    host = SpawnHost(uid=uid, permission_mode=mode, present=lambda path: False)
    problems = ClaudeCodeAdapter().readiness_problems(env, host)
    assert len(problems) == refused
    assert all("IS_SANDBOX=1" in problem for problem in problems)
