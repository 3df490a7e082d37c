"""The OpenAPI 3.1 document, generated from the routes table and the pydantic models."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema
from starlette.requests import Request
from starlette.responses import Response

from agent_server.wire.errors import ErrorResponse, Unauthorized
from agent_server.wire.names import CONTROLLER_TOKEN_HEADER
from agent_server.wire.values import EXECUTION_ID_PATTERN

Handler = Callable[[Request], Awaitable[Response]]
Answer = type[BaseModel] | tuple[type[BaseModel], ...] | None
"""A response schema: one model, any of several, or a body-less/ non-JSON answer."""

_REF = "#/components/schemas/{model}"


@dataclass(frozen=True)
class Endpoint:
    """One route: where it lives, what it takes, what it answers."""

    method: str
    path: str
    handler: Handler
    summary: str
    request: type[BaseModel] | None = None
    responses: Mapping[int, Answer] = field(default_factory=dict)
    public: bool = False
    media_type: str = "application/json"


def openapi_document(
    endpoints: Sequence[Endpoint],
    *,
    title: str,
    version: str,
    error_codes: Mapping[type[BaseModel], Sequence[str]] | None = None,
) -> dict[str, Any]:
    """The OpenAPI document of `endpoints`: every route, request and response schema.

    `error_codes` names, per error-detail model, the `error_code` values it can carry:
    they become that property's `enum`, so a client knows every code in advance.
    """
    inputs = {e.request for e in endpoints if e.request is not None}
    outputs: set[type[BaseModel]] = {Unauthorized, ErrorResponse}
    for endpoint in endpoints:
        for answer in endpoint.responses.values():
            outputs.update(_models(answer))
    keyed: list[tuple[type[BaseModel], Any]] = [(m, "validation") for m in inputs]
    keyed += [(m, "serialization") for m in outputs]
    refs, definitions = models_json_schema(keyed, ref_template=_REF)
    paths: dict[str, dict[str, Any]] = {}
    for endpoint in endpoints:
        paths.setdefault(endpoint.path, {})[endpoint.method.lower()] = _operation(endpoint, refs)
    schemas = definitions.get("$defs", {})
    for model, codes in (error_codes or {}).items():
        schemas[model.__name__]["properties"]["error_code"]["enum"] = list(codes)
    return {
        "openapi": "3.1.0",
        "info": {"title": title, "version": version},
        "paths": paths,
        "components": {
            "schemas": schemas,
            "securitySchemes": {
                "controllerToken": {
                    "type": "apiKey",
                    "in": "header",
                    "name": CONTROLLER_TOKEN_HEADER,
                }
            },
        },
    }


def _operation(endpoint: Endpoint, refs: Mapping[Any, Any]) -> dict[str, Any]:
    """One route's operation object: its parameters, body, answers and security."""
    operation: dict[str, Any] = {
        "summary": endpoint.summary,
        "operationId": endpoint.handler.__name__,
        "responses": {},
    }
    if "{" in endpoint.path:
        name = endpoint.path.split("{", 1)[1].split("}", 1)[0]
        operation["parameters"] = [
            {
                "name": name,
                "in": "path",
                "required": True,
                "schema": {"type": "string", "pattern": EXECUTION_ID_PATTERN},
            }
        ]
    if endpoint.request is not None:
        schema = refs[(endpoint.request, "validation")]
        operation["requestBody"] = {
            "required": True,
            "content": {"application/json": {"schema": schema}},
        }
        # Every body is read through the one size limit (routes/requests.py).
        operation["responses"]["413"] = _response(ErrorResponse, refs, "application/json")
    for status, answer in _with_internal_error(endpoint.responses).items():
        operation["responses"][str(status)] = _response(
            answer, refs, endpoint.media_type if status < 300 else "application/json"
        )
    if not endpoint.public:
        operation["security"] = [{"controllerToken": []}]
        operation["responses"]["401"] = _response(Unauthorized, refs, "application/json")
    return operation


def _with_internal_error(responses: Mapping[int, Answer]) -> dict[int, Answer]:
    """`responses` plus the app's catch-all `500 internal_error`, which any route can answer."""
    merged = dict(responses)
    declared = _models(merged.get(500))
    if ErrorResponse not in declared:
        merged[500] = (*declared, ErrorResponse) if declared else ErrorResponse
    return merged


def _models(answer: Answer) -> tuple[type[BaseModel], ...]:
    if answer is None:
        return ()
    return answer if isinstance(answer, tuple) else (answer,)


def _response(answer: Answer, refs: Mapping[Any, Any], media_type: str) -> dict[str, Any]:
    models = _models(answer)
    if not models:
        kind = "object" if media_type == "application/json" else "string"
        return {"description": "", "content": {media_type: {"schema": {"type": kind}}}}
    schemas = [refs[(m, "serialization")] for m in models]
    schema = schemas[0] if len(schemas) == 1 else {"anyOf": schemas}
    description = (models[0].__doc__ or "").strip().splitlines()[0] if models[0].__doc__ else ""
    return {"description": description, "content": {media_type: {"schema": schema}}}
