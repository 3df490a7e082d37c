"""One turn's outcome: the table of contract §7, walked in order, first match wins.

`classify_outcome` is pure: it reads the normalised stream (`TurnStream`), how the
process ended (`ProcessFacts`) and what the runtime's errors look like
(`OutcomeHints`: its codes, markers, exit codes and reset wordings, each adapter's).
The evidence (`outcome.evidence`) is read in three passes, most trustworthy first:

1. structured stream fields (assistant `error`, `api_error` / `api_error_type`,
   result `is_error` / `api_error_status` / `terminal_reason`, `rate_limit_event`;
   an `api_retry` only when the result is an error and carries no fact of its own;
   the HTTP status a runtime's exit code carries, when the stream gives none);
2. the runtime's own error texts, then its exit status (signals, its exit codes);
3. text markers, read ONLY on error channels (`stream.error_texts`, stderr), never on
   the model's prose or tool output, which may mention "401" or "rate limit".

The controller switches credentials on 429 and on 503/401/403/402, and also scans
error text for auth words, so a message is shaped for it (`outcome.wording`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from agent_server.outcome.evidence import OOM_TEXT, SIGNAL_EXIT_CODES, Evidence
from agent_server.outcome.resets import parse_resets_at
from agent_server.outcome.wording import MODEL_REJECTION_PREFIX, shape_message, telling_text
from agent_server.process.runner import ProcessFacts
from agent_server.runtimes.base import OutcomeHints
from agent_server.runtimes.events import one_of
from agent_server.runtimes.rate_limit import RATE_LIMIT_WINDOWS
from agent_server.runtimes.stream import TurnStream
from agent_server.wire.instants import format_instant
from agent_server.wire.messages import UNAVAILABLE_MESSAGE, bypass_refused
from agent_server.wire.names import OutcomeKind


@dataclass(frozen=True)
class Row:
    """One row's answer: its status, error_code, and the controller's two flags."""

    status: int
    error_code: str | None
    retryable: bool = False
    switch_credential: bool = False


ROWS: dict[OutcomeKind, Row] = {
    OutcomeKind.SUCCESS: Row(200, None),
    OutcomeKind.CANCELLED: Row(200, None),
    OutcomeKind.CONTAINER_FAULT: Row(503, "container_fault"),
    OutcomeKind.TIMEOUT: Row(504, "timeout"),
    OutcomeKind.KILLED: Row(504, "killed"),
    OutcomeKind.MODEL_UNSUPPORTED: Row(400, "model_unsupported"),
    OutcomeKind.RATE_LIMIT: Row(429, "rate_limit", switch_credential=True),
    OutcomeKind.BILLING: Row(402, "billing", switch_credential=True),
    OutcomeKind.AUTH: Row(503, "auth", switch_credential=True),
    OutcomeKind.UPSTREAM_UNAVAILABLE: Row(502, "upstream_unavailable", retryable=True),
    OutcomeKind.MAX_TURNS: Row(422, "max_turns"),
    OutcomeKind.EXECUTION_ERROR: Row(500, "execution_error"),
}
"""The table's status, error_code and last two columns, one row per kind."""
STATUS_BY_ERROR_CODE: dict[str, int] = {
    row.error_code: row.status for row in ROWS.values() if row.error_code is not None
}
"""Every error_code a turn's error body can carry, with the status it answers."""
ERROR_CODES: tuple[str, ...] = tuple(STATUS_BY_ERROR_CODE)
ERROR_STATUSES: frozenset[int] = frozenset(STATUS_BY_ERROR_CODE.values())


@dataclass(frozen=True)
class Outcome:
    """A classified turn: the HTTP status and every fact of the §7 error body."""

    kind: OutcomeKind
    status: int
    error_code: str | None
    retryable: bool
    switch_credential: bool
    api_error_status: int | None
    resets_at: datetime | None
    rate_limit_type: str | None
    message: str


def permission_bypass_message(detail: str) -> str:
    """Row 1's message for a refused permission mode: starts `Permission bypass failed`."""
    return bypass_refused(detail)


def cancelled() -> Outcome:
    """A turn stopped through the terminate route (row 2): 200 cancelled."""
    return _outcome(OutcomeKind.CANCELLED, "The turn was cancelled")


def shutdown_killed() -> Outcome:
    """A turn still running when the shutdown grace ran out (row 4): 504 killed."""
    return _outcome(
        OutcomeKind.KILLED, "The server shut down and stopped this turn after its shutdown grace"
    )


