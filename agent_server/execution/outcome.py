"""One turn's outcome: the contract §7 table, and the one place that builds its error body.

`classify_outcome` is pure: it reads the normalised stream (`TurnStream`) and how
the process ended (`ProcessFacts`) and walks the table rows in order, first match
wins. The evidence is read in three passes, most trustworthy first:

1. structured stream fields (assistant `error`, `api_error` / `api_error_type`,
   result `is_error` / `api_error_status` / `terminal_reason`, `rate_limit_event`;
   an `api_retry` only when the result is an error and carries no fact of its own);
2. the exit status (signals; Gemini CLI's documented exit codes);
3. text markers, read ONLY on error channels (`stream.error_texts`, stderr), never on
   the model's prose or tool output, which may mention "401" or "rate limit".

The controller switches credentials on 429 and on 503/401/403/402, and also scans
error text for auth words, so a non-auth message is scrubbed of them.
"""

from __future__ import annotations

import contextlib
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Any

from agent_server.execution.resets import parse_resets_at
from agent_server.execution.stream import ProcessFacts, TurnStream

__all__ = [
    "AUTH_WORDS",
    "ERROR_CODES",
    "ERROR_DETAIL_KEYS",
    "ERROR_STATUSES",
    "STATUS_BY_ERROR_CODE",
    "UNAVAILABLE_MESSAGE",
    "Outcome",
    "OutcomeKind",
    "classify_outcome",
    "error_detail",
    "permission_bypass_message",
    "retry_after_seconds",
]


class OutcomeKind(StrEnum):
    """The rows of the contract §7 table, plus success."""

    SUCCESS = "success"
    CANCELLED = "cancelled"
    CONTAINER_FAULT = "container_fault"
    TIMEOUT = "timeout"
    KILLED = "killed"
    MODEL_UNSUPPORTED = "model_unsupported"
    RATE_LIMIT = "rate_limit"
    BILLING = "billing"
    AUTH = "auth"
    UPSTREAM_UNAVAILABLE = "upstream_unavailable"
    MAX_TURNS = "max_turns"
    EXECUTION_ERROR = "execution_error"


@dataclass(frozen=True)
class _Row:
    status: int
    error_code: str | None
    retryable: bool = False
    switch_credential: bool = False


# The §7 table's status, error_code and last two columns, one row per kind.
_ROWS: dict[OutcomeKind, _Row] = {
    OutcomeKind.SUCCESS: _Row(200, None),
    OutcomeKind.CANCELLED: _Row(200, None),
    OutcomeKind.CONTAINER_FAULT: _Row(503, "container_fault"),
    OutcomeKind.TIMEOUT: _Row(504, "timeout"),
    OutcomeKind.KILLED: _Row(504, "killed"),
    OutcomeKind.MODEL_UNSUPPORTED: _Row(400, "model_unsupported"),
    OutcomeKind.RATE_LIMIT: _Row(429, "rate_limit", switch_credential=True),
    OutcomeKind.BILLING: _Row(402, "billing", switch_credential=True),
    OutcomeKind.AUTH: _Row(503, "auth", switch_credential=True),
    OutcomeKind.UPSTREAM_UNAVAILABLE: _Row(502, "upstream_unavailable", retryable=True),
    OutcomeKind.MAX_TURNS: _Row(422, "max_turns"),
    OutcomeKind.EXECUTION_ERROR: _Row(500, "execution_error"),
}


