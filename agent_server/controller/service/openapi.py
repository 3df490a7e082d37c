"""The service's OpenAPI 3.1 document (hand-written; a test holds it to the routes)."""

from __future__ import annotations

from typing import Any

from agent_server.controller.service.liveness import HeartbeatBody
from agent_server.controller.service.turns import TurnRequest

_ERROR = {"$ref": "#/components/schemas/Error"}
_AUTH = {401: "no or a wrong bearer token"}


def _op(
    summary: str,
    answers: dict[int, str],
    body: str | None = None,
    media: str = "application/json",
) -> dict[str, Any]:
    """One operation: its answers (errors in the `Error` shape) and its JSON body's schema."""
    responses = {}
    for status, said in answers.items():
        schema = _ERROR if status >= 400 else {"type": "object"}
        kind = "application/json" if status >= 400 else media
        responses[str(status)] = {"description": said, "content": {kind: {"schema": schema}}}
    operation: dict[str, Any] = {"summary": summary, "responses": responses}
    if body is not None:
        schema = {"$ref": f"#/components/schemas/{body}"}
        operation["requestBody"] = {
            "required": True,
            "content": {"application/json": {"schema": schema}},
        }
    return operation


def _operator_paths() -> dict[str, dict[str, Any]]:
    """The routes behind the operator's bearer."""
    return {
        "/v1/openapi.json": {"get": _op("this document", {200: "the document", **_AUTH})},
        "/v1/pool": {"get": _op("the pool and each agent's liveness", {200: "pool", **_AUTH})},
        "/v1/agents/{agent}/turns": {
            "post": _op(
                "walk one turn (async: answer 202 at once)",
                {
                    200: "the walk's result",
                    202: "running (async)",
                    **_AUTH,
                    404: "unknown agent",
                    409: "a turn with this id runs here",
                    413: "body too large",
                    422: "invalid request",
                    502: "the agent's server cannot be reached",
                    503: "shutting down, or the store cannot be used",
                },
                "TurnRequest",
            )
        },
        "/v1/turns/{execution_id}": {
            "get": _op("an async turn", {200: "done", 202: "running", **_AUTH, 404: "unknown"})
        },
        "/v1/agents/{agent}/assign": {
            "post": _op(
                "assign a subscription by hand",
                {200: "assigned", **_AUTH, 404: "unknown", 422: "invalid"},
                "Assign",
            )
        },
        "/v1/agents/{agent}/stop": {
            "post": _op(
                "stop the agent's waits and walks", {200: "stopped", **_AUTH, 404: "unknown"}
            )
        },
        "/v1/credentials/{credential}/failures": {
            "delete": _op(
                "forget a credential's failures", {200: "cleared", **_AUTH, 404: "unknown"}
            )
        },
        "/v1/events": {
            "get": _op(
                "walk and heartbeat events", {200: "the stream", **_AUTH}, media="text/event-stream"
            )
        },
        "/metrics": {
            "get": _op("Prometheus metrics", {200: "the exposition", **_AUTH}, media="text/plain")
        },
    }


def _public_paths() -> dict[str, dict[str, Any]]:
    """The page (no token) and the heartbeat (the agent's own token)."""
    page = _op("the fleet page", {200: "the page", 404: "no page installed"}, media="text/html")
    beat = _op(
        "an agent's heartbeat (its own token as bearer)",
        {204: "kept", 401: "not the agent's token", 413: "too large", 422: "invalid"},
        "Heartbeat",
    )
    return {
        "/": {"get": {**page, "security": []}},
        "/api/agents/{name}/heartbeat": {"post": {**beat, "security": [{"agentToken": []}]}},
    }


def openapi_document() -> dict[str, Any]:
    """The document served at `GET /v1/openapi.json`."""
    schemas = {
        "TurnRequest": TurnRequest.model_json_schema(by_alias=True),
        "Heartbeat": HeartbeatBody.model_json_schema(),
        "Assign": {
            "type": "object",
            "required": ["credential"],
            "properties": {"credential": {"type": "string"}},
        },
        "Error": {
            "type": "object",
            "required": ["error", "message"],
            "properties": {"error": {"type": "string"}, "message": {"type": "string"}},
        },
    }
    bearer = {"type": "http", "scheme": "bearer"}
    return {
        "openapi": "3.1.0",
        "info": {"title": "agent-server pool serve", "version": "1"},
        "security": [{"bearer": []}],
        "paths": {**_operator_paths(), **_public_paths()},
        "components": {
            "securitySchemes": {"bearer": bearer, "agentToken": bearer},
            "schemas": schemas,
        },
    }
