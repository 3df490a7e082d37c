"""The exception tree of agent-server, and nothing else.

    AgentServerError
    ├── ConfigError            a bad setting at boot: one line, exit non-zero
    └── ApiError               answered over HTTP as {"detail": {"error_code", "message"}}
        ├── TokenRequired          400 token_required
        ├── TokenInvalid           400 token_invalid
        ├── GenerationMismatch     409 generation_mismatch
        ├── PersistFailed          500 persist_failed (nothing changed in memory)
        ├── ExecutionInProgress    409 execution_in_progress
        ├── Busy                   409 busy (+ Retry-After; never 429)
        ├── NotFound               404 not_found
        ├── NoRetainedResult       404, its code as `code` (Trinity's key)
        ├── PayloadTooLarge        413 payload_too_large (refused while reading)
        └── SpawnTooLarge          422 spawn_too_large (argv + env over the kernel's limit)
    RequestInvalid             422 {"detail": [pydantic's errors, inputs removed]}

`app.py` maps `ApiError` to a response in one place, and an HTTP-level refusal
(Starlette's `HTTPException`) by `HTTP_ERROR_CODES`. Turn outcomes (contract §7) are
not exceptions: they are `Outcome` values built by `outcome.classify`.
"""

from __future__ import annotations

from typing import ClassVar

from agent_server.wire import codes


class AgentServerError(Exception):
    """Base of every error agent-server raises on purpose."""


class ConfigError(AgentServerError):
    """A setting has a value the server cannot start with."""


class ApiError(AgentServerError):
    """An error answered over HTTP with a status and an error_code."""

    status: ClassVar[int] = codes.INTERNAL_ERROR.status
    error_code: ClassVar[str] = codes.INTERNAL_ERROR.code
    retryable: ClassVar[bool] = False
    """Contract §7 names `busy` as retryable."""

    def __init__(self, message: str, *, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.headers = headers or {}
        self.detail: dict[str, object] = {}
        """More of the answer's `detail` (a turn's refusal carries the whole §7 body)."""

    def body(self) -> dict[str, object]:
        """The answer's `detail`: no refusal of the server's own is the credential's fault."""
        return {
            "message": self.message,
            "error_code": self.error_code,
            "retryable": self.retryable,
            "switch_credential": False,
            **self.detail,
        }


class TokenRequired(ApiError):
    """The reload request carried an empty token."""

    status = codes.TOKEN_REQUIRED.status
    error_code = codes.TOKEN_REQUIRED.code


class TokenInvalid(ApiError):
    """The reload request's token cannot be a credential (contract §4.4)."""

    status = codes.TOKEN_INVALID.status
    error_code = codes.TOKEN_INVALID.code


class GenerationMismatch(ApiError):
    """`expected_generation` is not the current generation."""

    status = codes.GENERATION_MISMATCH.status
    error_code = codes.GENERATION_MISMATCH.code


class PersistFailed(ApiError):
    """The override file could not be written; memory is unchanged."""

    status = codes.PERSIST_FAILED.status
    error_code = codes.PERSIST_FAILED.code


class ExecutionInProgress(ApiError):
    """A turn with this execution id is running."""

    status = codes.EXECUTION_IN_PROGRESS.status
    error_code = codes.EXECUTION_IN_PROGRESS.code


class Busy(ApiError):
    """Every parallel slot is taken."""

    status = codes.BUSY.status
    error_code = codes.BUSY.code
    retryable = codes.BUSY.retryable


class NotFound(ApiError):
    """No such execution."""

    status = codes.NOT_FOUND.status
    error_code = codes.NOT_FOUND.code


class NoRetainedResult(ApiError):
    """No retained result for this execution id (unknown, expired, running, or never
    finished). Its one code field is `code`, the key Trinity's backend tells it by from
    an older agent's bare 404 (contract §6.6)."""

    status = codes.NO_RETAINED_RESULT.status
    error_code = codes.NO_RETAINED_RESULT.code

    def body(self) -> dict[str, object]:
        """`{"message", "code", "retryable", "switch_credential"}`."""
        detail = super().body()
        detail["code"] = detail.pop("error_code")
        return detail


class PayloadTooLarge(ApiError):
    """The request body is over the limit (refused before it is read past it)."""

    status = codes.PAYLOAD_TOO_LARGE.status
    error_code = codes.PAYLOAD_TOO_LARGE.code


class SpawnTooLarge(ApiError):
    """The spawn's argv and environment would not fit the kernel's exec limits."""

    status = codes.SPAWN_TOO_LARGE.status
    error_code = codes.SPAWN_TOO_LARGE.code


class RequestInvalid(AgentServerError):
    """The request body failed validation: 422 with pydantic's error list, no input echoed."""

    def __init__(self, errors: list[dict[str, object]]) -> None:
        super().__init__("request validation failed")
        self.errors = errors


HTTP_ERROR_CODES = {404: codes.NOT_FOUND.code, 405: codes.METHOD_NOT_ALLOWED.code}
"""The error_code of an HTTP-level refusal (no such route, wrong method)."""
OTHER_HTTP_ERROR = codes.HTTP_ERROR.code
"""The error_code of any other HTTP-level refusal."""


def api_error_codes() -> list[str]:
    """Every error_code a non-turn error body can carry, sorted (for the OpenAPI enum)."""
    codes = {ApiError.error_code, OTHER_HTTP_ERROR, *HTTP_ERROR_CODES.values()}
    pending: list[type[ApiError]] = [ApiError]
    while pending:
        for subclass in pending.pop().__subclasses__():
            codes.add(subclass.error_code)
            pending.append(subclass)
    return sorted(codes)
