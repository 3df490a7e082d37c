"""The server's own refusals (contract §5.2): each error code once, with its status.

The server raises them (`agent_server.errors`) and the controller reads them back
(`agent_server.controller.errors`); both take the code, the status and whether it is
retryable from here. A turn's own codes (contract §7) are `names.OutcomeKind`.
"""

from __future__ import annotations

from typing import NamedTuple


class Refusal(NamedTuple):
    """One refusal of the server's own: its `error_code`, its status, and whether the
    same request may simply be sent again (`retryable` in the body)."""

    code: str
    status: int
    retryable: bool = False


TOKEN_REQUIRED = Refusal("token_required", 400)
TOKEN_INVALID = Refusal("token_invalid", 400)
HTTP_ERROR = Refusal("http_error", 400)
"""Any other HTTP-level refusal (the status is the one Starlette answered)."""
NOT_FOUND = Refusal("not_found", 404)
NO_RETAINED_RESULT = Refusal("no_retained_result", 404)
"""Its body names the code `code`, Trinity's key (contract §6.6)."""
METHOD_NOT_ALLOWED = Refusal("method_not_allowed", 405)
GENERATION_MISMATCH = Refusal("generation_mismatch", 409)
EXECUTION_IN_PROGRESS = Refusal("execution_in_progress", 409)
BUSY = Refusal("busy", 409, retryable=True)
PAYLOAD_TOO_LARGE = Refusal("payload_too_large", 413)
SPAWN_TOO_LARGE = Refusal("spawn_too_large", 422)
VALIDATION_FAILED = Refusal("validation_failed", 422)
"""A body that does not validate (its answer is pydantic's list, with no code in it)."""
PERSIST_FAILED = Refusal("persist_failed", 500)
INTERNAL_ERROR = Refusal("internal_error", 500)

REFUSALS: tuple[Refusal, ...] = (
    TOKEN_REQUIRED,
    TOKEN_INVALID,
    HTTP_ERROR,
    NOT_FOUND,
    NO_RETAINED_RESULT,
    METHOD_NOT_ALLOWED,
    GENERATION_MISMATCH,
    EXECUTION_IN_PROGRESS,
    BUSY,
    PAYLOAD_TOO_LARGE,
    SPAWN_TOO_LARGE,
    VALIDATION_FAILED,
    PERSIST_FAILED,
    INTERNAL_ERROR,
)
"""Every refusal of the server's own, by status."""