def classify_outcome(
    stream: TurnStream,
    facts: ProcessFacts,
    *,
    hints: OutcomeHints,
    expected_permission_mode: str | None,
    now: datetime,
) -> Outcome:
    """Classify one finished turn by the table of contract §7 (first match wins). Pure."""
    error_texts = [*stream.error_texts, facts.stderr] if facts.stderr else [*stream.error_texts]
    label = hints.label

    # Row 1: container fault.
    if facts.spawn_failed:
        return _outcome(OutcomeKind.CONTAINER_FAULT, UNAVAILABLE_MESSAGE)
    if not stream.has_result:
        for marker, meaning in hints.permission_refusals.items():
            if marker in facts.stderr:
                return _outcome(OutcomeKind.CONTAINER_FAULT, permission_bypass_message(meaning))
    if (
        expected_permission_mode is not None
        and stream.permission_mode is not None
        and stream.permission_mode != expected_permission_mode
    ):
        return _outcome(
            OutcomeKind.CONTAINER_FAULT,
            permission_bypass_message(
                f"{label} runs in permission mode {stream.permission_mode!r}, "
                f"not {expected_permission_mode!r}"
            ),
        )
    # Rows 2 and 3: our own decisions, whatever the stream said.
    if facts.terminated:
        return cancelled()
    if facts.timed_out:
        return _outcome(OutcomeKind.TIMEOUT, "The turn ran past its timeout and was stopped")

    # Success: a result that is not an error (or a clean exit with no error reported).
    if not stream.is_error and (stream.has_result or facts.exit_code == 0):
        return _outcome(OutcomeKind.SUCCESS, "")

    # Row 4: killed. A result event already says what happened, so it wins.
    if not stream.has_result and (
        _is_signal_exit(facts.exit_code) or OOM_TEXT.search(facts.stderr) is not None
    ):
        return _outcome(
            OutcomeKind.KILLED,
            f"{label} was killed ({_exit_phrase(facts.exit_code)}), possibly out of memory",
        )

    exit_status = hints.exit_statuses.get(facts.exit_code) if facts.exit_code is not None else None
    evidence = Evidence.of_stream(stream, exit_status)
    kind = (
        _by_structure(stream, facts, evidence, hints)
        or _by_markers(error_texts, hints.error_markers)
        or _by_exit_status(facts.exit_code, hints)
        or _by_text(error_texts, hints)
        or OutcomeKind.EXECUTION_ERROR
    )
    return _build(kind, stream, facts, evidence, error_texts, hints, now)


def _by_structure(
    stream: TurnStream, facts: ProcessFacts, evidence: Evidence, hints: OutcomeHints
) -> OutcomeKind | None:
    """Rows 5-10 on the structured stream fields (and the CLI's model-rejection marker)."""
    codes, status = evidence.codes, evidence.status
    named = {hints.error_codes[code] for code in codes if code in hints.error_codes}
    if OutcomeKind.MODEL_UNSUPPORTED in named or (status == 404 and codes & hints.not_found_codes):
        return OutcomeKind.MODEL_UNSUPPORTED
    rejected = stream.rate_limit_info is not None and (
        stream.rate_limit_info.get("status") == "rejected"
    )
    if rejected or OutcomeKind.RATE_LIMIT in named or status == 429:
        return OutcomeKind.RATE_LIMIT
    if OutcomeKind.BILLING in named or status == 402:
        return OutcomeKind.BILLING
    if OutcomeKind.AUTH in named or status in (401, 403):
        return OutcomeKind.AUTH
    if OutcomeKind.UPSTREAM_UNAVAILABLE in named or (status is not None and 500 <= status <= 599):
        return OutcomeKind.UPSTREAM_UNAVAILABLE
    # The CLI marks any failure of a model it does not know (a gateway's `glm-4.6` too):
    # weaker evidence than what the API said, so it is read only when the API said nothing.
    zero_usage = not stream.input_tokens and not stream.output_tokens and not stream.cost_usd
    if zero_usage and any(m in facts.stderr for m in hints.model_rejection_markers):
        return OutcomeKind.MODEL_UNSUPPORTED
    reasons = hints.max_turn_reasons
    if stream.terminal_reason in reasons or stream.subtype in reasons:
        return OutcomeKind.MAX_TURNS
    return None


def _by_exit_status(exit_code: int | None, hints: OutcomeHints) -> OutcomeKind | None:
    """Exit codes that name a cause, the runtime's own (most CLIs exit 1 on any error)."""
    return hints.exit_codes.get(exit_code) if exit_code is not None else None


