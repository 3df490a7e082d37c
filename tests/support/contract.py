"""Facts of docs/contract.md that tests check answers against, stated here, not imported."""

from __future__ import annotations

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
"""The keys of every turn error's `detail`, in order (contract §7)."""
