"""Reading a request body into a wire model: one place, one 422 shape."""

from __future__ import annotations

from typing import TypeVar

from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails
from starlette.requests import Request

from agent_server.errors import RequestInvalid

Model = TypeVar("Model", bound=BaseModel)
MAX_BODY_BYTES = 4 * 1024 * 1024


async def parse_json(request: Request, model: type[Model]) -> Model:
    """Validate the JSON body as `model`, or raise RequestInvalid (never echoing input)."""
    body = await request.body()
    if len(body) > MAX_BODY_BYTES:
        errors: list[dict[str, object]] = [
            {"type": "too_long", "loc": ["body"], "msg": "request body is too large"}
        ]
        raise RequestInvalid(errors)
    try:
        return model.model_validate_json(body or b"{}")
    except ValidationError as exc:
        raise RequestInvalid([_issue(e) for e in exc.errors(include_url=False)]) from None


def _issue(error: ErrorDetails) -> dict[str, object]:
    """One error without its input; an unknown key's name is input too, so it goes."""
    if error["type"] == "extra_forbidden":
        return {"type": error["type"], "loc": ["body", *error["loc"][:-1]], "msg": "unknown field"}
    return {"type": error["type"], "loc": ["body", *error["loc"]], "msg": error["msg"]}
