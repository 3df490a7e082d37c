"""Gemini CLI: argv with the prompt on stdin, its headless settings, the stream-json parser,
and its real failures."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest

from agent_server.outcome.classify import Outcome, classify_outcome
from agent_server.process.runner import ProcessFacts
from agent_server.runtimes.base import RuntimeAdapter, SpawnHost, TurnSpec
from agent_server.runtimes.gemini import (
    GeminiAdapter,
    GeminiStreamParser,
    error_body_facts,
    headless_settings,
)
from agent_server.runtimes.stream import TurnStream
from agent_server.wire.names import OutcomeKind
from tests.support.contract import stray_controller_words
from tests.support.transcripts import GEMINI_FIXTURES, captured_at, load_scenario

BYPASS = "bypassPermissions"


@pytest.mark.parametrize(
    ("turn", "expected"),
    [
        pytest.param(
            TurnSpec(prompt="hi", permission_mode=BYPASS),
            ["gemini", "--output-format", "stream-json", "--yolo", "--skip-trust"],
            id="a bare turn allows every tool and trusts its workdir for this run",
        ),
        pytest.param(
            TurnSpec(prompt="hi", permission_mode="x", model="gemini-2.5-pro",
                     resume_session_id="3f0b6a2e", allowed_tools=("Read",),
                     persist_session=False),
            ["gemini", "--output-format", "stream-json", "--model", "gemini-2.5-pro",
             "--resume", "3f0b6a2e", "--yolo", "--skip-trust"],
            id="a model and a resume; fields it cannot enforce change nothing",
        ),
    ],
)  # fmt: skip
def test_argv(turn: TurnSpec, expected: list[str]) -> None:
    """argv never carries the prompt, and never a `-p` flag."""
    argv = GeminiAdapter().argv("gemini", turn)
    assert argv == expected
    assert "-p" not in argv
    assert "--prompt" not in argv


def test_stdin_and_protocol() -> None:
    """The prompt is stdin, after the system prompt; what it honours and takes unenforced."""
    adapter: RuntimeAdapter = GeminiAdapter()
    assert adapter.stdin(TurnSpec(prompt="ünï", permission_mode="x")) == "ünï".encode()
    spec = TurnSpec(prompt="fix it", permission_mode="x", system_prompt="You are terse.")
    assert adapter.stdin(spec) == b"You are terse.\n\n---\n\nfix it"
    assert (adapter.name, adapter.hints.label) == ("gemini-cli", "Gemini CLI")
    assert adapter.supports_auth_override is False
    assert adapter.reports_permission_mode is False
    assert adapter.honours == {"model", "system_prompt", "resume_session_id"}
    assert adapter.not_enforced == {"allowed_tools", "persist_session"}
    assert isinstance(adapter.new_parser(), GeminiStreamParser)


@pytest.mark.parametrize(
    ("env", "auth_type"),
    [
        pytest.param({"GEMINI_API_KEY": "k"}, None, id="Google's endpoint: the CLI chooses"),
        pytest.param({"GOOGLE_GEMINI_BASE_URL": "http://gw"}, "gemini-api-key",
                     id="a base URL needs the API-key auth type (else exit 41)"),
        pytest.param({"GOOGLE_GEMINI_BASE_URL": "http://gw", "GOOGLE_GENAI_USE_VERTEXAI": "true"},
                     None, id="Vertex AI chosen already"),
        pytest.param({"GOOGLE_GEMINI_BASE_URL": "http://gw", "GOOGLE_GENAI_USE_GCA": "true"},
                     None, id="a Google login chosen already"),
        pytest.param({"GOOGLE_GEMINI_BASE_URL": "", "GEMINI_API_KEY": "k"}, None,
                     id="an empty base URL is none"),
    ],
)  # fmt: skip
def test_headless_settings(env: dict[str, str], auth_type: str | None) -> None:
    """Retries and the session cleanup always off; an auth type only where the CLI would
    find none it can use."""
    settings = headless_settings(env)
    assert settings["general"] == {"maxAttempts": 1, "sessionRetention": {"enabled": False}}
    assert settings.get("security", {}).get("auth", {}).get("selectedType") == auth_type


def test_the_settings_are_gemini_system_defaults() -> None:
    """One file, pointed at by GEMINI_CLI_SYSTEM_DEFAULTS_PATH, holding those settings."""
    env = {"GOOGLE_GEMINI_BASE_URL": "http://gw", "GEMINI_API_KEY": "k"}
    (file,) = GeminiAdapter().spawn_files(env)
    assert file.variable == "GEMINI_CLI_SYSTEM_DEFAULTS_PATH"
    assert json.loads(file.content) == headless_settings(env)
    assert b'"k"' not in file.content  # no credential ever goes into a file


def _capture(name: str) -> tuple[TurnStream, ProcessFacts]:
    return load_scenario(GEMINI_FIXTURES, name, GeminiStreamParser())


def test_a_served_turn_reads_its_session_reply_and_stats() -> None:
    """The real success: init's session and model, the reply, the token counts."""
    stream, _ = _capture("success")
    assert stream.session_id is not None and len(stream.session_id) == 36
    assert stream.model == "gemini-2.5-flash"
    assert stream.result_text is not None and stream.result_text.startswith("served-by fp=")
    assert (stream.input_tokens, stream.output_tokens) == (1500, 5)
    assert stream.has_result and not stream.is_error
    assert stream.error_texts == []


