"""The contract §7 outcome table: real Claude Code transcripts, then every row's edge."""

from __future__ import annotations

import dataclasses
import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from agent_server.execution.answer import error_detail, retry_after_seconds
from agent_server.outcome.classify import Outcome, classify_outcome
from agent_server.process.runner import ProcessFacts
from agent_server.runtimes.base import OutcomeHints
from agent_server.runtimes.claude_code import ClaudeCodeAdapter, ClaudeStreamParser
from agent_server.runtimes.codex import CodexAdapter
from agent_server.runtimes.gemini import GeminiAdapter
from agent_server.runtimes.stream import TurnStream
from agent_server.wire.names import OutcomeKind
from tests.support import trinity
from tests.support.contract import ERROR_DETAIL_KEYS, stray_controller_words
from tests.support.transcripts import REFERENCE_FIXTURES, load_scenario

FIXTURES = REFERENCE_FIXTURES
# The fixtures were captured at 2026-11-30T07:51Z; their resetsAt lies an hour later.
CAPTURED = datetime(2026, 12, 2, 5, 47, 21, tzinfo=UTC)
LABEL = "Claude Code"


def parse_lines(lines: list[str]) -> TurnStream:
    """Feed stream-json lines through the Claude parser."""
    parser = ClaudeStreamParser()
    for line in lines:
        parser.feed(line.encode())
    return parser.stream


def classify(
    stream: TurnStream,
    facts: ProcessFacts,
    *,
    expected_permission_mode: str | None = None,
    now: datetime = CAPTURED,
) -> Outcome:
    return classify_outcome(
        stream,
        facts,
        hints=ClaudeCodeAdapter.hints,
        expected_permission_mode=expected_permission_mode,
        now=now,
    )


def load_fixture(name: str) -> tuple[TurnStream, ProcessFacts]:
    """A captured scenario as the runner would hand it to the classifier."""
    return load_scenario(FIXTURES, name, ClaudeStreamParser())


def result_line(**fields: Any) -> str:
    base: dict[str, Any] = {
        "type": "result",
        "subtype": "success",
        "is_error": False,
        "result": "done",
        "num_turns": 1,
        "total_cost_usd": 0.01,
        "usage": {"input_tokens": 10, "output_tokens": 5},
    }
    return json.dumps(base | fields)


def api_error_assistant(text: str, **fields: Any) -> str:
    event = {
        "type": "assistant",
        "message": {"role": "assistant", "content": [{"type": "text", "text": text}]},
        "is_api_error_message": True,
    }
    return json.dumps(event | fields)


def prose(text: str) -> str:
    return json.dumps(
        {"type": "assistant", "message": {"content": [{"type": "text", "text": text}]}}
    )


def retry(status: int, error: str) -> str:
    return json.dumps(
        {"type": "system", "subtype": "api_retry", "attempt": 1, "error_status": status,
         "error": error}
    )  # fmt: skip


def strays(outcome: Outcome) -> list[str]:
    """The controller words the outcome's message holds that its kind must not."""
    return stray_controller_words(outcome.error_code, outcome.message)


# --- the real transcripts ----------------------------------------------------------

FIVE_HOUR_RESET = datetime.fromtimestamp(1796194041, UTC)


@pytest.mark.parametrize(
    ("scenario", "kind", "status", "error_code", "switch", "resets_at", "rate_limit_type"),
    [
        pytest.param(
            "success_oauth", OutcomeKind.SUCCESS, 200, None, False, None, None,
            id="a subscription token that served is a success",
        ),
        pytest.param(
            "success_api_key", OutcomeKind.SUCCESS, 200, None, False, None, None,
            id="an API key that served is a success",
        ),
        pytest.param(
            "shadow_api_key_beats_oauth", OutcomeKind.SUCCESS, 200, None, False, None, None,
            id="a key shadowing the token still served: success",
        ),
        pytest.param(
            "rate_limit_five_hour_oauth", OutcomeKind.RATE_LIMIT, 429, "rate_limit", True,
            FIVE_HOUR_RESET, "five_hour",
            id="the five-hour wall is a rate limit resetting at resetsAt",
        ),
        pytest.param(
            "auth_oauth_401", OutcomeKind.AUTH, 503, "auth", True, None, None,
            id="a rejected token is auth",
        ),
        pytest.param(
            "billing_credit_low_api_key", OutcomeKind.BILLING, 402, "billing", True, None, None,
            id="a key with no credit is billing although the API said 400",
        ),
        pytest.param(
            "model_not_found", OutcomeKind.MODEL_UNSUPPORTED, 400, "model_unsupported", False,
            None, None,
            id="an unknown model is a model rejection and no switch",
        ),
        pytest.param(
            "not_logged_in", OutcomeKind.AUTH, 503, "auth", True, None, None,
            id="no credential at all is auth although the status is null",
        ),
    ],
)  # fmt: skip
def test_real_transcripts(
    scenario: str,
    kind: OutcomeKind,
    status: int,
    error_code: str | None,
    switch: bool,
    resets_at: datetime | None,
    rate_limit_type: str | None,
) -> None:
    """Every captured Claude Code scenario classifies as the §7 table says."""
    stream, facts = load_fixture(scenario)
    outcome = classify(stream, facts)
    assert outcome.kind is kind
    assert outcome.status == status
    assert outcome.error_code == error_code
    assert outcome.switch_credential is switch
    assert outcome.resets_at == resets_at
    assert outcome.rate_limit_type == rate_limit_type
    assert not strays(outcome)


