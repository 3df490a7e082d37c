"""The envelope (contract §6.6, §6.8): a terminal answer in Trinity's callback shape and ours."""

from __future__ import annotations

import pytest

from agent_server.outcome.classify import ERROR_CODES
from agent_server.records.envelope import (
    MAX_RESPONSE_CHARS,
    TRINITY_CODES,
    bound_log,
    envelope_of,
)
from agent_server.wire.results import ResultEnvelope
from tests.support.envelopes import failure, success

# What Trinity's backend keeps (services/execution_envelope.py, TaskExecutionErrorCode):
# any other error_code is dropped there, and the result loses its cause.
TRINITY_ERROR_CODES = frozenset(
    {
        "timeout", "capacity", "auth", "billing", "agent_error", "network", "circuit_open",
        "reconciled", "lease_expired", "skill_not_found", "ephemeral_exhausted",
        "model_unsupported",
    }
)  # fmt: skip


# --- the envelope ------------------------------------------------------------------------


def test_a_success_envelope_is_trinitys_shape_and_ours() -> None:
    """status, response, terminal_reason completed, and the route and status beside them."""
    envelope = bound_log(success())
    ResultEnvelope.model_validate(envelope)
    assert (envelope["status"], envelope["terminal_reason"]) == ("success", "completed")
    assert (envelope["auth_route"], envelope["http_status"]) == ("api_key", 200)
    assert (envelope["error"], envelope["error_code"], envelope["detail"]) == (None, None, None)
    assert envelope["execution_time_ms"] == 1500
    assert envelope["truncated_log"] is False


@pytest.mark.parametrize("code", sorted(ERROR_CODES))
def test_every_error_code_maps_to_one_trinity_keeps(code: str) -> None:
    """A failure: Trinity's code, the message cut to 500, ours kept in `detail`."""
    envelope = bound_log(failure(code))
    ResultEnvelope.model_validate(envelope)
    assert envelope["status"] == "failed"
    assert envelope["error_code"] in TRINITY_ERROR_CODES
    assert len(envelope["error"]) == 500
    assert envelope["detail"]["error_code"] == code
    assert envelope["detail"]["switch_credential"] is True
    assert "metadata" not in envelope["detail"]
    assert envelope["session_id"] == "s-2"


def test_the_mapping_covers_every_outcome() -> None:
    """No §7 code falls through to the catch-all by accident."""
    assert set(TRINITY_CODES) == set(ERROR_CODES)


def test_a_cancel_is_cancelled_and_a_long_response_is_cut_to_what_the_callback_takes() -> None:
    """`cancelled` with its reason; a response past 4,000,000 characters is cut and says so."""
    body = {"status": "cancelled", "response": "y" * (MAX_RESPONSE_CHARS + 5), "metadata": None}
    envelope = envelope_of("e-3", 200, body, auth_route="baseline", elapsed_ms=0)
    assert (envelope["status"], envelope["terminal_reason"]) == ("cancelled", "cancelled")
    assert len(envelope["response"]) == MAX_RESPONSE_CHARS
    assert envelope["response_truncated"] is True


def test_a_log_past_the_limit_is_left_out_and_flagged() -> None:
    """bound_log: over the limit the log is null and `truncated_log` true; else untouched."""
    envelope = success()
    assert bound_log(envelope, limit=10)["execution_log"] is None
    assert bound_log(envelope, limit=10)["truncated_log"] is True
    assert bound_log(envelope)["execution_log"] == [{"type": "result"}]