def _classify(name: str) -> Outcome:
    stream, facts = _capture(name)
    return classify_outcome(
        stream,
        facts,
        hints=GeminiAdapter.hints,
        expected_permission_mode=None,
        now=captured_at(GEMINI_FIXTURES, name),
    )


@pytest.mark.parametrize(
    ("name", "kind", "status", "message"),
    [
        pytest.param("success", OutcomeKind.SUCCESS, None, "", id="a success"),
        pytest.param("rate_limit_429", OutcomeKind.RATE_LIMIT, 429,
                     "[API Error: You exceeded your current quota",
                     id="a per-minute quota is a rate limit (its status from exit 173)"),
        pytest.param("daily_quota_429", OutcomeKind.RATE_LIMIT, 429,
                     "[API Error: You have exhausted your daily quota",
                     id="a per-day quota is a rate limit too"),
        pytest.param("key_invalid_400", OutcomeKind.AUTH, 400, "[API Error:",
                     id="a bad key is auth although Google says 400"),
        pytest.param("auth_401", OutcomeKind.AUTH, 401, "[API Error:",
                     id="401 is auth"),
        pytest.param("missing_key", OutcomeKind.AUTH, None,
                     "When using Gemini API, you must specify the GEMINI_API_KEY",
                     id="a missing key is auth, its exit 41 notwithstanding"),
        pytest.param("model_not_found", OutcomeKind.MODEL_UNSUPPORTED, None,
                     "Model unsupported: [API Error: models/gemini-nonexistent-9 is not found",
                     id="an unknown model is a model rejection"),
        pytest.param("server_error_500", OutcomeKind.UPSTREAM_UNAVAILABLE, 500, "[API Error:",
                     id="500 is upstream"),
        pytest.param("unavailable_503", OutcomeKind.UPSTREAM_UNAVAILABLE, 503,
                     "[API Error: The model is overloaded",
                     id="503 is upstream (its status from exit 247)"),
        pytest.param("invalid_auth_method", OutcomeKind.CONTAINER_FAULT, None,
                     "Permission bypass failed: Gemini CLI refuses to run here: it has no auth",
                     id="no usable auth method is the container's, never auth"),
        pytest.param("untrusted_workdir", OutcomeKind.CONTAINER_FAULT, None,
                     "Permission bypass failed: Gemini CLI refuses to run here: it does not trust",
                     id="an untrusted workdir is the container's"),
        pytest.param("unknown_session_resume", OutcomeKind.EXECUTION_ERROR, None,
                     "Error resuming session", id="an unknown session is no row"),
    ],
)  # fmt: skip
def test_every_real_outcome_reaches_its_row(
    name: str, kind: OutcomeKind, status: int | None, message: str
) -> None:
    """The real CLI's transcripts, through the §7 table."""
    outcome = _classify(name)
    assert outcome.kind is kind, outcome
    assert outcome.api_error_status == status
    assert outcome.message.startswith(message), outcome.message
    assert not stray_controller_words(outcome.error_code, outcome.message), outcome.message