def test_every_fixture_scenario_is_covered() -> None:
    """The table above names every scenario in the fixtures folder."""
    scenarios = {path.stem for path in FIXTURES.glob("*.json")}
    covered = {
        "success_oauth", "success_api_key", "shadow_api_key_beats_oauth",
        "rate_limit_five_hour_oauth", "auth_oauth_401", "billing_credit_low_api_key",
        "model_not_found", "not_logged_in",
    }  # fmt: skip
    assert scenarios == covered


def test_rate_limit_message_is_the_cli_text() -> None:
    """A rate limit shows the CLI's own words and the structured reset."""
    stream, facts = load_fixture("rate_limit_five_hour_oauth")
    outcome = classify(stream, facts)
    assert outcome.message == "You've hit your 5-hour limit · resets 6:47am (UTC)"
    assert retry_after_seconds(outcome, CAPTURED) == 3600


def test_rate_limit_without_resets_at_falls_back_to_the_text() -> None:
    """Without `resetsAt`, the reset is read from `resets 8:51am (UTC)`."""
    stream = parse_lines(
        [
            api_error_assistant(
                "You've hit your 5-hour limit · resets 8:51am (UTC)", error="rate_limit"
            ),
            result_line(is_error=True, api_error_status=429,
                        result="You've hit your 5-hour limit · resets 8:51am (UTC)"),
        ]
    )  # fmt: skip
    outcome = classify(stream, ProcessFacts(exit_code=1))
    assert outcome.kind is OutcomeKind.RATE_LIMIT
    assert outcome.resets_at == datetime(2026, 12, 2, 8, 51, tzinfo=UTC)
    assert outcome.rate_limit_type is None


def test_a_rate_limit_with_no_known_reset_stays_null() -> None:
    """No reset in structure or text: resets_at and Retry-After stay null."""
    stream = parse_lines([result_line(is_error=True, api_error_status=429, result="Slow down")])
    outcome = classify(stream, ProcessFacts(exit_code=1))
    assert outcome.kind is OutcomeKind.RATE_LIMIT
    assert outcome.resets_at is None
    assert retry_after_seconds(outcome, CAPTURED) is None


# --- prose is never evidence ---------------------------------------------------------

SCARY_PROSE = (
    "The server returned 401 Unauthorized, then a rate limit hit; the OAuth token "
    "resets 3pm. Credit balance is too low. 529 overloaded. Killed."
)


@pytest.mark.parametrize(
    "lines",
    [
        pytest.param(
            [prose(SCARY_PROSE), result_line(result="done")],
            id="the model's prose mentions every marker",
        ),
        pytest.param(
            [prose("ok"), result_line(result=SCARY_PROSE)],
            id="the successful result text mentions every marker",
        ),
        pytest.param(
            [
                json.dumps({"type": "user", "message": {"content": [
                    {"type": "tool_result", "content": SCARY_PROSE}]}}),
                result_line(),
            ],
            id="a tool's output mentions every marker",
        ),
        pytest.param(
            [json.dumps({"type": "rate_limit_event",
                         "rate_limit_info": {"status": "allowed_warning"}}), result_line()],
            id="an allowed rate-limit warning is no rejection",
        ),
    ],
)  # fmt: skip
def test_successful_turn_mentioning_markers_stays_success(lines: list[str]) -> None:
    """A success is a success whatever the model or a tool wrote."""
    stream = parse_lines(lines)
    outcome = classify(stream, ProcessFacts(exit_code=0, stderr="warning: 401 in a log line"))
    assert outcome.kind is OutcomeKind.SUCCESS
    assert outcome.status == 200
    assert stream.error_texts == []


