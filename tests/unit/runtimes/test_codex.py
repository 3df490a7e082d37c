"""Codex: argv with the prompt on stdin, the `exec --json` parser, its real failure texts."""

from __future__ import annotations

import tomllib
from datetime import UTC, datetime, timedelta

import pytest

from agent_server.outcome.classify import Outcome, classify_outcome
from agent_server.process.runner import ProcessFacts
from agent_server.runtimes.base import RuntimeAdapter, SpawnHost, TurnSpec
from agent_server.runtimes.codex import CodexAdapter, CodexStreamParser, toml_string
from agent_server.runtimes.stream import TurnStream
from agent_server.wire.names import OutcomeKind
from tests.support.contract import stray_controller_words
from tests.support.transcripts import CODEX_FIXTURES, captured_at, load_scenario

NOW = datetime(2025, 11, 30, 7, 51, tzinfo=UTC)
BYPASS = "bypassPermissions"


@pytest.mark.parametrize(
    ("turn", "expected"),
    [
        pytest.param(
            TurnSpec(prompt="hi", permission_mode=BYPASS),
            ["codex", "exec", "--json", "--skip-git-repo-check",
             "--dangerously-bypass-approvals-and-sandbox", "-"],
            id="a fresh turn skips Codex's sandbox and reads its prompt from stdin",
        ),
        pytest.param(
            TurnSpec(prompt="hi", permission_mode="default", model="gpt-5-codex"),
            ["codex", "exec", "--json", "--model", "gpt-5-codex", "--skip-git-repo-check", "-"],
            id="another permission mode keeps Codex's own sandbox",
        ),
        pytest.param(
            TurnSpec(prompt="hi", permission_mode="x", resume_session_id="0199a213-81c0",
                     new_session_id="ignored", persist_session=False, max_turns=4,
                     allowed_tools=("Read",)),
            ["codex", "exec", "--json", "--skip-git-repo-check", "--ephemeral",
             "resume", "0199a213-81c0", "-"],
            id="a resumed turn uses the resume subcommand after the exec flags",
        ),
        pytest.param(
            TurnSpec(prompt="hi", permission_mode="x", system_prompt='be "terse"'),
            ["codex", "exec", "--json", "--skip-git-repo-check",
             "-c", 'developer_instructions="be \\"terse\\""', "-"],
            id="a system prompt is Codex's developer_instructions, as TOML",
        ),
    ],
)  # fmt: skip
def test_argv(turn: TurnSpec, expected: list[str]) -> None:
    """argv never carries the prompt; `-` makes Codex read it from stdin."""
    assert CodexAdapter().argv("codex", turn) == expected


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("plain words", id="plain words"),
        pytest.param('a "quoted" \\ backslash', id="quotes and a backslash"),
        pytest.param("line one\nline two\ttab\r\n", id="newlines and a tab"),
        pytest.param("\x00\x01\x1f\x7f bell\x07", id="control characters and DEL"),
        pytest.param("ünïcødé 🚀 \u2028", id="non-ASCII, astral and a line separator"),
        pytest.param("= [table] # not a comment '''", id="TOML syntax inside"),
        pytest.param("", id="empty"),
    ],
)
def test_a_system_prompt_reaches_codex_exactly(text: str) -> None:
    """`-c key=<value>` is parsed as TOML: the value parses back to the prompt itself."""
    assert tomllib.loads(f"key = {toml_string(text)}") == {"key": text}


def test_stdin_and_protocol() -> None:
    """The prompt is stdin; no Claude credential, no mode report; what it takes."""
    adapter: RuntimeAdapter = CodexAdapter()
    assert adapter.stdin(TurnSpec(prompt="ünï", permission_mode="x")) == "ünï".encode()
    assert (adapter.name, adapter.hints.label) == ("codex", "Codex")
    assert adapter.supports_auth_override is False
    assert adapter.reports_permission_mode is False
    assert adapter.honours == {"model", "system_prompt", "resume_session_id", "persist_session"}
    assert adapter.not_enforced == {"allowed_tools"}
    assert adapter.spawn_files({"HOME": "/h"}) == ()
    assert isinstance(adapter.new_parser(), CodexStreamParser)


def _capture(name: str) -> tuple[TurnStream, ProcessFacts]:
    return load_scenario(CODEX_FIXTURES, name, CodexStreamParser())


def test_a_served_turn_reads_its_thread_reply_and_usage() -> None:
    """The real success: thread id, reply, usage; its warning item is no error text."""
    stream, _ = _capture("success")
    assert stream.session_id is not None and len(stream.session_id) == 36
    assert stream.result_text is not None and stream.result_text.startswith("served-by fp=")
    assert (stream.input_tokens, stream.output_tokens) == (1500, 5)
    assert stream.has_result and not stream.is_error
    assert stream.error_texts == []


def test_the_failure_text_leads_not_a_warning() -> None:
    """turn.failed's message comes first, ahead of every reconnect; warnings stay out."""
    stream, _ = _capture("auth_401")
    assert stream.error_texts[0].startswith("unexpected status 401 Unauthorized")
    assert all("Model metadata" not in text for text in stream.error_texts)
    assert sum(text.startswith("Reconnecting...") for text in stream.error_texts) == 5


