"""The controller library's one exception tree, and the one place an answer becomes one.

    ControllerError               anything this library raises
    ├── PoolFileError             the pool file is not one this library can use
    ├── StoreError                a store URL it does not know, or a store that failed
    ├── UnknownAgent              the walker has no client for the agent a turn names
    ├── TransportError            no HTTP answer: refused, reset, closed, timed out
    ├── ProtocolError             a 2xx answer that is not the contract's JSON
    └── AgentError                a non-2xx answer: `status`, `error_code`, `message`,
        │                         `retryable`, `switch_credential`, `auth_override`
        ├── Unauthorized          401: the controller token is wrong
        ├── RequestRejected       the request itself was refused (422, 413, 405, 400)
        ├── NotFound              404: no such execution, route or retained result
        ├── Conflict              409
        │   ├── GenerationMismatch    reload-token's expected_generation is stale
        │   ├── ExecutionInProgress   this execution id is running
        │   └── Busy                  every turn slot is taken (retryable)
        └── TurnFailed            a turn ran and failed (contract §7): `detail`, `resets_at`
            └── CredentialRefused     another credential may serve (`switch_credential`)
                ├── RateLimited       429 rate_limit: `resets_at`, `rate_limit_type`
                ├── BillingRefused    402 billing
                └── AuthRefused       503 auth

`error_from_response` is the only function that reads a non-2xx answer. The client
never retries: the walk is the only retry loop, and it reads these classes.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
from pydantic import ValidationError

from agent_server.wire import codes
from agent_server.wire.errors import TurnErrorDetail
from agent_server.wire.instants import parse_instant
from agent_server.wire.messages import is_container_fault
from agent_server.wire.names import AUTH_OVERRIDE_HEADER, OutcomeKind


class ControllerError(Exception):
    """Anything the controller library raises."""


class PoolFileError(ControllerError):
    """The pool file cannot be used (the message names the entry and the key, no secret)."""


class StoreError(ControllerError):
    """A store URL this library does not know, or a store that failed."""


class UnknownAgent(ControllerError):
    """The walker was given no client for this agent."""


class TransportError(ControllerError):
    """The server gave no HTTP answer (connection refused, reset or closed; a timeout)."""


class ProtocolError(ControllerError):
    """A 2xx answer that is not the contract's JSON."""


class AgentError(ControllerError):
    """The server answered outside 2xx; what it said, as the contract spells it."""

    def __init__(
        self,
        status: int,
        error_code: str,
        message: str,
        *,
        retryable: bool = False,
        switch_credential: bool = False,
        auth_override: str | None = None,
        body: Any = None,
    ) -> None:
        super().__init__(f"{status} {error_code}: {message}")
        self.status = status
        self.error_code = error_code
        self.message = message
        self.retryable = retryable
        self.switch_credential = switch_credential
        self.auth_override = auth_override
        """The override the server applied (`X-Trinity-Auth-Override`), or None."""
        self.body = body


class Unauthorized(AgentError):
    """401: the controller token is missing or wrong."""


class RequestRejected(AgentError):
    """The request was refused as it stands: a 422 (validation, `spawn_too_large`), a
    413, a 405 or a 400 such as `token_required`."""


class NotFound(AgentError):
    """404: no such execution or route, or no retained result."""


class Conflict(AgentError):
    """409: the server's state does not allow it now."""


class GenerationMismatch(Conflict):
    """reload-token's `expected_generation` is stale: someone else changed the credential."""


class ExecutionInProgress(Conflict):
    """A turn with this execution id is running."""


class Busy(Conflict):
    """Every turn slot is taken; retryable (`Retry-After: 5`)."""


class TurnFailed(AgentError):
    """A turn ran and failed: the §7 error body, with `resets_at` as an instant."""

    def __init__(self, detail: TurnErrorDetail, status: int, **fields: Any) -> None:
        super().__init__(
            status,
            detail.error_code,
            detail.message,
            retryable=detail.retryable,
            switch_credential=detail.switch_credential,
            **fields,
        )
        self.detail = detail
        self.resets_at = parse_instant(detail.resets_at)


class CredentialRefused(TurnFailed):
    """The credential was refused: another one may serve the same turn."""


class RateLimited(CredentialRefused):
    """429 `rate_limit`: the credential's window is full until `resets_at` (when known)."""


class BillingRefused(CredentialRefused):
    """402 `billing`: the account behind the credential cannot pay."""


class AuthRefused(CredentialRefused):
    """503 `auth`: the credential does not authenticate."""


