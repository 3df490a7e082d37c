"""The error vocabulary the agent CLIs share: their APIs' codes and error words, by row.

Each CLI relays what its model API (or a gateway in front of it) answered: the
Messages API's `rate_limit_error`, OpenAI's `insufficient_quota`, Google's
`RESOURCE_EXHAUSTED`, an HTTP status in prose. So every adapter hands this vocabulary
to the outcome table through its `OutcomeHints`, with its own CLI's codes and texts
beside it. Codes are compared lower case; text markers are read on error channels only.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from agent_server.wire.names import OutcomeKind

__all__ = ["ERROR_CODES", "NOT_FOUND_CODES", "TEXT_MARKERS"]

_CODES_BY_ROW: tuple[tuple[OutcomeKind, frozenset[str]], ...] = (
    (OutcomeKind.MODEL_UNSUPPORTED, frozenset({"model_not_found"})),
    (
        OutcomeKind.RATE_LIMIT,
        frozenset(
            {"rate_limit", "rate_limit_error", "rate_limit_exceeded", "usage_limit_reached"}
            | {"resource_exhausted", "usage_limit_exceeded"}
        ),
    ),
    (
        OutcomeKind.BILLING,
        frozenset({"billing_error", "insufficient_quota", "credit_balance_too_low"}),
    ),
    (
        OutcomeKind.AUTH,
        frozenset(
            {"authentication_failed", "authentication_error", "oauth_org_not_allowed"}
            | {"permission_error", "unauthenticated", "permission_denied", "invalid_api_key"}
        ),
    ),
    (
        OutcomeKind.UPSTREAM_UNAVAILABLE,
        frozenset(
            {"server_error", "overloaded_error", "overloaded", "api_error", "internal_error"}
            | {"connection_error", "api_connection_error", "api_timeout", "timeout_error"}
            | {"unavailable", "internal", "deadline_exceeded", "service_unavailable"}
        ),
    ),
)
ERROR_CODES: Mapping[str, OutcomeKind] = {
    code: kind for kind, codes in _CODES_BY_ROW for code in codes
}
"""A structured error code (lower case) -> the row it names."""
NOT_FOUND_CODES = frozenset({"not_found_error", "not_found"})
"""Error types that, with a 404, say the model is unknown."""

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
"""Text markers per row, read only on error channels, in table order."""