def test_successful_result_wins_over_a_rejected_overage_event() -> None:
    """A turn served on overage after a rejected window is still a success."""
    stream = parse_lines(
        [
            json.dumps({"type": "rate_limit_event", "rate_limit_info": {
                "status": "rejected", "isUsingOverage": True}}),
            result_line(),
        ]
    )  # fmt: skip
    assert classify(stream, ProcessFacts(exit_code=0)).kind is OutcomeKind.SUCCESS


# --- rows 1 to 4 ---------------------------------------------------------------------

ROOT_REFUSAL = (
    "--dangerously-skip-permissions cannot be used with root/sudo privileges for security reasons\n"
)


def test_spawn_failure_is_the_literal_container_fault() -> None:
    """A missing runtime answers the exact message the controller knows."""
    outcome = classify(TurnStream(), ProcessFacts(exit_code=None, spawn_failed=True))
    assert outcome.kind is OutcomeKind.CONTAINER_FAULT
    assert outcome.status == 503
    assert outcome.message == "Claude Code is not available in this container"
    assert outcome.switch_credential is False


def test_root_refusal_is_a_permission_bypass_container_fault() -> None:
    """The CLI refusing bypass as root is a container fault, not auth."""
    outcome = classify(TurnStream(), ProcessFacts(exit_code=1, stderr=ROOT_REFUSAL))
    assert outcome.kind is OutcomeKind.CONTAINER_FAULT
    assert outcome.error_code == "container_fault"
    assert outcome.message.startswith("Permission bypass failed")
    assert outcome.switch_credential is False


def test_init_reporting_another_permission_mode_is_a_container_fault() -> None:
    """A turn that ran in `default` mode when bypass was asked is a container fault."""
    stream, facts = load_fixture("success_oauth")  # its init says permissionMode=default
    outcome = classify(stream, facts, expected_permission_mode="bypassPermissions")
    assert outcome.kind is OutcomeKind.CONTAINER_FAULT
    assert outcome.message.startswith("Permission bypass failed")


def test_matching_permission_mode_is_no_fault() -> None:
    """The mode the init event reports is the one asked for: the turn's own outcome."""
    stream, facts = load_fixture("success_oauth")
    assert classify(stream, facts, expected_permission_mode="default").kind is (OutcomeKind.SUCCESS)


def test_no_reported_permission_mode_is_no_fault() -> None:
    """A runtime whose stream reports no mode is never judged on it."""
    stream = parse_lines([result_line()])
    outcome = classify(stream, ProcessFacts(exit_code=0), expected_permission_mode="bypass")
    assert outcome.kind is OutcomeKind.SUCCESS


def test_terminated_turn_is_cancelled() -> None:
    """A turn ended through the terminate route answers 200 cancelled."""
    outcome = classify(TurnStream(), ProcessFacts(exit_code=-15, terminated=True))
    assert (outcome.kind, outcome.status, outcome.error_code) == (OutcomeKind.CANCELLED, 200, None)


def test_deadline_is_a_timeout_not_a_kill() -> None:
    """Our own deadline firing is a timeout even though the exit is a signal."""
    outcome = classify(TurnStream(), ProcessFacts(exit_code=-9, timed_out=True))
    assert (outcome.kind, outcome.status, outcome.error_code) == (
        OutcomeKind.TIMEOUT,
        504,
        "timeout",
    )


@pytest.mark.parametrize(
    "facts",
    [
        pytest.param(ProcessFacts(exit_code=-9), id="SIGKILL"),
        pytest.param(ProcessFacts(exit_code=-15), id="SIGTERM"),
        pytest.param(ProcessFacts(exit_code=137), id="exit 137 from a shell wrapper"),
        pytest.param(ProcessFacts(exit_code=143), id="exit 143"),
        pytest.param(ProcessFacts(exit_code=130), id="exit 130 after an interrupt"),
        pytest.param(ProcessFacts(exit_code=1, stderr="Killed\n"), id="the kernel's OOM Killed"),
        pytest.param(
            ProcessFacts(exit_code=134, stderr="FATAL ERROR: JavaScript heap out of memory"),
            id="node running out of heap",
        ),
        pytest.param(
            ProcessFacts(exit_code=-9, stderr="401 Unauthorized OAuth token"),
            id="a kill whose stderr mentions auth stays a kill",
        ),
    ],
)
def test_kills_and_oom_are_killed_never_auth(facts: ProcessFacts) -> None:
    """Signals and OOM with no result event are `killed`, never a credential problem."""
    outcome = classify(TurnStream(), facts)
    assert outcome.kind is OutcomeKind.KILLED
    assert outcome.status == 504
    assert outcome.switch_credential is False
    assert not strays(outcome)


