"""The contract §7 table over every real transcript this repo captured (CLI 2.1.328).

Reset instants differ between captures, so the expected `resets_at` is read from
the transcript's own `rate_limit_event`, and "now" is the transcript's own clock.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from agent_server.execution.answer import error_detail
from agent_server.outcome.classify import Outcome, classify_outcome
from agent_server.process.runner import ProcessFacts
from agent_server.runtimes.claude_code import ClaudeCodeAdapter, ClaudeStreamParser
from agent_server.runtimes.stream import TurnStream
from agent_server.wire.names import OutcomeKind
from tests.support.contract import ERROR_DETAIL_KEYS, stray_controller_words

CAPTURED = Path(__file__).resolve().parents[2] / "fixtures" / "claude-code-2.1.328-captured"
LABEL = "Claude Code"
# Every capture ran within minutes of this instant; its resets lie an hour later.
CAPTURE_DAY = datetime(2026, 11, 30, 8, 0, tzinfo=UTC)


@dataclass(frozen=True)
class Capture:
    """One captured scenario: its events, stderr and exit code."""

    name: str
    events: list[dict[str, Any]]
    stderr: str
    exit_code: int

    @classmethod
    def load(cls, name: str) -> Capture:
        meta = json.loads((CAPTURED / f"{name}.json").read_text())
        lines = (CAPTURED / f"{name}.stdout.jsonl").read_text().splitlines()
        return cls(
            name=name,
            events=[json.loads(line) for line in lines if line.strip()],
            stderr=(CAPTURED / f"{name}.stderr.txt").read_text(),
            exit_code=int(meta["exit_code"]),
        )

    def parsed(self) -> tuple[TurnStream, ProcessFacts]:
        """The stream and process facts as the runner hands them to the classifier."""
        parser = ClaudeStreamParser()
        for line in (CAPTURED / f"{self.name}.stdout.jsonl").read_bytes().splitlines():
            parser.feed(line)
        return parser.stream, ProcessFacts(exit_code=self.exit_code, stderr=self.stderr)

    def clock(self) -> datetime:
        """When the CLI ran: the first event timestamp, else the capture day."""
        for event in self.events:
            stamp = event.get("timestamp")
            if isinstance(stamp, str):
                return datetime.fromisoformat(stamp.replace("Z", "+00:00"))
        return CAPTURE_DAY

    def rejected_reset(self) -> datetime | None:
        """The `resetsAt` of the transcript's rejected `rate_limit_event`, read raw."""
        for event in self.events:
            info = event.get("rate_limit_info") if event.get("type") == "rate_limit_event" else None
            if isinstance(info, dict) and info.get("status") == "rejected":
                return datetime.fromtimestamp(int(info["resetsAt"]), UTC)
        return None


def classify(capture: Capture, *, expected_permission_mode: str | None = None) -> Outcome:
    stream, facts = capture.parsed()
    return classify_outcome(
        stream,
        facts,
        hints=ClaudeCodeAdapter.hints,
        expected_permission_mode=expected_permission_mode,
        now=capture.clock(),
    )


@dataclass(frozen=True)
class Expected:
    kind: OutcomeKind
    status: int
    error_code: str | None
    switch: bool
    retryable: bool = False
    api_error_status: int | None = None
    rate_limit_type: str | None = None
    has_reset: bool = False


EXPECTED: dict[str, Expected] = {
    "rate_limit_seven_day_oauth": Expected(
        OutcomeKind.RATE_LIMIT, 429, "rate_limit", switch=True, api_error_status=429,
        rate_limit_type="seven_day", has_reset=True,
    ),
    "rate_limit_api_key": Expected(
        OutcomeKind.RATE_LIMIT, 429, "rate_limit", switch=True, api_error_status=429,
    ),
    "auth_api_key_401": Expected(
        OutcomeKind.AUTH, 503, "auth", switch=True, api_error_status=401,
    ),
    "not_logged_in": Expected(OutcomeKind.AUTH, 503, "auth", switch=True),
    "overloaded_529": Expected(
        OutcomeKind.UPSTREAM_UNAVAILABLE, 502, "upstream_unavailable", switch=False,
        retryable=True, api_error_status=529,
    ),
    "server_error_500": Expected(
        OutcomeKind.UPSTREAM_UNAVAILABLE, 502, "upstream_unavailable", switch=False,
        retryable=True, api_error_status=500,
    ),
    "unknown_session_resume": Expected(
        OutcomeKind.EXECUTION_ERROR, 500, "execution_error", switch=False,
    ),
    "success_auth_token_gateway": Expected(OutcomeKind.SUCCESS, 200, None, switch=False),
    "root_refusal_bypass": Expected(
        OutcomeKind.CONTAINER_FAULT, 503, "container_fault", switch=False,
    ),
}  # fmt: skip


