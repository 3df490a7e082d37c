"""The value rules the wire shares with the rest of the server: what a secret, a token,
an execution id, an argv value and a URL may be, and the strict base of request models.

Validation messages never echo a value; `routes/requests.py` strips pydantic's `input`
from every 422.
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, SecretStr, WithJsonSchema

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
TOKEN_SCHEMA = WithJsonSchema(
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