def test_a_result_event_outranks_a_signal_exit() -> None:
    """A rate-limit result is still a rate limit if the group was killed afterwards."""
    stream, _ = load_fixture("rate_limit_five_hour_oauth")
    assert classify(stream, ProcessFacts(exit_code=-15)).kind is OutcomeKind.RATE_LIMIT


# --- rows 5 to 11 --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("lines", "stderr", "kind"),
    [
        pytest.param(
            [api_error_assistant("too old", error="claude_code_version_too_old"),
             result_line(is_error=True, result="too old")],
            "", OutcomeKind.MODEL_UNSUPPORTED,
            id="a CLI too old for the model id is a model rejection",
        ),
        pytest.param(
            [result_line(is_error=True, api_error_status=404, api_error_type="not_found_error",
                         result="model: nope")],
            "", OutcomeKind.MODEL_UNSUPPORTED,
            id="a 404 not_found_error is a model rejection",
        ),
        pytest.param(
            [result_line(is_error=True, result="boom", total_cost_usd=0,
                         usage={"input_tokens": 0, "output_tokens": 0})],
            '[claude-code:unrecognized_model] {"model":"x"}', OutcomeKind.MODEL_UNSUPPORTED,
            id="an unrecognized model with zero usage is a model rejection",
        ),
        pytest.param(
            [result_line(is_error=True, result="boom")],
            '[claude-code:unrecognized_model] {"model":"glm-5"}', OutcomeKind.EXECUTION_ERROR,
            id="an unrecognized model that used tokens was served by a gateway",
        ),
        pytest.param(
            [result_line(is_error=True, api_error_status=429, result="busy", total_cost_usd=0,
                         usage={"input_tokens": 0, "output_tokens": 0})],
            '[claude-code:unrecognized_model] {"model":"glm-4.6"}', OutcomeKind.RATE_LIMIT,
            id="a gateway's 429 to a model the CLI does not know is the gateway's rate limit",
        ),
        pytest.param(
            [result_line(is_error=True, api_error_status=401, result="no", total_cost_usd=0,
                         usage={"input_tokens": 0, "output_tokens": 0})],
            '[claude-code:unrecognized_model] {"model":"glm-4.6"}', OutcomeKind.AUTH,
            id="a gateway's 401 to a model the CLI does not know is the gateway's auth",
        ),
        pytest.param(
            [result_line(is_error=True, api_error_status=402, result="no", total_cost_usd=0,
                         usage={"input_tokens": 0, "output_tokens": 0})],
            '[claude-code:unrecognized_model] {"model":"glm-4.6"}', OutcomeKind.BILLING,
            id="a gateway's 402 to a model the CLI does not know is the gateway's billing",
        ),
        pytest.param(
            [result_line(is_error=True, api_error_status=503, result="no", total_cost_usd=0,
                         usage={"input_tokens": 0, "output_tokens": 0})],
            '[claude-code:unrecognized_model] {"model":"glm-4.6"}',
            OutcomeKind.UPSTREAM_UNAVAILABLE,
            id="a gateway's 503 to a model the CLI does not know is the gateway's outage",
        ),
        pytest.param(
            [api_error_assistant("limit", error="rate_limit"), result_line(is_error=True)],
            "", OutcomeKind.RATE_LIMIT,
            id="assistant error rate_limit is a rate limit",
        ),
        pytest.param(
            [result_line(is_error=True, api_error="usage_limit_reached", result="x")],
            "", OutcomeKind.RATE_LIMIT,
            id="api_error usage_limit_reached is a rate limit",
        ),
        pytest.param(
            [result_line(is_error=True, api_error_type="rate_limit_error", result="x")],
            "", OutcomeKind.RATE_LIMIT,
            id="api_error_type rate_limit_error is a rate limit",
        ),
        pytest.param(
            [result_line(is_error=True, api_error_status=402, result="pay")],
            "", OutcomeKind.BILLING,
            id="a 402 is billing",
        ),
        pytest.param(
            [result_line(is_error=True, result="Your credit balance is too low to access")],
            "", OutcomeKind.BILLING,
            id="credit-balance text on an error result is billing",
        ),
        pytest.param(
            [api_error_assistant("org", error="oauth_org_not_allowed"), result_line(is_error=True)],
            "", OutcomeKind.AUTH,
            id="an organisation that may not use the token is auth",
        ),
        pytest.param(
            [result_line(is_error=True, api_error_status=403, result="nope")],
            "", OutcomeKind.AUTH,
            id="a 403 is auth",
        ),
        pytest.param(
            [result_line(is_error=True, api_error_status=529, api_error_type="overloaded_error",
                         result="API Error: 529 Overloaded")],
            "", OutcomeKind.UPSTREAM_UNAVAILABLE,
            id="a 529 overloaded result is upstream",
        ),
        pytest.param(
            [api_error_assistant("API Error: 500", error="server_error"),
             result_line(is_error=True)],
            "", OutcomeKind.UPSTREAM_UNAVAILABLE,
            id="assistant server_error is upstream",
        ),
        pytest.param(
            [result_line(is_error=True, result="API Error: Connection error. (ECONNREFUSED)")],
            "", OutcomeKind.UPSTREAM_UNAVAILABLE,
            id="a connection error is upstream",
        ),
        pytest.param(
            [result_line(is_error=True, subtype="error_max_turns", result="")],
            "", OutcomeKind.MAX_TURNS,
            id="error_max_turns is max turns",
        ),
        pytest.param(
            [result_line(is_error=True, terminal_reason="max_turns", result="stopped")],
            "", OutcomeKind.MAX_TURNS,
            id="terminal_reason max_turns is max turns",
        ),
        pytest.param(
            [result_line(is_error=True, subtype="error_during_execution", result="boom")],
            "", OutcomeKind.EXECUTION_ERROR,
            id="an unexplained error result is an execution error",
        ),
        pytest.param(
            [result_line(is_error=True, result="Context limit reached · /compact or /clear")],
            "", OutcomeKind.EXECUTION_ERROR,
            id="a full context is no rate limit",
        ),
        pytest.param(
            [], "Error: the session was killed by the user", OutcomeKind.EXECUTION_ERROR,
            id="a lower-case killed in prose is no OOM kill",
        ),
        pytest.param(
            [], "Error: something odd", OutcomeKind.EXECUTION_ERROR,
            id="exit 1 with no stream at all is an execution error",
        ),
        pytest.param(
            [], "Invalid API key · Please run /login", OutcomeKind.AUTH,
            id="auth text on stderr with no stream is auth",
        ),
        pytest.param(
            [result_line(is_error=True, api_error_status=429, api_error_type="authentication_error",
                         result="x")],
            "", OutcomeKind.RATE_LIMIT,
            id="rate limit outranks auth when both are claimed",
        ),
    ],
)  # fmt: skip
def test_table_rows(lines: list[str], stderr: str, kind: OutcomeKind) -> None:
    """Each row's structured and error-channel evidence maps to that row."""
    outcome = classify(parse_lines(lines), ProcessFacts(exit_code=1, stderr=stderr))
    assert outcome.kind is kind
    assert not strays(outcome)