def test_every_captured_scenario_has_a_row() -> None:
    """The table names exactly the scenarios in the captured folder."""
    assert set(EXPECTED) == {path.stem for path in CAPTURED.glob("*.json")}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_captured_transcript_classifies_by_the_table(name: str) -> None:
    """Each captured transcript gets its §7 row, reset and window; no fact is invented."""
    capture = Capture.load(name)
    expected = EXPECTED[name]
    outcome = classify(capture)
    assert outcome.kind is expected.kind
    assert outcome.status == expected.status
    assert outcome.error_code == expected.error_code
    assert outcome.switch_credential is expected.switch
    assert outcome.retryable is expected.retryable
    assert outcome.api_error_status == expected.api_error_status
    assert outcome.rate_limit_type == expected.rate_limit_type
    reset = capture.rejected_reset()
    assert (reset is not None) is expected.has_reset
    assert outcome.resets_at == reset
    assert not stray_controller_words(outcome.error_code, outcome.message)


def test_weekly_reset_is_the_structured_instant_an_hour_ahead() -> None:
    """The weekly wall resets at the event's resetsAt, in the future of the capture."""
    capture = Capture.load("rate_limit_seven_day_oauth")
    outcome = classify(capture)
    assert outcome.resets_at is not None
    assert 3000 < (outcome.resets_at - capture.clock()).total_seconds() <= 3700
    assert outcome.message.startswith("You've hit your weekly limit")


def test_api_key_429_has_no_reset_instant() -> None:
    """The per-key 429 carries no resetsAt and no reset text: resets_at stays None."""
    capture = Capture.load("rate_limit_api_key")
    stream, _ = capture.parsed()
    assert stream.rate_limit_info is None
    outcome = classify(capture)
    assert outcome.resets_at is None
    assert outcome.rate_limit_type is None
    detail = error_detail(
        outcome, execution_id="e1", auth_route="api_key", metadata=None, execution_log=None
    )
    assert detail["resets_at"] is None


def test_a_stale_weekly_reset_is_not_rolled_forward() -> None:
    """Read a day after the capture, the passed resetsAt gives None, not tomorrow 9:05."""
    capture = Capture.load("rate_limit_seven_day_oauth")
    stream, facts = capture.parsed()
    later = capture.clock() + timedelta(days=1)
    outcome = classify_outcome(
        stream, facts, hints=ClaudeCodeAdapter.hints, expected_permission_mode=None, now=later
    )
    assert outcome.kind is OutcomeKind.RATE_LIMIT
    assert outcome.resets_at is None


def test_root_refusal_message_is_the_permission_bypass_fault() -> None:
    """Empty stdout and the root refusal on stderr: `Permission bypass failed…`."""
    outcome = classify(Capture.load("root_refusal_bypass"))
    assert outcome.message.startswith("Permission bypass failed")
    assert outcome.switch_credential is False


@pytest.mark.parametrize("name", sorted(set(EXPECTED) - {"root_refusal_bypass"}))
def test_init_in_default_mode_under_bypass_is_a_container_fault(name: str) -> None:
    """Every capture ran in permissionMode default: a bypass server must call it a fault."""
    outcome = classify(Capture.load(name), expected_permission_mode="bypassPermissions")
    if name == "unknown_session_resume":  # no init event: nothing reports a mode
        assert outcome.kind is OutcomeKind.EXECUTION_ERROR
        return
    assert outcome.kind is OutcomeKind.CONTAINER_FAULT
    assert outcome.message.startswith("Permission bypass failed")


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_error_body_of_a_capture_has_every_spec_key(name: str) -> None:
    """The §7 body of each failed capture carries all keys, absent facts as null."""
    outcome = classify(Capture.load(name))
    if outcome.kind is OutcomeKind.SUCCESS:
        return
    detail = error_detail(
        outcome, execution_id="e1", auth_route="baseline", metadata=None, execution_log=[]
    )
    assert tuple(detail) == ERROR_DETAIL_KEYS
    assert detail["error_code"] == EXPECTED[name].error_code
    if EXPECTED[name].has_reset:
        assert isinstance(detail["resets_at"], str)
        assert detail["resets_at"].endswith("Z")