def _by_markers(
    error_texts: Sequence[str], markers: Sequence[tuple[str, OutcomeKind]]
) -> OutcomeKind | None:
    """Rows 5-10 on the runtime's own error texts (lower case), in its table's order."""
    lowered = [text.lower() for text in error_texts]
    for marker, kind in markers:
        if any(marker in text for text in lowered):
            return kind
    return None


def _by_text(error_texts: Sequence[str], hints: OutcomeHints) -> OutcomeKind | None:
    """Rows 5-10 on the runtime's text markers, of error channels only."""
    for pattern, kind in hints.text_markers:
        if any(pattern.search(text) for text in error_texts):
            return kind
    return None


def _build(
    kind: OutcomeKind,
    stream: TurnStream,
    facts: ProcessFacts,
    evidence: Evidence,
    error_texts: Sequence[str],
    hints: OutcomeHints,
    now: datetime,
) -> Outcome:
    """The outcome of an error row, with its message and rate-limit facts."""
    label = hints.label
    cli_text = telling_text(error_texts, kind, hints)
    resets_at: datetime | None = None
    rate_limit_type: str | None = None
    if kind is OutcomeKind.RATE_LIMIT:
        resets_at = parse_resets_at(stream.rate_limit_info, error_texts, now, hints.reset_parsers)
        window = (stream.rate_limit_info or {}).get("rateLimitType")
        rate_limit_type = one_of(window, RATE_LIMIT_WINDOWS)
    fallback = fallback_message(kind, label, facts.exit_code)
    message = cli_text or fallback
    if kind is OutcomeKind.CONTAINER_FAULT:  # the CLI refused its configuration (its exit code)
        message = permission_bypass_message(f"{label} refuses to run here: {message}")
    if kind is OutcomeKind.RATE_LIMIT and resets_at is not None and cli_text is None:
        message = f"{fallback}; resets {format_instant(resets_at)}"
    if kind is OutcomeKind.MODEL_UNSUPPORTED:
        message = MODEL_REJECTION_PREFIX + message
    return _outcome(
        kind,
        message,
        api_error_status=evidence.status,
        resets_at=resets_at,
        rate_limit_type=rate_limit_type,
    )


def fallback_message(kind: OutcomeKind, label: str, exit_code: int | None) -> str:
    """Our sentence for an error row when the CLI gave none of its own."""
    return {
        OutcomeKind.MODEL_UNSUPPORTED: f"The model is not available to {label}",
        OutcomeKind.RATE_LIMIT: f"{label} hit a usage limit",
        OutcomeKind.BILLING: "The account's credit balance is too low",
        OutcomeKind.AUTH: f"{label} could not authenticate",
        OutcomeKind.UPSTREAM_UNAVAILABLE: "The model API is unavailable; retry later",
        OutcomeKind.MAX_TURNS: f"{label} stopped at the maximum number of turns",
    }.get(kind, f"{label} failed ({_exit_phrase(exit_code)})")


def outcome_of(
    kind: OutcomeKind,
    message: str,
    *,
    api_error_status: int | None = None,
    resets_at: datetime | None = None,
    rate_limit_type: str | None = None,
) -> Outcome:
    """The outcome of `kind`: its row's status and flags, its message shaped for it."""
    if kind is OutcomeKind.MODEL_UNSUPPORTED and not message.startswith(MODEL_REJECTION_PREFIX):
        message = MODEL_REJECTION_PREFIX + message
    return _outcome(
        kind,
        message,
        api_error_status=api_error_status,
        resets_at=resets_at,
        rate_limit_type=rate_limit_type,
    )


def _outcome(
    kind: OutcomeKind,
    message: str,
    *,
    api_error_status: int | None = None,
    resets_at: datetime | None = None,
    rate_limit_type: str | None = None,
) -> Outcome:
    row = ROWS[kind]
    return Outcome(
        kind=kind,
        status=row.status,
        error_code=row.error_code,
        retryable=row.retryable,
        switch_credential=row.switch_credential,
        api_error_status=api_error_status,
        resets_at=resets_at,
        rate_limit_type=rate_limit_type,
        message=shape_message(message, kind),
    )


def _is_signal_exit(exit_code: int | None) -> bool:
    return exit_code is not None and (exit_code < 0 or exit_code in SIGNAL_EXIT_CODES)


def _exit_phrase(exit_code: int | None) -> str:
    if exit_code is None:
        return "no exit status"
    if exit_code < 0:
        return f"signal {-exit_code}"
    return f"exit status {exit_code}"