def test_a_retried_529_that_then_served_is_a_success() -> None:
    """An api_retry counts only when the result is an error."""
    stream = parse_lines([retry(529, "overloaded_error"), prose("hi"), result_line()])
    outcome = classify(stream, ProcessFacts(exit_code=0))
    assert outcome.kind is OutcomeKind.SUCCESS


def test_a_retried_529_that_then_failed_is_upstream_and_retryable() -> None:
    """Retries of 529 ending in an error result: upstream, retry the same turn later."""
    stream = parse_lines(
        [
            retry(529, "overloaded_error"),
            retry(529, "overloaded_error"),
            result_line(is_error=True, api_error_status=529, result="API Error: Repeated 529"),
        ]
    )
    outcome = classify(stream, ProcessFacts(exit_code=1))
    assert outcome.kind is OutcomeKind.UPSTREAM_UNAVAILABLE
    assert (outcome.status, outcome.retryable, outcome.switch_credential) == (502, True, False)
    assert outcome.api_error_status == 529


def test_a_bare_error_result_after_529_retries_is_upstream() -> None:
    """An error result with no facts of its own takes the last retry's reason."""
    stream = parse_lines([retry(529, "overloaded_error"), result_line(is_error=True, result="x")])
    outcome = classify(stream, ProcessFacts(exit_code=1))
    assert outcome.kind is OutcomeKind.UPSTREAM_UNAVAILABLE
    assert outcome.api_error_status == 529


