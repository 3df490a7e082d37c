"""parse_json (contract §5.1): one place reads a body into a model; one 422 shape, no echo."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest
from pydantic import BaseModel, ConfigDict
from starlette.requests import Request

from agent_server.errors import PayloadTooLarge, RequestInvalid
from agent_server.routes.requests import MAX_BODY_BYTES, parse_json
from tests.support.in_process import fake_cli_services, request

pytestmark = pytest.mark.timeout(60)

SECRETISH = "unit-echo-canary-0123456789"


class Inner(BaseModel):
    """A strict nested model."""

    model_config = ConfigDict(extra="forbid", hide_input_in_errors=True)

    flag: bool = False


class Probe(BaseModel):
    """A strict model with defaults everywhere, so `{}` is valid."""

    model_config = ConfigDict(extra="forbid", hide_input_in_errors=True)

    count: int = 1
    name: str = "default"
    inner: Inner | None = None


def _request(*chunks: bytes) -> tuple[Request, list[int]]:
    """A POST whose body arrives in `chunks`; the list counts the chunks the app pulled."""
    pulled: list[int] = []

    async def receive() -> dict[str, Any]:
        index = len(pulled)
        pulled.append(index)
        if index >= len(chunks):
            return {"type": "http.disconnect"}
        return {
            "type": "http.request",
            "body": chunks[index],
            "more_body": index < len(chunks) - 1,
        }

    scope = {"type": "http", "method": "POST", "path": "/probe", "headers": []}
    return Request(scope, receive), pulled


def _parse(*chunks: bytes) -> Probe:
    request, _ = _request(*chunks)
    return asyncio.run(parse_json(request, Probe))


def _refusal(*chunks: bytes) -> list[dict[str, object]]:
    with pytest.raises(RequestInvalid) as refused:
        _parse(*chunks)
    return refused.value.errors


def test_an_empty_body_is_the_empty_object() -> None:
    """No body at all validates as `{}`: the model's defaults."""
    assert _parse(b"") == Probe()


def test_a_body_in_chunks_is_read_whole() -> None:
    """The body is every chunk until more_body is false."""
    assert _parse(b'{"cou', b'nt": 7, "na', b'me": "x"}') == Probe(count=7, name="x")


@pytest.mark.parametrize(
    ("body", "errors"),
    [
        pytest.param(
            b'{"count": 1, "name": "' + SECRETISH.encode(),
            [{"type": "json_invalid", "loc": ["body"]}],
            id="invalid JSON is refused at the body",
        ),
        pytest.param(
            b"[1, 2]",
            [{"type": "model_type", "loc": ["body"]}],
            id="a JSON list is not an object",
        ),
        pytest.param(
            json.dumps(SECRETISH).encode(),
            [{"type": "model_type", "loc": ["body"]}],
            id="a JSON string is not an object",
        ),
        pytest.param(
            json.dumps({"count": SECRETISH}).encode(),
            [{"type": "int_parsing", "loc": ["body", "count"]}],
            id="a wrong type names the field, not the value",
        ),
        pytest.param(
            json.dumps({SECRETISH: SECRETISH}).encode(),
            [{"type": "extra_forbidden", "loc": ["body"], "msg": "unknown field"}],
            id="an unknown field is reported at its parent without its name",
        ),
        pytest.param(
            json.dumps({"inner": {"flag": True, SECRETISH: 1}}).encode(),
            [{"type": "extra_forbidden", "loc": ["body", "inner"], "msg": "unknown field"}],
            id="an unknown nested field is reported at the nested object",
        ),
        pytest.param(
            json.dumps({"count": "x", SECRETISH: 1}).encode(),
            [
                {"type": "int_parsing", "loc": ["body", "count"]},
                {"type": "extra_forbidden", "loc": ["body"], "msg": "unknown field"},
            ],
            id="every problem is listed",
        ),
    ],
)
def test_a_refusal_is_type_loc_msg_and_never_the_input(
    body: bytes, errors: list[dict[str, object]]
) -> None:
    """Each issue has exactly type, loc and msg; nothing the client sent comes back."""
    refused = _refusal(body)
    assert len(refused) == len(errors)
    pairs = zip(refused, errors, strict=True)
    assert [{k: issue[k] for k in expected} for issue, expected in pairs] == errors
    for issue in refused:
        assert set(issue) == {"type", "loc", "msg"}
        assert isinstance(issue["msg"], str)
    assert SECRETISH not in json.dumps(refused)


