"""What counts as evidence for each row of the outcome table (contract §7).

Two vocabularies: structured codes (from the assistant `error`, `api_error`,
`api_error_type`, an api_retry's `error`, Gemini's error-body `status`), compared
case-insensitively; and text markers, which `outcome.classify_outcome` reads only on
error channels. Runtime-specific evidence (an exit status, a stderr marker) is on
each adapter's `OutcomeHints`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from agent_server.runtimes.stream import TurnStream
from agent_server.wire.names import OutcomeKind

MODEL_CODES = frozenset({"model_not_found", "claude_code_version_too_old"})
NOT_FOUND_TYPES = frozenset({"not_found_error", "not_found"})
RATE_LIMIT_CODES = frozenset(
    {"rate_limit", "rate_limit_error", "rate_limit_exceeded", "usage_limit_reached"}
    | {"resource_exhausted", "usage_limit_exceeded"}
)
BILLING_CODES = frozenset({"billing_error", "insufficient_quota", "credit_balance_too_low"})
AUTH_CODES = frozenset(
    {"authentication_failed", "authentication_error", "oauth_org_not_allowed"}
    | {"permission_error", "unauthenticated", "permission_denied", "invalid_api_key"}
)
UPSTREAM_CODES = frozenset(
    {"server_error", "overloaded_error", "overloaded", "api_error", "internal_error"}
    | {"connection_error", "api_connection_error", "api_timeout", "timeout_error"}
    | {"unavailable", "internal", "deadline_exceeded", "service_unavailable"}
)
MAX_TURN_REASONS = frozenset({"max_turns", "error_max_turns"})

SIGNAL_EXIT_CODES = frozenset({130, 137, 143})
# `Killed` is the shell's exact word for SIGKILL; a lower-case "killed" is just prose.
OOM_TEXT = re.compile(
    r"(?-i:\bKilled\b)|out of memory|\boom[- ]?kill|cannot allocate memory|bad_alloc",
    re.IGNORECASE,
)

# Text markers per row, read only on error channels, in table order.
TEXT_MARKERS: tuple[tuple[re.Pattern[str], OutcomeKind], ...] = (
    (
        re.compile(
            r"model_not_found|issue with the selected model|models/\S+ is not found",
            re.IGNORECASE,
        ),
        OutcomeKind.MODEL_UNSUPPORTED,
    ),
    (
        re.compile(
            # Not a bare "limit reached": `Context limit reached` is no credential's fault.
            r"rate[ _-]?limit|usage limit|hit your (?:[\w-]+ )?limit|limit reached\|\d"
            r"|resource_exhausted|exhausted your (?:capacity|quota)|too many requests|\b429\b",
            re.IGNORECASE,
        ),
        OutcomeKind.RATE_LIMIT,
    ),
    (
        re.compile(
            r"credit balance|insufficient (?:credit|funds|balance)|insufficient_quota|billing"
            r"|payment required|\b402\b",
            re.IGNORECASE,
        ),
        OutcomeKind.BILLING,
    ),
    (
        re.compile(
            r"\b40[13]\b|unauthori[sz]ed|forbidden|authenticat|not logged in|/login|oauth"
            r"|api key not valid|invalid (?:x-)?api[ _-]?key|(?:refresh|access) token"
            r"|(?:log|sign) in again|credentials|permission_denied|unauthenticated",
            re.IGNORECASE,
        ),
        OutcomeKind.AUTH,
    ),
    (
        re.compile(
            r"\b(?:500|502|503|504|529)\b|overloaded|internal server error|service unavailable"
            r"|bad gateway|gateway timeout|server_error|econn(?:refused|reset)|etimedout"
            r"|enotfound|eai_again|connection (?:error|refused|reset)|socket hang up"
            r"|fetch failed|network error",
            re.IGNORECASE,
        ),
        OutcomeKind.UPSTREAM_UNAVAILABLE,
    ),
    (
        re.compile(r"max(?:imum)?[ _-]?(?:number of )?turns", re.IGNORECASE),
        OutcomeKind.MAX_TURNS,
    ),
)


@dataclass(frozen=True)
class Evidence:
    """The structured facts, lower-cased, that rows 5-10 read."""

    codes: frozenset[str]
    status: int | None

    @classmethod
    def of_stream(cls, stream: TurnStream, exit_status: int | None = None) -> Evidence:
        """The stream's own codes and status (else the HTTP status the CLI's exit code
        carries); else the last api_retry's reason."""
        status = stream.api_error_status
        primary = cls(
            codes=_lowered([*stream.error_codes, stream.api_error, stream.api_error_type]),
            status=status if status is not None else exit_status,
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