@pytest.mark.parametrize(
    ("hints", "exit_code", "kind"),
    [
        pytest.param(
            GeminiAdapter.hints,
            41,
            OutcomeKind.CONTAINER_FAULT,
            id="Gemini's 41 without a missing key's text is its configuration, never auth",
        ),
        pytest.param(
            GeminiAdapter.hints, 55, OutcomeKind.CONTAINER_FAULT, id="Gemini's 55 is no trust"
        ),
        pytest.param(GeminiAdapter.hints, 53, OutcomeKind.MAX_TURNS, id="Gemini's 53 is turns"),
        pytest.param(GeminiAdapter.hints, 173, OutcomeKind.RATE_LIMIT, id="Gemini's 173 is a 429"),
        pytest.param(
            GeminiAdapter.hints, 247, OutcomeKind.UPSTREAM_UNAVAILABLE, id="Gemini's 247 is a 503"
        ),
        pytest.param(
            CodexAdapter.hints, 173, OutcomeKind.EXECUTION_ERROR, id="Codex's 173 is nothing"
        ),
        pytest.param(
            GeminiAdapter.hints, 42, OutcomeKind.EXECUTION_ERROR, id="Gemini's 42 is bad input"
        ),
        pytest.param(
            ClaudeCodeAdapter.hints, 41, OutcomeKind.EXECUTION_ERROR, id="Claude's 41 is nothing"
        ),
    ],
)
def test_named_exit_codes(hints: OutcomeHints, exit_code: int, kind: OutcomeKind) -> None:
    """A runtime's own exit codes classify when the stream says nothing; another's do not."""
    outcome = classify_outcome(
        TurnStream(),
        ProcessFacts(exit_code=exit_code),
        hints=hints,
        expected_permission_mode=None,
        now=CAPTURED,
    )
    assert outcome.kind is kind
    if kind is OutcomeKind.CONTAINER_FAULT:  # the marker the controller never switches on
        assert outcome.message.startswith("Permission bypass failed: ")


def test_a_non_auth_message_is_scrubbed_of_auth_words() -> None:
    """An upstream text quoting 401/OAuth loses those words; the controller scans text."""
    text = "API Error: 529 overloaded (OAuth token 401/403 Forbidden, Unauthorized credentials)"
    stream = parse_lines([result_line(is_error=True, api_error_status=529, result=text)])
    outcome = classify(stream, ProcessFacts(exit_code=1))
    assert outcome.kind is OutcomeKind.UPSTREAM_UNAVAILABLE
    assert not strays(outcome)
    assert "529" in outcome.message


def test_auth_words_glued_into_numbers_are_scrubbed() -> None:
    """A substring scan would find `401` inside `14013`: it is scrubbed too."""
    stream = parse_lines([result_line(is_error=True, result="request 440113 failed")])
    outcome = classify(stream, ProcessFacts(exit_code=1))
    assert outcome.kind is OutcomeKind.EXECUTION_ERROR
    assert not strays(outcome)


def test_an_auth_message_keeps_its_words() -> None:
    """The auth row shows the CLI's text as is."""
    stream, facts = load_fixture("auth_oauth_401")
    outcome = classify(stream, facts)
    assert outcome.message == "Failed to authenticate. API Error: 401 Invalid bearer token"


def test_a_model_rejection_says_so_first_then_the_cli_sentence() -> None:
    """Row 5's message is `Model unsupported: ` and the CLI's own sentence after it."""
    stream, facts = load_fixture("model_not_found")
    outcome = classify(stream, facts)
    assert outcome.message.startswith("Model unsupported: ")
    sentence = outcome.message.removeprefix("Model unsupported: ")
    assert sentence in " ".join(" ".join(stream.error_texts).split())
    assert trinity.is_model_rejection(outcome.message)
    assert trinity.switch_reason(outcome.status, outcome.message) is None


@pytest.mark.parametrize(
    ("lines", "expected"),
    [
        pytest.param(
            [result_line(is_error=True, api_error_status=402, result="Payment required")],
            "Payment required",
            id="the CLI's own sentence is kept",
        ),
        pytest.param(
            [result_line(is_error=True, api_error_status=402, result="")],
            "The account's credit balance is too low",
            id="with no sentence, the fallback names the credit balance",
        ),
    ],
)
def test_a_billing_message(lines: list[str], expected: str) -> None:
    """Billing keeps the CLI's sentence; the fallback carries "credit balance"."""
    outcome = classify(parse_lines(lines), ProcessFacts(exit_code=1))
    assert outcome.kind is OutcomeKind.BILLING
    assert outcome.message == expected


