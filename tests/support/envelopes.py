"""Envelopes of terminal answers for the records' tests: a success and a failure."""

from __future__ import annotations

from typing import Any

from agent_server.records.envelope import envelope_of
from tests.support.contract import ERROR_DETAIL_KEYS


def success(execution_id: str = "e-1", response: str = "done") -> dict[str, Any]:
    """A success's envelope."""
    body = {
        "status": "success",
        "response": response,
        "execution_log": [{"type": "result"}],
        "session_id": "s-1",
        "timestamp": "2026-12-01T00:00:00+00:00",
        "metadata": metadata(execution_id),
    }
    return envelope_of(execution_id, 200, body, auth_route="api_key", elapsed_ms=1500)


def metadata(execution_id: str) -> dict[str, Any]:
    """A turn's metadata, in short."""
    return {"execution_id": execution_id, "context_window": 200_000, "auth_route": "api_key",
            "generation": 1}  # fmt: skip


def failure(error_code: str, status: int = 429, execution_id: str = "e-2") -> dict[str, Any]:
    """A failure's envelope, its message long enough to be cut."""
    detail = {key: None for key in ERROR_DETAIL_KEYS}
    detail |= {
        "message": "x" * 900,
        "error_code": error_code,
        "retryable": False,
        "switch_credential": True,
        "execution_id": execution_id,
        "auth_route": "baseline",
        "metadata": metadata(execution_id) | {"session_id": "s-2"},
        "execution_log": [],
    }
    return envelope_of(
        execution_id, status, {"detail": detail}, auth_route="baseline", elapsed_ms=7
    )
