"""Reading a request body into a wire model: one place, one 413, one 422 shape.

The size limit holds while reading: a declared Content-Length over it is refused
before a byte of the body is read, and a body sent without one is refused as soon
as the bytes read pass it. Nothing past the limit is ever buffered.
"""

from __future__ import annotations

from typing import TypeVar

from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails
from starlette.requests import Request

from agent_server.errors import PayloadTooLarge, RequestInvalid

Model = TypeVar("Model", bound=BaseModel)
MAX_BODY_BYTES = 16 * 1024 * 1024
"""Room for a turn's images (10 MiB decoded, 13.4 MiB in base64) and its prompt."""


async def parse_json(request: Request, model: type[Model]) -> Model:
    """Validate the JSON body as `model`, or raise RequestInvalid (never echoing input)."""
    body = await read_body(request)
    try:
        return model.model_validate_json(body or b"{}")
    except ValidationError as exc:
        raise RequestInvalid([_issue(e) for e in exc.errors(include_url=False)]) from None


async def read_body(request: Request, limit: int = MAX_BODY_BYTES) -> bytes:
    """The whole body, or PayloadTooLarge once it is known to pass `limit` bytes."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise PayloadTooLarge(_too_large(limit))
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise PayloadTooLarge(_too_large(limit))
        chunks.append(chunk)
    return b"".join(chunks)


def _too_large(limit: int) -> str:
    return f"the request body is over {limit} bytes"


def _issue(error: ErrorDetails) -> dict[str, object]:
    """One error without its input; an unknown key's name is input too, so it goes."""
    if error["type"] == "extra_forbidden":
        return {"type": error["type"], "loc": ["body", *error["loc"][:-1]], "msg": "unknown field"}
    return {"type": error["type"], "loc": ["body", *error["loc"]], "msg": error["msg"]}