@pytest.mark.parametrize(
    "text",
    [
        "limit reached; the model does not support this model id",
        "limit reached [claude-code:unrecognized_model]",
        "limit reached: Model unsupported: x",
    ],
)
def test_a_rate_limit_quoting_a_rejection_marker_still_switches(text: str) -> None:
    """The controller believes a rejection marker over any status: other rows lose it."""
    stream = parse_lines([result_line(is_error=True, api_error_status=429, result=text)])
    outcome = classify(stream, ProcessFacts(exit_code=1))
    assert outcome.kind is OutcomeKind.RATE_LIMIT
    assert not trinity.is_model_rejection(outcome.message), outcome.message
    assert trinity.switch_reason(outcome.status, outcome.message) == "rate_limit"


def test_messages_are_one_short_line() -> None:
    """A huge multi-line stderr becomes one bounded line."""
    outcome = classify(TurnStream(), ProcessFacts(exit_code=1, stderr="boom\n" * 10_000))
    assert "\n" not in outcome.message
    assert len(outcome.message) <= 500


# --- exhaustive: every kind, the error body, the controller's view -------------------


def outcome_of(kind: OutcomeKind) -> Outcome:
    """One representative outcome per kind, built through the classifier itself.

    The error rows quote auth words in the CLI's text, so the scrub is exercised.
    """
    results_by_kind: dict[OutcomeKind, dict[str, Any]] = {
        OutcomeKind.MODEL_UNSUPPORTED: {
            "api_error_status": 404, "api_error_type": "not_found_error",
            "result": "model x: 401 Forbidden",
        },
        OutcomeKind.RATE_LIMIT: {"api_error_status": 429, "result": "limit; OAuth 401"},
        OutcomeKind.BILLING: {"api_error_status": 402, "result": "billing: credentials"},
        OutcomeKind.AUTH: {"api_error_status": 401, "result": "401 Unauthorized"},
        OutcomeKind.UPSTREAM_UNAVAILABLE: {
            "api_error_status": 529, "result": "overloaded, Forbidden 403 authentication",
        },
        OutcomeKind.MAX_TURNS: {"subtype": "error_max_turns", "result": "turns: unauthorized"},
        OutcomeKind.EXECUTION_ERROR: {"subtype": "error_during_execution", "result": "boom 14013"},
    }  # fmt: skip
    facts_by_kind = {
        OutcomeKind.SUCCESS: ProcessFacts(exit_code=0),
        OutcomeKind.CANCELLED: ProcessFacts(exit_code=-15, terminated=True),
        OutcomeKind.CONTAINER_FAULT: ProcessFacts(exit_code=None, spawn_failed=True),
        OutcomeKind.TIMEOUT: ProcessFacts(exit_code=-9, timed_out=True),
        OutcomeKind.KILLED: ProcessFacts(exit_code=-9),
    }
    if kind in results_by_kind:
        stream = parse_lines([result_line(is_error=True, **results_by_kind[kind])])
        outcome = classify(stream, ProcessFacts(exit_code=1))
    else:
        outcome = classify(TurnStream(), facts_by_kind[kind])
    assert outcome.kind is kind
    return outcome


ALL_KINDS = [pytest.param(kind, id=kind.value) for kind in OutcomeKind]
ERROR_KINDS = [pytest.param(kind, id=kind.value) for kind in OutcomeKind if kind != "success"]


@pytest.mark.parametrize("kind", ERROR_KINDS)
def test_every_error_kind_has_a_status_and_code(kind: OutcomeKind) -> None:
    """Every outcome but success has a status, and all but cancelled an error code."""
    outcome = outcome_of(kind)
    assert 200 <= outcome.status <= 599
    if kind is OutcomeKind.CANCELLED:
        assert outcome.error_code is None
    else:
        assert outcome.error_code == kind.value
        assert outcome.status >= 400
    assert outcome.message


@pytest.mark.parametrize("kind", ERROR_KINDS)
def test_a_message_holds_only_its_own_controller_words(kind: OutcomeKind) -> None:
    """Whatever the CLI printed, no message holds a word the controller reads as another
    outcome's (auth indicators, model-rejection markers)."""
    outcome = outcome_of(kind)
    assert not strays(outcome)
    assert trinity.is_model_rejection(outcome.message) is (kind is OutcomeKind.MODEL_UNSUPPORTED)
    assert trinity.is_auth_failure(outcome.message) is (kind is OutcomeKind.AUTH)


