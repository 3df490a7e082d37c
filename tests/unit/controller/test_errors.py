"""Every answer the server can give outside 2xx maps to one class of the controller's tree."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest

from agent_server.controller import errors
from agent_server.controller.errors import (
    AgentError,
    AuthRefused,
    BillingRefused,
    Busy,
    Conflict,
    CredentialRefused,
    ExecutionInProgress,
    GenerationMismatch,
    NotFound,
    RateLimited,
    RequestRejected,
    TurnFailed,
    Unauthorized,
    error_from_response,
)
from agent_server.errors import api_error_codes
from agent_server.outcome.classify import ROWS, STATUS_BY_ERROR_CODE

SERVER_ERRORS: dict[str, tuple[int, type[AgentError]]] = {
    "token_required": (400, RequestRejected),
    "token_invalid": (400, RequestRejected),
    "generation_mismatch": (409, GenerationMismatch),
    "persist_failed": (500, AgentError),
    "execution_in_progress": (409, ExecutionInProgress),
    "busy": (409, Busy),
    "not_found": (404, NotFound),
    "no_retained_result": (404, NotFound),
    "payload_too_large": (413, RequestRejected),
    "spawn_too_large": (422, RequestRejected),
    "method_not_allowed": (405, RequestRejected),
    "http_error": (418, RequestRejected),
    "internal_error": (500, AgentError),
}
TURN_CLASSES: dict[str, type[TurnFailed]] = {
    "rate_limit": RateLimited,
    "billing": BillingRefused,
    "auth": AuthRefused,
}


def _answer(status: int, body: Any, **headers: str) -> httpx.Response:
    request = httpx.Request("POST", "http://agent/api/task")
    return httpx.Response(
        status, content=json.dumps(body).encode(), headers=headers, request=request
    )


def _turn_detail(code: str, **extra: Any) -> dict[str, Any]:
    row = next(r for r in ROWS.values() if r.error_code == code)
    return {
        "message": f"the {code} message",
        "error_code": code,
        "retryable": row.retryable,
        "switch_credential": row.switch_credential,
        "execution_id": "job-1",
        "auth_route": "oauth_token",
        "api_error_status": None,
        "resets_at": None,
        "rate_limit_type": None,
        "metadata": None,
        "execution_log": [],
        **extra,
    }


def test_every_server_error_code_is_in_the_table() -> None:
    """The server's own codes are exactly the ones this test maps (a new one fails here)."""
    assert set(api_error_codes()) == set(SERVER_ERRORS)


@pytest.mark.parametrize(("code", "mapped"), sorted(SERVER_ERRORS.items()))
def test_a_server_refusal_maps_by_its_code(code: str, mapped: tuple[int, type[AgentError]]) -> None:
    """Each of the server's refusals is its own class, with what the body said."""
    status, kind = mapped
    detail = {
        "message": "m",
        "error_code": code,
        "retryable": code == "busy",
        "switch_credential": False,
    }
    error = error_from_response(_answer(status, {"detail": detail}))
    assert type(error) is kind
    assert (error.status, error.error_code, error.retryable) == (status, code, code == "busy")


@pytest.mark.parametrize("code", sorted(STATUS_BY_ERROR_CODE))
def test_a_turn_failure_maps_by_its_code(code: str) -> None:
    """Every §7 code is a TurnFailed; exactly the three switching ones are CredentialRefused."""
    header = {"X-Trinity-Auth-Override": "oauth_token"}
    error = error_from_response(
        _answer(STATUS_BY_ERROR_CODE[code], {"detail": _turn_detail(code)}, **header)
    )
    assert type(error) is TURN_CLASSES.get(code, TurnFailed)
    assert isinstance(error, CredentialRefused) is (code in TURN_CLASSES)
    assert error.switch_credential is (code in TURN_CLASSES)
    assert error.auth_override == "oauth_token"
    assert isinstance(error, TurnFailed)
    assert error.detail.execution_id == "job-1"


def test_a_rate_limit_carries_its_reset_as_an_instant() -> None:
    """resets_at is parsed once into an aware datetime, never compared as text."""
    detail = _turn_detail(
        "rate_limit", resets_at="2026-12-01T13:00:00Z", rate_limit_type="five_hour"
    )
    error = error_from_response(_answer(429, {"detail": detail}))
    assert isinstance(error, RateLimited)
    assert error.resets_at == datetime(2026, 12, 1, 13, 0, tzinfo=UTC)
    assert error.detail.rate_limit_type == "five_hour"


@pytest.mark.parametrize(
    ("status", "body", "expected"),
    [
        pytest.param(
            401, {"detail": "Unauthorized"}, Unauthorized, id="401 is the controller token"
        ),
        pytest.param(
            422,
            {"detail": [{"type": "missing", "loc": ["body", "message"], "msg": "Field required"}]},
            RequestRejected,
            id="pydantic's 422 list",
        ),
        pytest.param(429, {"detail": "Rate limited"}, RateLimited, id="a legacy 429"),
        pytest.param(503, {"detail": "Token expired"}, AuthRefused, id="a legacy 503 is auth"),
        pytest.param(402, {"detail": "No credit"}, BillingRefused, id="a legacy 402"),
        pytest.param(
            503,
            {"detail": "Claude Code is not available in this container"},
            AgentError,
            id="a container fault never switches",
        ),
        pytest.param(409, {"detail": "busy"}, Conflict, id="a 409 without a code"),
        pytest.param(500, {"unexpected": True}, AgentError, id="a body of another shape"),
    ],
)
def test_an_answer_without_a_code_maps_by_its_status(
    status: int, body: Any, expected: type[AgentError]
) -> None:
    """A server older than the codes (or a proxy) still maps to the tree."""
    error = error_from_response(_answer(status, body))
    assert type(error) is expected


def test_a_body_that_is_no_json_is_still_an_agent_error() -> None:
    """A proxy's HTML 502 maps by status, its text clipped into the message."""
    request = httpx.Request("GET", "http://agent/health")
    error = error_from_response(
        httpx.Response(502, text="<html>bad gateway</html>", request=request)
    )
    assert type(error) is AgentError
    assert "bad gateway" in error.message


def test_the_tree_has_one_root_and_its_docstring_draws_all_of_it() -> None:
    """Every class the module defines is a ControllerError, and in the module's drawing."""
    classes = [
        v
        for v in vars(errors).values()
        if isinstance(v, type) and issubclass(v, Exception) and v.__module__ == errors.__name__
    ]
    drawn = set(re.findall(r"(?:── |^    )([A-Z][A-Za-z]+)\s", errors.__doc__ or "", re.MULTILINE))
    assert drawn == {c.__name__ for c in classes}
    assert all(issubclass(c, errors.ControllerError) for c in classes)