_BY_CODE: dict[str, type[AgentError]] = {
    codes.TOKEN_REQUIRED.code: RequestRejected,
    codes.TOKEN_INVALID.code: RequestRejected,
    codes.PAYLOAD_TOO_LARGE.code: RequestRejected,
    codes.SPAWN_TOO_LARGE.code: RequestRejected,
    codes.METHOD_NOT_ALLOWED.code: RequestRejected,
    codes.HTTP_ERROR.code: RequestRejected,
    codes.VALIDATION_FAILED.code: RequestRejected,
    codes.NOT_FOUND.code: NotFound,
    codes.NO_RETAINED_RESULT.code: NotFound,
    codes.GENERATION_MISMATCH.code: GenerationMismatch,
    codes.EXECUTION_IN_PROGRESS.code: ExecutionInProgress,
    codes.BUSY.code: Busy,
    codes.PERSIST_FAILED.code: AgentError,
    codes.INTERNAL_ERROR.code: AgentError,
}
"""The server's own refusals (contract §5.2) by code; a turn's codes are `_TURN_CODES`."""
_TURN_CODES: dict[str, type[TurnFailed]] = {
    kind.value: TurnFailed
    for kind in OutcomeKind
    if kind not in (OutcomeKind.SUCCESS, OutcomeKind.CANCELLED)
} | {
    OutcomeKind.RATE_LIMIT.value: RateLimited,
    OutcomeKind.BILLING.value: BillingRefused,
    OutcomeKind.AUTH.value: AuthRefused,
}
_BY_STATUS: dict[int, tuple[str, type[AgentError]]] = {
    400: (codes.HTTP_ERROR.code, RequestRejected),
    404: (codes.NOT_FOUND.code, NotFound),
    405: (codes.METHOD_NOT_ALLOWED.code, RequestRejected),
    409: (codes.HTTP_ERROR.code, Conflict),
    413: (codes.PAYLOAD_TOO_LARGE.code, RequestRejected),
    422: (codes.VALIDATION_FAILED.code, RequestRejected),
}
"""What an answer without a usable `error_code` is, by its status alone."""
_LEGACY_SWITCH: dict[int, str] = {429: "rate_limit", 402: "billing", 503: "auth", 403: "auth"}
"""A server older than the contract's codes: the statuses Trinity reads as a switch."""


def error_from_response(response: httpx.Response) -> AgentError:
    """The one mapping from a non-2xx answer to the exception tree (reads the body)."""
    status = response.status_code
    applied = response.headers.get(AUTH_OVERRIDE_HEADER)
    body = _json(response)
    detail = body.get("detail") if isinstance(body, dict) else None
    if status == 401:
        return Unauthorized(status, "unauthorized", "Unauthorized", auth_override=applied)
    # Every error body names its code `error_code`, but for the result route's 404, which
    # is Trinity's shape and names it `code` (contract §6.6).
    named = detail.get("error_code", detail.get("code")) if isinstance(detail, dict) else None
    if isinstance(detail, dict) and isinstance(named, str):
        code = named
        if code in _TURN_CODES and "execution_log" in detail:
            try:
                parsed = TurnErrorDetail.model_validate(detail)
            except ValidationError:
                pass
            else:
                return _TURN_CODES[code](parsed, status, auth_override=applied, body=body)
        kind = _BY_CODE.get(code) or _BY_STATUS.get(status, ("", AgentError))[1]
        return kind(
            status,
            code,
            str(detail.get("message", "")),
            retryable=detail.get("retryable") is True,
            switch_credential=detail.get("switch_credential") is True,
            auth_override=applied,
            body=body,
        )
    return _without_code(status, detail, applied, body)


def _without_code(status: int, detail: object, applied: str | None, body: Any) -> AgentError:
    """An answer with no `error_code`: pydantic's 422 list, or a server that predates it."""
    message = detail if isinstance(detail, str) else json.dumps(detail)[:500]
    switch = _LEGACY_SWITCH.get(status)
    if switch is not None and not is_container_fault(message):
        turn = TurnErrorDetail(
            message=message,
            error_code=switch,
            retryable=False,
            switch_credential=True,
            execution_id=None,
            auth_route="baseline",
            api_error_status=None,
            resets_at=None,
            rate_limit_type=None,
            metadata=None,
            execution_log=None,
        )
        return _TURN_CODES[switch](turn, status, auth_override=applied, body=body)
    code, kind = _BY_STATUS.get(status, (codes.HTTP_ERROR.code, AgentError))
    return kind(status, code, message, auth_override=applied, body=body)


def _json(response: httpx.Response) -> Any:
    try:
        return response.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        return {"detail": response.text[:500]}
