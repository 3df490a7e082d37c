"""The exception tree of agent-server, and nothing else.

    AgentServerError
    ├── ConfigError            a bad setting at boot: one line, exit non-zero
    └── ApiError               answered over HTTP as {"detail": {"error_code", "message"}}
        ├── TokenRequired          400 token_required
        ├── GenerationMismatch     409 generation_mismatch
        ├── PersistFailed          500 persist_failed (nothing changed in memory)
        ├── ExecutionInProgress    409 execution_in_progress
        ├── Busy                   409 busy (+ Retry-After; never 429)
        └── NotFound               404 not_found
    RequestInvalid             422 {"detail": [pydantic's errors, inputs removed]}

`app.py` maps `ApiError` to a response in one place. Turn outcomes (SPEC 7) are not
exceptions: they are `Outcome` values built by `execution.outcome`.
"""

from __future__ import annotations

from typing import ClassVar


class AgentServerError(Exception):
    """Base of every error agent-server raises on purpose."""


class ConfigError(AgentServerError):
    """A setting has a value the server cannot start with."""


class ApiError(AgentServerError):
    """An error answered over HTTP with a status and an error_code."""

    status: ClassVar[int] = 500
    error_code: ClassVar[str] = "internal_error"
    retryable: ClassVar[bool | None] = None
    """Shown in the detail when set: SPEC 7 names `busy` as retryable."""

    def __init__(self, message: str, *, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.headers = headers or {}


class TokenRequired(ApiError):
    """The reload request carried an empty token."""

    status = 400
    error_code = "token_required"


class GenerationMismatch(ApiError):
    """`expected_generation` is not the current generation."""

    status = 409
    error_code = "generation_mismatch"


class PersistFailed(ApiError):
    """The override file could not be written; memory is unchanged."""

    status = 500
    error_code = "persist_failed"


class ExecutionInProgress(ApiError):
    """A turn with this execution id is running."""

    status = 409
    error_code = "execution_in_progress"


class Busy(ApiError):
    """Every parallel slot is taken."""

    status = 409
    error_code = "busy"
    retryable = True


class NotFound(ApiError):
    """No such execution."""

    status = 404
    error_code = "not_found"


class RequestInvalid(AgentServerError):
    """The request body failed validation: 422 with pydantic's error list, no input echoed."""

    def __init__(self, errors: list[dict[str, object]]) -> None:
        super().__init__("request validation failed")
        self.errors = errors