@pytest.mark.parametrize("kind", ALL_KINDS)
def test_retryable_and_switch_follow_the_table(kind: OutcomeKind) -> None:
    """Retry only upstream; switch exactly on rate limit, billing and auth."""
    outcome = outcome_of(kind)
    assert outcome.retryable is (kind is OutcomeKind.UPSTREAM_UNAVAILABLE)
    assert outcome.switch_credential is (
        kind in {OutcomeKind.RATE_LIMIT, OutcomeKind.BILLING, OutcomeKind.AUTH}
    )


@pytest.mark.parametrize("kind", ALL_KINDS)
def test_error_detail_has_every_spec_key(kind: OutcomeKind) -> None:
    """The error body carries exactly the §7 keys, JSON-serialisable."""
    detail = error_detail(
        outcome_of(kind),
        execution_id="exec-1",
        auth_route="oauth_token",
        metadata={"exit_code": 1},
        execution_log=[{"type": "result"}],
    )
    assert tuple(detail) == ERROR_DETAIL_KEYS
    assert set(detail) == {
        "message", "error_code", "retryable", "switch_credential", "execution_id",
        "auth_route", "api_error_status", "resets_at", "rate_limit_type", "metadata",
        "execution_log",
    }  # fmt: skip
    assert detail["execution_id"] == "exec-1"
    assert detail["auth_route"] == "oauth_token"
    json.dumps(detail)


def test_error_detail_of_a_rate_limit() -> None:
    """resets_at is ISO-8601 UTC with Z; the window and the API status travel along."""
    stream, facts = load_fixture("rate_limit_five_hour_oauth")
    detail = error_detail(
        classify(stream, facts),
        execution_id="e",
        auth_route="baseline",
        metadata=None,
        execution_log=None,
    )
    assert detail["resets_at"] == "2026-12-02T06:47:21Z"
    assert detail["rate_limit_type"] == "five_hour"
    assert detail["api_error_status"] == 429
    assert detail["error_code"] == "rate_limit"
    assert detail["switch_credential"] is True
    assert detail["metadata"] is None


def test_error_detail_rounds_a_fractional_reset_up() -> None:
    """A reset at 08:51:00.2 is reported as 08:51:01, never early."""
    reset = datetime(2026, 11, 30, 8, 51, 0, 200_000, tzinfo=UTC)
    outcome = dataclasses.replace(outcome_of(OutcomeKind.RATE_LIMIT), resets_at=reset)
    detail = error_detail(
        outcome, execution_id="e", auth_route="baseline", metadata=None, execution_log=None
    )
    assert detail["resets_at"] == "2026-11-30T08:51:01Z"


@pytest.mark.parametrize(
    ("delta", "expected"),
    [
        pytest.param(timedelta(seconds=3600), 3600, id="an hour ahead"),
        pytest.param(timedelta(seconds=0.2), 1, id="a fraction rounds up to one"),
        pytest.param(timedelta(seconds=90.5), 91, id="rounded up"),
        pytest.param(timedelta(seconds=-30), 1, id="a reset just passed is at least one"),
    ],
)
def test_retry_after_seconds(delta: timedelta, expected: int) -> None:
    """Retry-After is the ceiling of the seconds to the reset, at least 1."""
    outcome = dataclasses.replace(outcome_of(OutcomeKind.RATE_LIMIT), resets_at=CAPTURED + delta)
    assert retry_after_seconds(outcome, CAPTURED) == expected


@pytest.mark.parametrize(
    "outcome",
    [
        *[pytest.param(outcome_of(kind), id=kind.value) for kind in OutcomeKind],
        pytest.param(
            classify(TurnStream(), ProcessFacts(exit_code=1, stderr=ROOT_REFUSAL)),
            id="root refusal",
        ),
        *[
            pytest.param(classify(*load_fixture(name)), id=f"fixture {name}")
            for name in sorted(path.stem for path in FIXTURES.glob("*.json"))
        ],
    ],
)
def test_the_controller_switches_exactly_where_the_table_says(outcome: Outcome) -> None:
    """Played through the controller's status and text mapping, only yes-rows switch."""
    switches = trinity.switch_reason(outcome.status, outcome.message) is not None
    assert switches is outcome.switch_credential
    assert switches is (
        outcome.kind in {OutcomeKind.RATE_LIMIT, OutcomeKind.BILLING, OutcomeKind.AUTH}
    )