STATUS_BY_ERROR_CODE: dict[str, int] = {
    row.error_code: row.status for row in _ROWS.values() if row.error_code is not None
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


# --- evidence ------------------------------------------------------------------------

# Structured codes, from the assistant `error`, `api_error`, `api_error_type`, an
# api_retry's `error`, and Gemini's error-body `status`. Compared case-insensitively.
_MODEL_CODES = frozenset({"model_not_found", "claude_code_version_too_old"})
_NOT_FOUND_TYPES = frozenset({"not_found_error", "not_found"})
_RATE_LIMIT_CODES = frozenset(
    {"rate_limit", "rate_limit_error", "rate_limit_exceeded", "usage_limit_reached"}
    | {"resource_exhausted", "usage_limit_exceeded"}
)
_BILLING_CODES = frozenset({"billing_error", "insufficient_quota", "credit_balance_too_low"})
_AUTH_CODES = frozenset(
    {"authentication_failed", "authentication_error", "oauth_org_not_allowed"}
    | {"permission_error", "unauthenticated", "permission_denied", "invalid_api_key"}
)
_UPSTREAM_CODES = frozenset(
    {"server_error", "overloaded_error", "overloaded", "api_error", "internal_error"}
    | {"connection_error", "api_connection_error", "api_timeout", "timeout_error"}
    | {"unavailable", "internal", "deadline_exceeded", "service_unavailable"}
)
_MAX_TURN_REASONS = frozenset({"max_turns", "error_max_turns"})

_UNRECOGNIZED_MODEL = "[claude-code:unrecognized_model]"
_ROOT_REFUSAL = "cannot be used with root/sudo privileges"
_SIGNAL_EXIT_CODES = frozenset({130, 137, 143})

# Gemini CLI's exit codes (FatalAuthenticationError, FatalTurnLimitedError).
_EXIT_AUTH = 41
_EXIT_TURN_LIMIT = 53

# `Killed` is the shell's exact word for SIGKILL; a lower-case "killed" is just prose.
_OOM = re.compile(
    r"(?-i:\bKilled\b)|out of memory|\boom[- ]?kill|cannot allocate memory|bad_alloc",
    re.IGNORECASE,
)
# Text markers per row, read only on error channels, table order.
_MODEL_TEXT = re.compile(
    r"model_not_found|issue with the selected model|models/\S+ is not found", re.IGNORECASE
)
_RATE_LIMIT_TEXT = re.compile(
    # Not a bare "limit reached": `Context limit reached` is no credential's fault.
    r"rate[ _-]?limit|usage limit|hit your (?:[\w-]+ )?limit|limit reached\|\d"
    r"|resource_exhausted|exhausted your (?:capacity|quota)|too many requests|\b429\b",
    re.IGNORECASE,
)
_BILLING_TEXT = re.compile(
    r"credit balance|insufficient (?:credit|funds|balance)|insufficient_quota|billing"
    r"|payment required|\b402\b",
    re.IGNORECASE,
)
_AUTH_TEXT = re.compile(
    r"\b40[13]\b|unauthori[sz]ed|forbidden|authenticat|not logged in|/login|oauth"
    r"|api key not valid|invalid (?:x-)?api[ _-]?key|(?:refresh|access) token"
    r"|(?:log|sign) in again|credentials|permission_denied|unauthenticated",
    re.IGNORECASE,
)
_UPSTREAM_TEXT = re.compile(
    r"\b(?:500|502|503|504|529)\b|overloaded|internal server error|service unavailable"
    r"|bad gateway|gateway timeout|server_error|econn(?:refused|reset)|etimedout|enotfound"
    r"|eai_again|connection (?:error|refused|reset)|socket hang up|fetch failed"
    r"|network error",
    re.IGNORECASE,
)
_MAX_TURNS_TEXT = re.compile(r"max(?:imum)?[ _-]?(?:number of )?turns", re.IGNORECASE)

# What the controller scans for; scrubbed from every non-auth message.
AUTH_WORDS = ("401", "403", "oauth", "unauthorized", "authentication", "credentials", "forbidden")
_AUTH_WORD = re.compile("|".join(re.escape(word) for word in AUTH_WORDS), re.IGNORECASE)
_AUTH_WORD_REPLACEMENTS = {
    "401": "4xx",
    "403": "4xx",
    "oauth": "login",
    "unauthorized": "denied",
    "authentication": "sign-in",
    "credentials": "login",
    "forbidden": "denied",
}
_MAX_MESSAGE_CHARS = 500


# Row 1's exact message for a missing runtime, whatever the runtime: the controller
# matches this literal to tell a container fault from auth (both travel as 503).
UNAVAILABLE_MESSAGE = "Claude Code is not available in this container"


def permission_bypass_message(detail: str) -> str:
    """Row 1's message for a refused permission mode: starts `Permission bypass failed`."""
    return f"Permission bypass failed: {detail}"


@dataclass(frozen=True)
class _Evidence:
    """The structured facts, lower-cased, that rows 5-10 read."""

    codes: frozenset[str]
    status: int | None

    @classmethod
    def of_stream(cls, stream: TurnStream) -> _Evidence:
        primary = cls(
            codes=_lowered(
                [*stream.error_codes, stream.api_error, stream.api_error_type],
            ),
            status=stream.api_error_status,
        )
        if primary.codes or primary.status is not None or not stream.api_retries:
            return primary
        # The result says nothing itself: the last retry's reason is why it failed.
        last = stream.api_retries[-1]
        status = last.get("error_status")
        error = last.get("error")
        return cls(
            codes=_lowered([error if isinstance(error, str) else None]),
            status=status if isinstance(status, int) and not isinstance(status, bool) else None,
        )


def _lowered(values: Iterable[str | None]) -> frozenset[str]:
    return frozenset(value.lower() for value in values if value)


# --- the table ---------------------------------------------------------------------


def classify_outcome(
    stream: TurnStream,
    facts: ProcessFacts,
    *,
    runtime_label: str,
    expected_permission_mode: str | None,
    now: datetime,
) -> Outcome:
    """Classify one finished turn by the contract §7 table (first match wins). Pure."""
    error_texts = [*stream.error_texts, facts.stderr] if facts.stderr else [*stream.error_texts]

    # Row 1: container fault.
    if facts.spawn_failed:
        return _outcome(OutcomeKind.CONTAINER_FAULT, UNAVAILABLE_MESSAGE)
    if _ROOT_REFUSAL in facts.stderr and not stream.has_result:
        return _outcome(
            OutcomeKind.CONTAINER_FAULT,
            permission_bypass_message(
                f"{runtime_label} refuses to skip permission prompts as root "
                "(run as a non-root user or set IS_SANDBOX=1)"
            ),
        )
    if (
        expected_permission_mode is not None
        and stream.permission_mode is not None
        and stream.permission_mode != expected_permission_mode
    ):
        return _outcome(
            OutcomeKind.CONTAINER_FAULT,
            permission_bypass_message(
                f"{runtime_label} runs in permission mode {stream.permission_mode!r}, "
                f"not {expected_permission_mode!r}"
            ),
        )
    # Rows 2 and 3: our own decisions, whatever the stream said.
    if facts.terminated:
        return _outcome(OutcomeKind.CANCELLED, "The turn was cancelled")
    if facts.timed_out:
        return _outcome(OutcomeKind.TIMEOUT, "The turn ran past its timeout and was stopped")

    # Success: a result that is not an error (or a clean exit with no error reported).
    if not stream.is_error and (stream.has_result or facts.exit_code == 0):
        return _outcome(OutcomeKind.SUCCESS, "")

    # Row 4: killed. A result event already says what happened, so it wins.
    if not stream.has_result and (
        _is_signal_exit(facts.exit_code) or _OOM.search(facts.stderr) is not None
    ):
        return _outcome(
            OutcomeKind.KILLED,
            f"{runtime_label} was killed ({_exit_phrase(facts.exit_code)}), possibly out of memory",
        )

    evidence = _Evidence.of_stream(stream)
    kind = (
        _by_structure(stream, facts, evidence)
        or _by_exit_status(facts.exit_code)
        or _by_text(error_texts)
        or OutcomeKind.EXECUTION_ERROR
    )
    return _build(kind, stream, facts, evidence, error_texts, runtime_label, now)


def _by_structure(
    stream: TurnStream, facts: ProcessFacts, evidence: _Evidence
) -> OutcomeKind | None:
    """Rows 5-10 on the structured stream fields."""
    codes, status = evidence.codes, evidence.status
    zero_usage = not stream.input_tokens and not stream.output_tokens and not stream.cost_usd
    if (
        codes & _MODEL_CODES
        or (status == 404 and codes & _NOT_FOUND_TYPES)
        or (_UNRECOGNIZED_MODEL in facts.stderr and zero_usage)
    ):
        return OutcomeKind.MODEL_UNSUPPORTED
    rejected = stream.rate_limit_info is not None and (
        stream.rate_limit_info.get("status") == "rejected"
    )
    if rejected or codes & _RATE_LIMIT_CODES or status == 429:
        return OutcomeKind.RATE_LIMIT
    if codes & _BILLING_CODES or status == 402:
        return OutcomeKind.BILLING
    if codes & _AUTH_CODES or status in (401, 403):
        return OutcomeKind.AUTH
    if codes & _UPSTREAM_CODES or (status is not None and 500 <= status <= 599):
        return OutcomeKind.UPSTREAM_UNAVAILABLE
    if stream.terminal_reason in _MAX_TURN_REASONS or stream.subtype in _MAX_TURN_REASONS:
        return OutcomeKind.MAX_TURNS
    return None


def _by_exit_status(exit_code: int | None) -> OutcomeKind | None:
    """Exit codes that name a cause (Gemini CLI's; Claude Code and Codex exit 1)."""
    if exit_code == _EXIT_AUTH:
        return OutcomeKind.AUTH
    if exit_code == _EXIT_TURN_LIMIT:
        return OutcomeKind.MAX_TURNS
    return None


def _by_text(error_texts: Sequence[str]) -> OutcomeKind | None:
    """Rows 5-10 on text markers of error channels only."""
    markers = (
        (_MODEL_TEXT, OutcomeKind.MODEL_UNSUPPORTED),
        (_RATE_LIMIT_TEXT, OutcomeKind.RATE_LIMIT),
        (_BILLING_TEXT, OutcomeKind.BILLING),
        (_AUTH_TEXT, OutcomeKind.AUTH),
        (_UPSTREAM_TEXT, OutcomeKind.UPSTREAM_UNAVAILABLE),
        (_MAX_TURNS_TEXT, OutcomeKind.MAX_TURNS),
    )
    for pattern, kind in markers:
        if any(pattern.search(text) for text in error_texts):
            return kind
    return None


def _build(
    kind: OutcomeKind,
    stream: TurnStream,
    facts: ProcessFacts,
    evidence: _Evidence,
    error_texts: Sequence[str],
    runtime_label: str,
    now: datetime,
) -> Outcome:
    """The outcome of an error row, with its message and rate-limit facts."""
    cli_text = _first_text(error_texts)
    resets_at: datetime | None = None
    rate_limit_type: str | None = None
    if kind is OutcomeKind.RATE_LIMIT:
        resets_at = parse_resets_at(stream.rate_limit_info, error_texts, now)
        window = (stream.rate_limit_info or {}).get("rateLimitType")
        rate_limit_type = window if isinstance(window, str) and window else None
    fallback = {
        OutcomeKind.MODEL_UNSUPPORTED: f"The model is not available to {runtime_label}",
        OutcomeKind.RATE_LIMIT: f"{runtime_label} hit a usage limit",
        OutcomeKind.BILLING: "The account has no credit left",
        OutcomeKind.AUTH: f"{runtime_label} could not authenticate",
        OutcomeKind.UPSTREAM_UNAVAILABLE: "The model API is unavailable; retry later",
        OutcomeKind.MAX_TURNS: f"{runtime_label} stopped at the maximum number of turns",
    }.get(kind, f"{runtime_label} failed ({_exit_phrase(facts.exit_code)})")
    message = cli_text or fallback
    if kind is OutcomeKind.RATE_LIMIT and resets_at is not None and cli_text is None:
        message = f"{fallback}; resets {_iso_z(resets_at)}"
    return _outcome(
        kind,
        message,
        api_error_status=evidence.status,
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
    row = _ROWS[kind]
    return Outcome(
        kind=kind,
        status=row.status,
        error_code=row.error_code,
        retryable=row.retryable,
        switch_credential=row.switch_credential,
        api_error_status=api_error_status,
        resets_at=resets_at,
        rate_limit_type=rate_limit_type,
        message=_shape_message(message, auth=kind is OutcomeKind.AUTH),
    )


def _first_text(texts: Sequence[str]) -> str | None:
    for text in texts:
        if text.strip():
            return text
    return None


def _shape_message(message: str, *, auth: bool) -> str:
    """One short line; a non-auth message loses every auth word the controller scans."""
    line = " ".join(message.split())
    if len(line) > _MAX_MESSAGE_CHARS:
        line = line[: _MAX_MESSAGE_CHARS - 1] + "…"
    if auth:
        return line
    # Replacements hold no auth word, but a removal can join two fragments into one:
    # repeat until clean (each pass shortens or keeps the text, so this ends).
    for _ in range(len(line) + 1):
        if _AUTH_WORD.search(line) is None:
            return line
        line = _AUTH_WORD.sub(lambda m: _AUTH_WORD_REPLACEMENTS[m.group(0).lower()], line)
    return "The turn failed"


def _is_signal_exit(exit_code: int | None) -> bool:
    return exit_code is not None and (exit_code < 0 or exit_code in _SIGNAL_EXIT_CODES)


def _exit_phrase(exit_code: int | None) -> str:
    if exit_code is None:
        return "no exit status"
    if exit_code < 0:
        return f"signal {-exit_code}"
    return f"exit status {exit_code}"


# --- the error body ----------------------------------------------------------------

ERROR_DETAIL_KEYS = (
    "message",
    "error_code",
    "retryable",
    "switch_credential",
    "execution_id",
    "auth_route",
    "api_error_status",
    "resets_at",
    "rate_limit_type",
    "metadata",
    "execution_log",
)


def error_detail(
    outcome: Outcome,
    *,
    execution_id: str,
    auth_route: str,
    metadata: dict[str, Any] | None,
    execution_log: list[Any] | None,
) -> dict[str, Any]:
    """The inner `detail` of a §7 error body (the caller wraps it as `{"detail": …}`)."""
    return {
        "message": outcome.message,
        "error_code": outcome.error_code,
        "retryable": outcome.retryable,
        "switch_credential": outcome.switch_credential,
        "execution_id": execution_id,
        "auth_route": auth_route,
        "api_error_status": outcome.api_error_status,
        "resets_at": _iso_z(outcome.resets_at) if outcome.resets_at is not None else None,
        "rate_limit_type": outcome.rate_limit_type,
        "metadata": metadata,
        "execution_log": execution_log,
    }


def retry_after_seconds(outcome: Outcome, now: datetime) -> int | None:
    """Seconds for a `Retry-After` header: until `resets_at`, rounded up, at least 1."""
    if outcome.resets_at is None:
        return None
    aware_now = now if now.tzinfo is not None else now.replace(tzinfo=UTC)
    seconds = (outcome.resets_at - aware_now).total_seconds()
    return max(1, math.ceil(seconds))


def _iso_z(instant: datetime) -> str:
    """ISO-8601 UTC with `Z`, whole seconds, rounded up so a reset is never early."""
    utc = instant.astimezone(UTC)
    if utc.microsecond:
        utc = utc.replace(microsecond=0)
        with contextlib.suppress(OverflowError):  # only at the very end of year 9999
            utc += timedelta(seconds=1)
    return f"{utc.year:04d}-{utc:%m-%dT%H:%M:%S}Z"
