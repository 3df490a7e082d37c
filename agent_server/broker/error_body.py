"""What an API's refusal says in its body, whichever API it is (contract §7). Pure.

The three APIs word a refusal in one JSON object, `{"error": {...}}`:

- the Messages API: `type` (`rate_limit_error`, `authentication_error`, …), `message`;
- the OpenAI API: `code` (`rate_limit_exceeded`, `insufficient_quota`,
  `invalid_api_key`, …) beside `type` and `message`; a plan's usage limit says
  `type: usage_limit_reached` with `resets_in_seconds` (or `resets_at`);
- the Gemini API: a numeric `code` (the HTTP status), `status` (`RESOURCE_EXHAUSTED`,
  `PERMISSION_DENIED`, …), `message` and `details`: an `ErrorInfo`'s `reason`
  (`API_KEY_INVALID`) and a `RetryInfo`'s `retryDelay` (`"43s"`).

`read_error` keeps each of these facts bounded, whichever are there.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

MAX_BODY_BYTES = 16 * 1024
"""How much of a refusal's body is read: the APIs' errors are a few hundred bytes."""
_WORD = 64


@dataclass(frozen=True)
class ErrorBody:
    """The facts of one refusal's body (None: the body did not say)."""

    type: str | None = None
    message: str | None = None
    code: str | None = None
    """OpenAI's `code`, or Gemini's `status`."""
    reason: str | None = None
    """The reason of a Google `ErrorInfo` detail."""
    retry_after_s: float | None = None
    """When the API says to try again, in seconds from its answer."""
    resets_at: float | None = None
    """When the API says the limit resets (epoch seconds)."""


def read_error(body: bytes) -> ErrorBody | None:
    """The refusal's facts, or None when its body is no JSON error object."""
    try:
        parsed = json.loads(body[:MAX_BODY_BYTES])
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None
    error = parsed.get("error") if isinstance(parsed, dict) else None
    if not isinstance(error, dict):
        return None
    code = error.get("code") if isinstance(error.get("code"), str) else error.get("status")
    details = error.get("details")
    details = [d for d in details if isinstance(d, dict)] if isinstance(details, list) else []
    return ErrorBody(
        type=_word(error.get("type")),
        message=error["message"][:500] if isinstance(error.get("message"), str) else None,
        code=_word(code),
        reason=next((_word(d.get("reason")) for d in details if d.get("reason")), None),
        retry_after_s=_retry_after(error, details),
        resets_at=_finite(error.get("resets_at")),
    )


def _retry_after(error: dict[str, Any], details: list[dict[str, Any]]) -> float | None:
    """OpenAI's `resets_in_seconds`, or a Google `RetryInfo`'s `retryDelay` (`"43.2s"`)."""
    seconds = _finite(error.get("resets_in_seconds"))
    if seconds is not None:
        return seconds
    for detail in details:
        delay = detail.get("retryDelay")
        if isinstance(delay, str) and delay.endswith("s"):
            try:
                return _finite(float(delay[:-1]))
            except ValueError:
                return None
    return None


def _word(value: object) -> str | None:
    return value[:_WORD] if isinstance(value, str) else None


def _finite(value: object) -> float | None:
    """A JSON number that is finite and not negative (a bool is no number)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    number = float(value)
    return number if math.isfinite(number) and number >= 0 else None