def _classify(name: str) -> Outcome:
    stream, facts = _capture(name)
    return classify_outcome(
        stream,
        facts,
        hints=CodexAdapter.hints,
        expected_permission_mode=None,
        now=captured_at(CODEX_FIXTURES, name),
    )


@pytest.mark.parametrize(
    ("name", "kind", "message"),
    [
        pytest.param("success", OutcomeKind.SUCCESS, "", id="a success"),
        pytest.param("reconnected", OutcomeKind.SUCCESS, "", id="a reconnect, then a success"),
        pytest.param("rate_limit_429", OutcomeKind.RATE_LIMIT,
                     "exceeded retry limit, last status: 429 Too Many Requests",
                     id="429 rate_limit_exceeded is a rate limit"),
        pytest.param("usage_limit", OutcomeKind.RATE_LIMIT, "You\u2019ve hit your usage limit.",
                     id="the usage limit (a curly apostrophe) is a rate limit"),
        pytest.param("quota", OutcomeKind.BILLING,
                     "Quota exceeded. Check your plan and billing details.",
                     id="insufficient_quota is billing"),
        pytest.param("auth_401", OutcomeKind.AUTH, "unexpected status 401 Unauthorized",
                     id="a rejected key is auth"),
        pytest.param("missing_key", OutcomeKind.AUTH,
                     "Missing environment variable: `OPENAI_API_KEY`.",
                     id="a missing key is auth"),
        pytest.param("model_not_found", OutcomeKind.MODEL_UNSUPPORTED,
                     "Model unsupported: The model `gpt-nonexistent-9` does not exist",
                     id="an unknown model is a model rejection, its message the error"),
        pytest.param("server_error_500", OutcomeKind.UPSTREAM_UNAVAILABLE,
                     "We\u2019re currently experiencing high demand",
                     id="a 500 (high demand, no status) is upstream"),
        pytest.param("unavailable_503", OutcomeKind.UPSTREAM_UNAVAILABLE,
                     "unexpected status 503 Service Unavailable",
                     id="a 503 is upstream"),
    ],
)  # fmt: skip
def test_every_real_outcome_reaches_its_row(name: str, kind: OutcomeKind, message: str) -> None:
    """The real CLI's transcripts, through the §7 table; the message is the failure's."""
    outcome = _classify(name)
    assert outcome.kind is kind, outcome
    assert outcome.message.startswith(message), outcome.message
    assert not stray_controller_words(outcome.error_code, outcome.message), outcome.message


def test_the_usage_limit_resets_at_the_quoted_clock() -> None:
    """`try again at 6:48 AM.` (the CLI's local time, UTC here): the next such minute."""
    outcome = _classify("usage_limit")
    ran = captured_at(CODEX_FIXTURES, "usage_limit")
    assert outcome.resets_at is not None
    assert timedelta(minutes=58) <= outcome.resets_at - ran <= timedelta(hours=1)
    assert outcome.resets_at.strftime("%-I:%M %p") in outcome.message


@pytest.mark.parametrize(
    ("text", "kind"),
    [
        pytest.param("Your access token could not be refreshed because your refresh token has "
                     "expired. Please log out and sign in again.", OutcomeKind.AUTH,
                     id="an expired ChatGPT login is auth"),
        pytest.param("exceeded retry limit, last status: 502 Bad Gateway",
                     OutcomeKind.UPSTREAM_UNAVAILABLE, id="a 502 after retries is upstream"),
    ],
)  # fmt: skip
def test_texts_no_stand_in_can_produce(text: str, kind: OutcomeKind) -> None:
    """Codex's own words for a ChatGPT login and a gateway, as its source prints them."""
    stream = TurnStream(has_result=True, is_error=True, error_texts=[text])
    outcome = classify_outcome(
        stream, ProcessFacts(exit_code=1), hints=CodexAdapter.hints,
        expected_permission_mode=None, now=NOW,
    )  # fmt: skip
    assert outcome.kind is kind


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
    ("env", "files", "problems"),
    [
        pytest.param({"OPENAI_API_KEY": "k"}, set(), 0, id="an API key is enough"),
        pytest.param({"CODEX_API_KEY": "k"}, set(), 0, id="so is CODEX_API_KEY"),
        pytest.param({"HOME": "/h"}, {"/h/.codex/auth.json"}, 0, id="so is a login"),
        pytest.param({"CODEX_HOME": "/c"}, {"/c/config.toml"}, 0,
                     id="a config of its own may name a keyless provider"),
        pytest.param({"HOME": "/h", "CODEX_HOME": "/c"}, {"/h/.codex/auth.json"}, 1,
                     id="CODEX_HOME moves where the login must be"),
        pytest.param({"HOME": "/h", "OPENAI_API_KEY": ""}, set(), 1,
                     id="an empty key is none"),
    ],
)  # fmt: skip
def test_readiness(env: dict[str, str], files: set[str], problems: int) -> None:
    """No key, no login, no config: no turn can authenticate, whatever the uid."""
    host = SpawnHost(uid=0, permission_mode=BYPASS, present=lambda path: str(path) in files)
    found = CodexAdapter().readiness_problems(env, host)
    assert len(found) == problems
    assert all("OPENAI_API_KEY" in problem for problem in found)


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
