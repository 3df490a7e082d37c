"""The error bodies (contract §5, §7): every non-2xx answer's shape, a failed turn's too."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from agent_server.wire.names import AuthRoute
from agent_server.wire.turns import TurnMetadata


class ErrorDetail(BaseModel):
    """The `detail` of every non-2xx answer but 401 and request-validation 422s."""

    model_config = ConfigDict(extra="allow")

    message: str
    error_code: str
    retryable: bool
    switch_credential: bool
    """Always false here: no refusal of the server's own is the credential's fault."""


class ErrorResponse(BaseModel):
    """`{"detail": {...}}`."""

    detail: ErrorDetail


class NoRetainedResultDetail(BaseModel):
    """The `detail` of `GET …/result`'s 404: Trinity's shape, one code field, `code`, by
    which its backend tells it from an older agent's bare 404 (contract §6.6)."""

    message: str
    code: Literal["no_retained_result"]
    retryable: bool
    switch_credential: bool


class NoRetainedResultResponse(BaseModel):
    """`{"detail": {"code": "no_retained_result", …}}`."""

    detail: NoRetainedResultDetail


class Unauthorized(BaseModel):
    """401: the controller token is missing or wrong."""

    detail: Literal["Unauthorized"]


class ValidationIssue(BaseModel):
    """One pydantic validation error, without the input that caused it."""

    type: str
    loc: list[str | int]
    msg: str


class ValidationFailed(BaseModel):
    """422 for a body that does not validate."""

    detail: list[ValidationIssue]


class TurnErrorDetail(BaseModel):
    """The contract §7 error of one turn: what happened and whether another credential helps."""

    message: str
    error_code: str
    retryable: bool
    switch_credential: bool
    execution_id: str | None
    """Null only on a refusal (`busy`, `spawn_too_large`) of a turn that named no id."""
    auth_route: AuthRoute
    api_error_status: int | None
    resets_at: str | None
    rate_limit_type: str | None
    metadata: TurnMetadata | None
    execution_log: list[Any] | None


class TurnError(BaseModel):
    """`{"detail": {...}}` of a failed turn."""

    detail: TurnErrorDetail