def test_the_body_limit_is_4_mib() -> None:
    """A body of exactly MAX_BODY_BYTES is read; one byte more is 413 payload_too_large."""
    assert MAX_BODY_BYTES == 16 * 1024 * 1024
    padded = b'{"count": 2}'.ljust(MAX_BODY_BYTES, b" ")
    assert _parse(padded) == Probe(count=2)
    with pytest.raises(PayloadTooLarge) as refused:
        _parse(padded + b" ")
    assert (refused.value.status, refused.value.error_code) == (413, "payload_too_large")


def test_a_body_over_the_limit_is_refused_before_it_is_all_read() -> None:
    """Reading stops once the body is past the limit (64 MiB sent in 1 MiB chunks)."""
    chunk = b" " * (1024 * 1024)
    request, pulled = _request(*([chunk] * 64))
    with pytest.raises(PayloadTooLarge):
        asyncio.run(parse_json(request, Probe))
    assert len(pulled) <= MAX_BODY_BYTES // len(chunk) + 1


# --- through the app: the strict reload body and the lenient turn bodies ------------------


def _post(environ: dict[str, str], path: str, body: Any) -> httpx.Response:
    return request(fake_cli_services(environ), "POST", path, json=body)


@pytest.mark.parametrize(
    ("path", "body", "loc"),
    [
        pytest.param(
            "/api/credentials/reload-token",
            {"token": "unit-rotated-oauth-0123456789", SECRETISH: SECRETISH},
            ["body"],
            id="reload-token refuses an unknown field",
        ),
        pytest.param(
            "/api/task",
            {"message": "x", "auth_override": {"api_key": "k" * 16, SECRETISH: SECRETISH}},
            ["body", "auth_override"],
            id="a turn's auth_override refuses an unknown field",
        ),
        pytest.param(
            "/api/chat",
            {"message": "x", "auth_override": {"provider": {"base_url": "http://g", SECRETISH: 1}}},
            ["body", "auth_override", "provider"],
            id="a provider override refuses an unknown field",
        ),
    ],
)
def test_an_unknown_field_in_a_strict_model_is_422_without_its_name(
    environ: dict[str, str], path: str, body: Any, loc: list[str]
) -> None:
    """422 "unknown field" at its parent; neither the name nor the value is in the answer."""
    response = _post(environ, path, body)
    assert response.status_code == 422
    unknown = [i for i in response.json()["detail"] if i["type"] == "extra_forbidden"]
    assert unknown == [{"type": "extra_forbidden", "loc": loc, "msg": "unknown field"}]
    assert SECRETISH not in response.text


def test_a_refused_token_is_never_echoed(environ: dict[str, str]) -> None:
    """400 token_invalid says what is wrong with the token, never the token."""
    response = _post(environ, "/api/credentials/reload-token", {"token": f"has space {SECRETISH}"})
    assert response.status_code == 400
    assert response.json()["detail"]["error_code"] == "token_invalid"
    assert SECRETISH not in response.text


@pytest.mark.parametrize(
    ("path", "body"),
    [
        pytest.param(
            "/api/task",
            {"message": "x", "auth_override": {"oauth_token": f"bad\x01{SECRETISH}"}},
            id="an override secret with a control character",
        ),
        pytest.param(
            "/api/task",
            {"message": "x", "model": f"-{SECRETISH}"},
            id="a model that would read as a flag",
        ),
        pytest.param(
            "/api/task",
            {"message": "x", "timeout_seconds": SECRETISH},
            id="a timeout that is not a number",
        ),
        pytest.param(
            "/api/chat",
            {"message": "x", "execution_id": f"{SECRETISH}/.."},
            id="an execution id outside its pattern",
        ),
    ],
)
def test_a_refused_value_is_never_echoed(environ: dict[str, str], path: str, body: Any) -> None:
    """422 with a list detail; the value is not in the answer, not even in part."""
    response = _post(environ, path, body)
    assert response.status_code == 422
    assert isinstance(response.json()["detail"], list)
    assert SECRETISH not in response.text
    assert "input" not in json.dumps(response.json())


def test_a_turn_body_ignores_unknown_top_level_fields(environ: dict[str, str]) -> None:
    """The controller may send more than a turn uses: ignored at the top level, not refused."""
    response = _post(environ, "/api/task", {"message": "x", SECRETISH: SECRETISH})
    assert response.status_code == 200
    assert SECRETISH not in response.text
