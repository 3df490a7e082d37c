"""A turn's terminal envelope: its answer in the shape Trinity's result callback takes.

The same record is retained (`GET /api/executions/{id}/result`, contract §6.6) and
POSTed to the controller for an async turn (§6.8). Trinity reads `status`
(`success`, `failed`, `cancelled`), `response` or `error` (at most 500 characters)
and `error_code` (its own vocabulary: ours mapped onto it below), `terminal_reason`,
`metadata`, `execution_log`, `session_id` and `execution_time_ms`. Trinity ignores
what it does not know, so the envelope also carries ours: `execution_id`,
`auth_route` (the `X-Trinity-Auth-Override` of the turn), `http_status` (what the
synchronous answer's status was) and, for a failure, `detail`: the §7 error body
without its `metadata` and `execution_log`, which are beside it.
"""

from __future__ import annotations

from typing import Any

from agent_server.secret_file import json_chunks
from agent_server.wire.names import AuthRoute

MAX_RESPONSE_CHARS = 4_000_000
"""The longest `response` Trinity's backend takes (a longer one is refused, 413)."""
MAX_ERROR_CHARS = 500
MAX_LOG_BYTES = 16_000_000
"""The largest `execution_log` (as JSON) Trinity's backend takes; a longer one is
dropped from the envelope (`truncated_log: true`), its result and metadata kept."""

# Our error codes in Trinity's vocabulary (backend `TaskExecutionErrorCode`): an
# unknown value would be dropped there, so every code maps to one it knows.
# `terminal_reason` is logged by the backend; it says what ended the turn.
TRINITY_CODES: dict[str, tuple[str, str]] = {
    "auth": ("auth", "auth"),
    "billing": ("billing", "error"),
    "rate_limit": ("billing", "rate_limit"),  # as Trinity's own agent reports a 429
    "model_unsupported": ("model_unsupported", "error"),
    "timeout": ("timeout", "max_duration"),
    "killed": ("agent_error", "killed"),
    "container_fault": ("agent_error", "error"),
    "upstream_unavailable": ("network", "error"),
    "max_turns": ("agent_error", "max_turns"),
    "execution_error": ("agent_error", "error"),
}
OTHER_CODE = ("agent_error", "error")
"""A refusal that came after the 202 (`spawn_too_large`), or a code not above."""


def envelope_of(
    execution_id: str,
    status: int,
    body: dict[str, Any],
    *,
    auth_route: AuthRoute,
    elapsed_ms: int,
) -> dict[str, Any]:
    """The envelope of one terminal answer (`status`, `body`) of `execution_id`."""
    common: dict[str, Any] = {
        "execution_id": execution_id,
        "auth_route": auth_route,
        "http_status": status,
        "execution_time_ms": max(0, min(elapsed_ms, 2**31 - 1)),
    }
    detail = body.get("detail")
    if status < 300 or not isinstance(detail, dict):
        cancelled = body.get("status") == "cancelled"
        response = body.get("response") or ""
        return {
            **common,
            "status": "cancelled" if cancelled else "success",
            "response": response[:MAX_RESPONSE_CHARS],
            "response_truncated": len(response) > MAX_RESPONSE_CHARS,
            "error": None,
            "error_code": None,
            "terminal_reason": "cancelled" if cancelled else "completed",
            "session_id": body.get("session_id"),
            "metadata": body.get("metadata"),
            "execution_log": body.get("execution_log"),
            "detail": None,
        }
    error_code, reason = TRINITY_CODES.get(str(detail.get("error_code")), OTHER_CODE)
    metadata = detail.get("metadata")
    return {
        **common,
        "status": "failed",
        "response": None,
        "response_truncated": False,
        "error": str(detail.get("message", ""))[:MAX_ERROR_CHARS],
        "error_code": error_code,
        "terminal_reason": reason,
        "session_id": metadata.get("session_id") if isinstance(metadata, dict) else None,
        "metadata": metadata,
        "execution_log": detail.get("execution_log"),
        "detail": {k: v for k, v in detail.items() if k not in ("metadata", "execution_log")},
    }


def bound_log(envelope: dict[str, Any], limit: int = MAX_LOG_BYTES) -> dict[str, Any]:
    """`envelope` with `truncated_log`, its `execution_log` dropped when over `limit`."""
    log = envelope.get("execution_log")
    too_long = log is not None and _json_size(log) > limit
    return {**envelope, "execution_log": None if too_long else log, "truncated_log": too_long}


def _json_size(value: Any) -> int:
    """The bytes of `value` as compact JSON, measured a piece at a time."""
    return sum(len(piece.encode()) for piece in json_chunks(value))
