"""The wire schemas (pydantic v2): what the controller sends and what it gets back.

Secrets are `SecretStr` from the moment they are parsed. Validation messages never
echo a value, and `routes/requests.py` strips pydantic's `input` from every 422.
The token rule and the execution-id pattern, which the wire shares with the rest of
the server, live here too; the wire's vocabularies are in `names`.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    WithJsonSchema,
)

from agent_server.names import AuthOverrideKind, Layer

MAX_TOKEN_BYTES = 4096
MIN_TOKEN_CHARS = 20
"""Shorter than any real Claude token (an OAuth token is over 100 characters)."""
_UNSAFE_CHARS = re.compile(r"[\s\x00-\x1f\x7f]")
_ARG_VALUE = r"^[A-Za-z0-9][A-Za-z0-9._:/@\[\]()*,+=-]{0,255}$"
"""A value that goes into argv: never empty, never starting with '-'."""
EXECUTION_ID_PATTERN = r"^[A-Za-z0-9_-]{1,128}$"


def secret_problem(value: str) -> str | None:
    """Why `value` cannot be a secret a spawn is handed, or None: not empty, no whitespace
    or control character inside, at most `MAX_TOKEN_BYTES` (contract §6.2)."""
    if not value:
        return "must not be empty"
    if _UNSAFE_CHARS.search(value):
        return "must not contain whitespace or control characters"
    if len(value.encode()) > MAX_TOKEN_BYTES:
        return f"must be at most {MAX_TOKEN_BYTES} bytes"
    return None


def token_problem(value: str) -> str | None:
    """Why `value` cannot be a subscription token, or None: the reload-token rule, which
    the override file must pass too (contract §3, §4.4). A secret of printable ASCII (as
    every token is) of at least `MIN_TOKEN_CHARS`: no placeholder such as
    `sk-ant-oat01-…`, no `hello`, is ever persisted as the credential."""
    problem = secret_problem(value)
    if problem is not None:
        return problem
    if not value.isascii():
        return "must be printable ASCII: a placeholder such as `sk-ant-oat01-…` is no token"
    if len(value) < MIN_TOKEN_CHARS:
        return f"must be at least {MIN_TOKEN_CHARS} characters: shorter than any real token"
    return None


def _check_secret(value: SecretStr) -> SecretStr:
    problem = secret_problem(value.get_secret_value())
    if problem is not None:
        raise ValueError(problem)
    return value


def exactly_one_property(schema: dict[str, Any]) -> None:
    """Document the one-of-three rule, and that a given kind is never null."""
    schema["minProperties"] = 1
    schema["maxProperties"] = 1
    for prop in schema.get("properties", {}).values():
        variants = prop.pop("anyOf", None)
        if variants:
            kept = [v for v in variants if v.get("type") != "null"]
            prop.update(kept[0] if len(kept) == 1 else {"anyOf": kept})
        prop.pop("default", None)


def check_url(value: str) -> str:
    if _UNSAFE_CHARS.search(value) or not re.match(r"^https?://[^/\s]+", value):
        msg = "must be an http:// or https:// URL without whitespace"
        raise ValueError(msg)
    return value


_SECRET_PATTERN = r"^[^\s\x00-\x1f\x7f\x85]+$"  # noqa: S105 - a regex
_SCHEMA_MAX_CHARS = MAX_TOKEN_BYTES // 4
"""The schema counts characters, validation bytes: 1024 characters always fit 4096 bytes."""
_SECRET_SCHEMA = WithJsonSchema(
    {
        "type": "string",
        "format": "password",
        "writeOnly": True,
        "minLength": 1,
        "maxLength": _SCHEMA_MAX_CHARS,
        "pattern": _SECRET_PATTERN,
    }
)
Secret = Annotated[SecretStr, AfterValidator(_check_secret), _SECRET_SCHEMA]
"""A credential: non-empty, no whitespace or control characters, at most 4096 bytes."""
_TOKEN_SCHEMA = WithJsonSchema(
    {
        "type": "string",
        "format": "password",
        "writeOnly": True,
        "minLength": MIN_TOKEN_CHARS,
        "maxLength": MAX_TOKEN_BYTES,
        "pattern": "^[!-~]+$",  # printable ASCII, no blank: the token rule (`token_problem`)
    }
)
PromptText = Annotated[str, Field(pattern=r"^[^\x00]*$")]
"""Text that goes into argv: anything but NUL, which no argv element can hold."""
ArgValue = Annotated[str, Field(pattern=_ARG_VALUE)]
ExecutionId = Annotated[str, Field(pattern=EXECUTION_ID_PATTERN)]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", hide_input_in_errors=True)


# --- credentials (contract §4) ---------------------------------------------------------


class ReloadTokenRequest(Strict):
    """`POST /api/credentials/reload-token`."""

    # The schema says what a token is; the route answers a blank one 400 token_required,
    # anything else that cannot be a token 400 token_invalid.
    token: Annotated[SecretStr, _TOKEN_SCHEMA]
    remove_api_key: bool = False
    expected_generation: int | None = None


class ReloadTokenResponse(BaseModel):
    """A reload that took effect (or was already in effect: `changed: false`)."""

    status: Literal["success"] = "success"
    reloaded: Literal[True] = True
    changed: bool
    generation: int
    fingerprint: str
    persisted: Literal[True] = True
    env_shadow: list[str]


class OverrideFileStatus(BaseModel):
    """The override file's metadata, never its content."""

    exists: bool
    mode: str | None = None
    size: int | None = None
    mtime: float | None = None
    problem: str | None = None
    """Why the file is not used (e.g. a FIFO, a symlink), or null."""


