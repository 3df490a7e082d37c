"""GET /openapi.json (contract §5): behind the token, a valid OpenAPI 3.1 document."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import jsonschema_rs
import pytest
from pydantic import BaseModel
from schemathesis.specs.openapi.definitions import OPENAPI_31_VALIDATOR

from agent_server.app import ENDPOINTS, ERROR_CODES_BY_MODEL, create_app
from agent_server.config import Settings
from agent_server.openapi import Answer, openapi_document
from agent_server.services import Services
from agent_server.wire.turns import ParallelTaskRequest

TOKEN = "unit-controller-token-0123456789"
REF = "#/components/schemas/"


@pytest.fixture(scope="module")
def document() -> dict[str, Any]:
    """The document the app serves."""
    return openapi_document(
        ENDPOINTS, title="agent-server", version="test", error_codes=ERROR_CODES_BY_MODEL
    )


def _get(environ: dict[str, str], headers: dict[str, str]) -> httpx.Response:
    settings = Settings.from_environ({**environ, "TRINITY_AGENT_AUTH_TOKEN": TOKEN})
    app = create_app(settings, Services.build(settings))

    async def fetch() -> httpx.Response:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://agent.test") as client:
            return await client.get("/openapi.json", headers=headers)

    return asyncio.run(fetch())


def test_the_document_needs_the_controller_token(environ: dict[str, str]) -> None:
    """Without the token: 401 Unauthorized; with it: the document."""
    denied = _get(environ, {})
    assert (denied.status_code, denied.json()) == (401, {"detail": "Unauthorized"})
    served = _get(environ, {"X-Trinity-Agent-Token": TOKEN})
    assert served.status_code == 200
    assert served.json()["openapi"] == "3.1.0"
    assert set(served.json()["paths"]) == {e.path for e in ENDPOINTS}


def test_the_document_is_valid_openapi_3_1(document: dict[str, Any]) -> None:
    """The OAS 3.1 metaschema accepts it, and every component is valid JSON Schema 2020-12."""
    OPENAPI_31_VALIDATOR.validate(document)
    for name, schema in document["components"]["schemas"].items():
        assert jsonschema_rs.meta.is_valid(schema), name


def _refs(answer: Answer) -> list[str]:
    if answer is None:
        return []
    models: tuple[type[BaseModel], ...] = answer if isinstance(answer, tuple) else (answer,)
    return [REF + m.__name__ for m in models]


def _schema_refs(schema: dict[str, Any]) -> list[str]:
    return [s["$ref"] for s in schema.get("anyOf", [schema]) if "$ref" in s]


@pytest.mark.parametrize("endpoint", ENDPOINTS, ids=lambda e: f"{e.method} {e.path}")
def test_every_route_has_its_request_and_response_schemas(
    document: dict[str, Any], endpoint: Any
) -> None:
    """Each ENDPOINTS row is an operation with its request body, responses and security."""
    operation = document["paths"][endpoint.path][endpoint.method.lower()]
    if endpoint.request is None:
        assert "requestBody" not in operation
    else:
        body = operation["requestBody"]["content"]["application/json"]["schema"]
        assert body == {"$ref": REF + endpoint.request.__name__}
    for status, answer in endpoint.responses.items():
        content = operation["responses"][str(status)]["content"]
        (media_type,) = content
        expected = _refs(answer)
        if status == 500 and REF + "ErrorResponse" not in expected:
            expected.append(REF + "ErrorResponse")
        assert _schema_refs(content[media_type]["schema"]) == expected
    # Every route can meet the app's catch-all handler: 500 internal_error.
    internal = operation["responses"]["500"]["content"]["application/json"]["schema"]
    assert REF + "ErrorResponse" in _schema_refs(internal)
    if endpoint.public:
        assert "security" not in operation
        assert "401" not in operation["responses"]
    else:
        assert operation["security"] == [{"controllerToken": []}]
        unauthorized = operation["responses"]["401"]["content"]["application/json"]["schema"]
        assert unauthorized == {"$ref": REF + "Unauthorized"}
    for name in [p for p in endpoint.path.split("/") if p.startswith("{")]:
        (parameter,) = operation["parameters"]
        assert (parameter["name"], parameter["in"]) == (name.strip("{}"), "path")


def test_every_referenced_schema_is_defined(document: dict[str, Any]) -> None:
    """No $ref in the document points at a component that is not there."""
    defined = set(document["components"]["schemas"])

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str):
                assert ref.removeprefix(REF) in defined, ref
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(document)


def _secret_schemas(schema: dict[str, Any]) -> dict[str, Any]:
    """The non-null branch of each property (pydantic writes `X | None` as anyOf)."""
    found = {}
    for name, prop in schema["properties"].items():
        branches = [b for b in prop.get("anyOf", [prop]) if b.get("type") != "null"]
        found[name] = branches[0]
    return found


@pytest.mark.parametrize(
    ("model", "field"),
    [
        ("ReloadTokenRequest", "token"),
        ("AuthOverride", "oauth_token"),
        ("AuthOverride", "api_key"),
        ("ProviderOverride", "auth_token"),
    ],
)
def test_secret_fields_are_write_only_passwords(
    document: dict[str, Any], model: str, field: str
) -> None:
    """Every SecretStr field is `format: password` and `writeOnly`: a client never reads one."""
    schema = _secret_schemas(document["components"]["schemas"][model])[field]
    assert schema["type"] == "string"
    assert schema["format"] == "password"
    assert schema["writeOnly"] is True


def test_no_response_schema_carries_a_secret_field(document: dict[str, Any]) -> None:
    """No schema that a response can reach holds a password field."""
    schemas = document["components"]["schemas"]
    inputs = {e.request.__name__ for e in ENDPOINTS if e.request is not None}
    inputs |= {"AuthOverride", "ProviderOverride"}
    for name, schema in schemas.items():
        if name not in inputs:
            assert '"format": "password"' not in json.dumps(schema), name


def test_task_bounds_are_in_the_contract(document: dict[str, Any]) -> None:
    """The task's documented bounds are the model's: timeout 1..86400, execution_id pattern."""
    task = document["components"]["schemas"][ParallelTaskRequest.__name__]["properties"]
    assert (task["timeout_seconds"]["minimum"], task["timeout_seconds"]["maximum"]) == (1, 86400)
    execution_id = next(b for b in task["execution_id"]["anyOf"] if b.get("type") == "string")
    assert execution_id["pattern"] == "^[A-Za-z0-9_-]{1,128}$"