def test_a_quota_with_a_retry_delay_resets_after_it() -> None:
    """`Please retry in 3600s.`: resets_at an hour after the turn; the daily one has none."""
    outcome = _classify("rate_limit_429")
    ran = captured_at(GEMINI_FIXTURES, "rate_limit_429")
    assert outcome.resets_at is not None
    assert timedelta(hours=1) <= outcome.resets_at - ran <= timedelta(hours=1, seconds=1)
    assert _classify("daily_quota_429").resets_at is None


def test_an_unknown_session_is_known_as_such() -> None:
    """`Error resuming session`: the chat starts a new session instead (contract §6.4)."""
    _, facts = _capture("unknown_session_resume")
    markers = GeminiAdapter.hints.unknown_session_markers
    assert any(marker in facts.stderr.lower() for marker in markers)


def test_error_bodies_become_structured_facts() -> None:
    """The quoted Google error body gives api_error_status and its status name."""
    stream, _ = _capture("auth_401")
    assert stream.has_result and stream.is_error
    assert stream.api_error_status == 401
    assert stream.api_error_type == "UNAUTHENTICATED"


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


def test_the_turn_limit_is_max_turns() -> None:
    """Exit 53 (`Reached max session turns`, a settings cap no stand-in reaches) is row 10."""
    text = "Reached max session turns for this session."
    outcome = classify_outcome(
        TurnStream(),
        ProcessFacts(exit_code=53, stderr=text),
        hints=GeminiAdapter.hints,
        expected_permission_mode=None,
        now=captured_at(GEMINI_FIXTURES, "success"),
    )
    assert outcome.kind is OutcomeKind.MAX_TURNS


@pytest.mark.parametrize(
    ("env", "files", "problems"),
    [
        pytest.param({"GEMINI_API_KEY": "k"}, set(), [], id="an API key is enough"),
        pytest.param({"GOOGLE_API_KEY": "k"}, set(), [], id="so is a Vertex express key"),
        pytest.param({"GOOGLE_CLOUD_PROJECT": "p"}, set(), [], id="so is a Vertex project"),
        pytest.param({"HOME": "/h"}, {"/h/.gemini/oauth_creds.json"}, [],
                     id="so is a Google login"),
        pytest.param({"HOME": "/h", "GEMINI_CLI_HOME": "/g"}, {"/g/.gemini/oauth_creds.json"},
                     [], id="GEMINI_CLI_HOME moves where the login is"),
        pytest.param({"HOME": "/h"}, set(), ["no credential"], id="nothing to authenticate with"),
        pytest.param({"GEMINI_API_KEY": "k", "GEMINI_RESTRICTED_MODE": "true"}, set(),
                     ["restricted mode"], id="restricted mode trusts no workdir"),
    ],
)  # fmt: skip
def test_readiness(env: dict[str, str], files: set[str], problems: list[str]) -> None:
    """What would refuse every turn, named without a value."""
    host = SpawnHost(uid=1000, permission_mode=BYPASS, present=lambda path: str(path) in files)
    found = GeminiAdapter().readiness_problems(env, host)
    assert len(found) == len(problems)
    assert all(word in text for word, text in zip(problems, found, strict=True))


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