class CredentialFiles(BaseModel):
    """Where the credential inputs live."""

    env_file: str
    env_file_problem: str | None = None
    """Why `.env` counts as empty or lost lines (a FIFO, over 1 MiB, NUL bytes), or null."""
    override_file: OverrideFileStatus


class EffectiveAuth(BaseModel):
    """The credential the next spawn authenticates with."""

    variable: str
    layer: Layer
    fingerprint: str | None
    conflicts: list[str]


class DriftRow(BaseModel):
    """One name's presence across `.env`, the process env and the spawn env."""

    key: str
    in_file: bool
    in_process_env: bool
    equal: bool | None
    overridden_for_spawn: bool
    suppressed_for_spawn: bool
    spawn_source: Layer | None
    note: str | None = None
    """Why the spawn does not take the name from `.env`, when it does not (in words)."""


class CredentialStatus(BaseModel):
    """`GET /api/credentials/status`."""

    agent_name: str
    runtime: str
    generation: int
    fingerprint: str | None
    auth_mode: str
    guard_armed: bool
    files: CredentialFiles
    effective_auth: EffectiveAuth | None
    env_drift: list[DriftRow]


# --- health (contract §8) ----------------------------------------------------------------


class Capabilities(BaseModel):
    """What this server can do for the controller."""

    auth_override: list[AuthOverrideKind]
    """The `auth_override` kinds this runtime takes (none for Codex and Gemini CLI)."""
    turn_options: list[str]
    """The optional turn fields this runtime honours."""
    not_enforced: list[str] = []
    """The turn fields it takes without enforcing them; asking for any other is a 422."""
    reload_token: bool = True
    credential_status: bool = True


class Health(BaseModel):
    """`GET /health`: always 200 while serving; the body says what is wrong."""

    status: Literal["ok", "degraded"]
    problems: list[str] = []
    """Why no turn can run here (`degraded`): names of variables and files, never values."""
    agent_name: str
    runtime: str
    runtime_available: bool
    version: str
    active_executions: int
    auth: Literal["token", "insecure"]
    isolation: Literal["same_uid", "spawn_user"]
    """`spawn_user`: turns run as another user than the server (contract §10)."""
    spawn_user: str | None = None
    """That user's name, when separated."""
    capabilities: Capabilities


# --- errors (contract §5, §7) --------------------------------------------------------------


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
