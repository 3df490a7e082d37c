"""The exchange's verdict on a credential, and the headroom its headers report (contract §7).

Pure. `verdict_of` reads one exchange the broker saw: its status, the API's error
type, code, reason and message (`error_body`), and the unified rate-limit headers. It
says which row of the outcome table the API's answer is (rate limit with its window
and reset, auth, billing, model rejection, upstream), or None for a success or an
answer no row names. The three APIs' words for each row are the tables below: the
Messages API's error types, the OpenAI API's error codes, the Gemini API's statuses
and reasons (a 400 `API_KEY_INVALID` is a bad key, as a 401 is). A reset later
than its window can reach (five hours or seven days, plus a minute) is not believed:
one credential's refusal cannot hold a pool for a century.

`rate_limit_info` turns the unified headers of any answer into the shape of Claude
Code's own `rate_limit_info`, so the one reader of that shape (`runtimes.rate_limit`)
checks a broker's reading as it checks a CLI's.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from agent_server.broker.exchange import RATE_LIMIT_PREFIX, Exchange
from agent_server.wire.names import LONGEST_WINDOW, WINDOW_LENGTHS, OutcomeKind

_WINDOWS = {"5h": "five_hour", "7d": "seven_day"}
"""The unified headers' short window names, and the names a reading gives them."""
_SLACK = timedelta(minutes=1)
WINDOW_REACH: dict[str, timedelta] = {
    window: length + _SLACK for window, length in WINDOW_LENGTHS.items()
}
"""How far ahead each window's reset can lie; any other window, or none, reaches 7 days."""
_LONGEST_REACH = LONGEST_WINDOW + _SLACK
_BILLING_WORDS = frozenset({"billing_error", "insufficient_quota"})
_RATE_LIMIT_WORDS = frozenset(
    {"rate_limit_error", "rate_limit_exceeded", "usage_limit_reached", "RESOURCE_EXHAUSTED"}
)
_AUTH_WORDS = frozenset(
    {
        "authentication_error",
        "permission_error",
        "invalid_api_key",
        "UNAUTHENTICATED",
        "PERMISSION_DENIED",
        "API_KEY_INVALID",
        "API_KEY_EXPIRED",
    }
)
_MODEL_WORDS = frozenset({"model_not_found"})
_UPSTREAM_WORDS = frozenset(
    {"overloaded_error", "api_error", "server_error", "UNAVAILABLE", "INTERNAL"}
)
"""Each row's words: an error type or code (or a Google status or reason) of any API."""


@dataclass(frozen=True)
class ExchangeVerdict:
    """What one refused exchange says of its credential (kind None: no row of its own)."""

    kind: OutcomeKind | None
    api_error_status: int | None
    resets_at: datetime | None = None
    rate_limit_type: str | None = None


def verdict_of(exchange: Exchange, now: datetime) -> ExchangeVerdict:
    """The outcome row the API's answer to `exchange` names (None for a success)."""
    status = exchange.status
    if status is None:  # no answer at all: the upstream could not be reached
        return ExchangeVerdict(OutcomeKind.UPSTREAM_UNAVAILABLE, None)
    if 200 <= status < 300:
        return ExchangeVerdict(None, status)
    kind = _kind(status, _words(exchange), (exchange.error_message or "").lower())
    if kind is not OutcomeKind.RATE_LIMIT:
        return ExchangeVerdict(kind, status)
    window = exchange.headers.get(RATE_LIMIT_PREFIX + "representative-claim")
    window = window if window in WINDOW_REACH or window == "overage" else None
    return ExchangeVerdict(kind, status, _reset(exchange, window, now), window)


def _words(exchange: Exchange) -> frozenset[str]:
    """The refusal's error type, code and reason: whichever its API gave."""
    error = exchange.error
    return frozenset(w for w in (exchange.error_type, error.code, error.reason) if w)


def _kind(status: int, words: frozenset[str], message: str) -> OutcomeKind | None:
    """The row of an API refusal, by its words and status. Billing comes first: the
    OpenAI API answers an exhausted credit 429 `insufficient_quota`."""
    if status == 402 or words & _BILLING_WORDS or "credit balance" in message:
        return OutcomeKind.BILLING
    if status == 429 or words & _RATE_LIMIT_WORDS:
        return OutcomeKind.RATE_LIMIT
    if status in (401, 403) or words & _AUTH_WORDS:
        return OutcomeKind.AUTH
    if words & _MODEL_WORDS or (status in (400, 404) and "model" in message):
        # Each API's refusal of a model names it (`model: m`, "The model `m` does not
        # exist", `models/m is not found`); a 404 on a path (a wrong base URL) is no
        # model's, and no row of its own.
        return OutcomeKind.MODEL_UNSUPPORTED
    if status >= 500 or words & _UPSTREAM_WORDS:
        return OutcomeKind.UPSTREAM_UNAVAILABLE
    return None


def _reset(exchange: Exchange, window: str | None, now: datetime) -> datetime | None:
    """The refusal's reset: the unified header, else `retry-after`, else what the body
    says (OpenAI's `resets_at` or `resets_in_seconds`, Gemini's `retryDelay`); None when
    none is believed."""
    headers, error = exchange.headers, exchange.error
    epoch = _number(headers.get(RATE_LIMIT_PREFIX + "reset"))
    if epoch is None or not math.isfinite(epoch) or not 0 < epoch < 1e11:
        epoch = error.resets_at if error.resets_at is not None and error.resets_at < 1e11 else None
    if epoch is not None and epoch > 0:
        instant = datetime.fromtimestamp(math.ceil(epoch), UTC)
    else:
        after = _number(headers.get("retry-after"))
        if after is None or not math.isfinite(after) or not 0 <= after < 1e9:
            after = error.retry_after_s
        if after is None or not 0 <= after < 1e9:
            return None
        instant = (now + timedelta(seconds=math.ceil(after))).replace(microsecond=0)
    reach = WINDOW_REACH.get(window or "", _LONGEST_REACH)
    if instant <= now or instant > now + reach:
        return None
    return instant


def rate_limit_info(headers: Mapping[str, str]) -> dict[str, Any] | None:
    """The unified headers of an answer in Claude Code's `rate_limit_info` shape, or None
    when the answer carried none (an API key's answers, a gateway's)."""
    if not any(name.startswith(RATE_LIMIT_PREFIX) for name in headers):
        return None

    def header(name: str) -> str | None:
        return headers.get(RATE_LIMIT_PREFIX + name)

    windows = {
        long: {
            "utilization": _number(header(f"{short}-utilization")),
            "resetsAt": _number(header(f"{short}-reset")),
            "status": header(f"{short}-status"),
        }
        for short, long in _WINDOWS.items()
    }
    claim = header("representative-claim")
    claimed: dict[str, Any] = windows.get(claim or "", {})
    short = {long: short for short, long in _WINDOWS.items()}.get(claim or "")
    return {
        "status": header("status"),
        "resetsAt": _number(header("reset")),
        "rateLimitType": claim,
        "utilization": claimed.get("utilization"),
        "surpassedThreshold": _number(header(f"{short}-surpassed-threshold")) if short else None,
        "overageStatus": header("overage-status"),
        "overageResetsAt": _number(header("overage-reset")),
        "overageDisabledReason": header("overage-disabled-reason"),
        "unifiedWindows": windows,
    }


def _number(text: str | None) -> float | None:
    if text is None:
        return None
    try:
        return float(text.strip())
    except ValueError:
        return None
