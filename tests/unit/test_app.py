"""create_app: the routes table it serves, its error bodies (contract §5.1), state and lifespan."""

from __future__ import annotations

import asyncio
import json
import logging
import sys
from collections.abc import Iterator
from dataclasses import fields
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from agent_server import __version__
from agent_server.app import ENDPOINTS, contract_document, create_app
from agent_server.config import Settings
from agent_server.errors import api_error_codes
from agent_server.execution.registry import BUSY_RETRY_AFTER_S
from agent_server.services import Services
from agent_server.wire.errors import TurnErrorDetail
from tests.support.in_process import BASE_URL, HEADERS, app_client, fake_cli_services, wait_until


def refusal(message: str, error_code: str) -> dict[str, object]:
    """The error body of a refusal of the server's own: never retryable, never a switch."""
    return {
        "message": message,
        "error_code": error_code,
        "retryable": False,
        "switch_credential": False,
    }


pytestmark = pytest.mark.timeout(60)

BASELINE_OAUTH = "unit-baseline-oauth-0123456789"


def _path(template: str) -> str:
    return template.replace("{execution_id}", "some-id")


def _other_method(method: str) -> str:
    return "POST" if method == "GET" else "GET"


def test_the_routes_table_is_what_the_app_serves(environ: dict[str, str]) -> None:
    """Every ENDPOINTS row is one route with its path, method and handler, and nothing else."""
    services = fake_cli_services(environ)
    app = create_app(services.settings, services)
    served = {
        (route.path, frozenset(route.methods or ()) - {"HEAD"}, route.endpoint)
        for route in app.routes
        if isinstance(route, Route)
    }
    assert len(app.routes) == len(ENDPOINTS)
    assert served == {(e.path, frozenset({e.method}), e.handler) for e in ENDPOINTS}


@pytest.mark.parametrize("endpoint", ENDPOINTS, ids=lambda e: f"{e.method} {e.path}")
def test_each_route_refuses_another_method_with_405(environ: dict[str, str], endpoint: Any) -> None:
    """The path is served, only with its method: 405 method_not_allowed and an Allow header."""
    services = fake_cli_services(environ)

    async def scenario() -> httpx.Response:
        async with app_client(services) as client:
            return await client.request(_other_method(endpoint.method), _path(endpoint.path))

    response = asyncio.run(scenario())
    assert response.status_code == 405
    assert response.json() == {"detail": refusal("Method Not Allowed", "method_not_allowed")}
    assert endpoint.method in response.headers["allow"]


def test_an_unknown_path_is_404_not_found_in_the_error_shape(environ: dict[str, str]) -> None:
    """Starlette's own 404 answers {"detail": {"message", "error_code": "not_found"}}."""
    services = fake_cli_services(environ)

    async def scenario() -> httpx.Response:
        async with app_client(services) as client:
            return await client.get("/api/no-such-route")

    response = asyncio.run(scenario())
    assert response.status_code == 404
    assert response.json() == {"detail": refusal("Not Found", "not_found")}


def _with_route(app: Starlette, path: str, raises: BaseException) -> None:
    """Add a route to `app` whose handler raises `raises` (the handlers' only way in)."""

    async def handler(request: Request) -> Response:
        raise raises

    app.router.routes.append(Route(path, handler))


def _call(services: Services, path: str, raises: BaseException) -> httpx.Response:
    """GET `path` of an app with one more route, whose handler raises `raises`."""
    app = create_app(services.settings, services)
    _with_route(app, path, raises)

    async def scenario() -> httpx.Response:
        # Starlette re-raises after its 500 answer (for the server to log): keep the answer.
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(
            transport=transport, base_url=BASE_URL, headers=HEADERS
        ) as client:
            return await client.get(path)

    return asyncio.run(scenario())


def test_any_other_http_refusal_is_http_error_with_its_status_and_headers(
    environ: dict[str, str],
) -> None:
    """An HTTPException outside 404/405 keeps its status and headers, error_code http_error."""
    services = fake_cli_services(environ)
    teapot = HTTPException(418, "short and stout", headers={"X-Pot": "tea"})
    response = _call(services, "/teapot", teapot)
    assert response.status_code == 418
    assert response.json() == {"detail": refusal("short and stout", "http_error")}
    assert response.headers["x-pot"] == "tea"


def test_an_unexpected_exception_is_500_internal_error_and_shows_nothing(
    environ: dict[str, str], caplog: pytest.LogCaptureFixture
) -> None:
    """The body is fixed: no exception text, no traceback, no secret; the log has the traceback."""
    services = fake_cli_services(environ, CLAUDE_CODE_OAUTH_TOKEN=BASELINE_OAUTH)
    crash = RuntimeError(f"crashed holding {BASELINE_OAUTH} in ZeroDivisionSentinel")
    with caplog.at_level(logging.ERROR, logger="agent_server.app"):
        response = _call(services, "/crash", crash)
    assert response.status_code == 500
    assert response.json() == {"detail": refusal("internal error", "internal_error")}
    for hidden in (BASELINE_OAUTH, "ZeroDivisionSentinel", "Traceback", "RuntimeError"):
        assert hidden not in response.text
    (record,) = [r for r in caplog.records if r.name == "agent_server.app"]
    assert record.levelno == logging.ERROR
    assert record.getMessage() == "unexpected error on GET /crash"
    assert record.exc_info is not None
    assert record.exc_info[1] is crash


@pytest.mark.parametrize(
    ("execution_id", "message"),
    [
        pytest.param(
            "plain-id", "no execution plain-id", id="an id that is no secret is quoted as is"
        ),
        pytest.param(
            BASELINE_OAUTH, "no execution [REDACTED]", id="a known credential value is masked"
        ),
        pytest.param(
            "sk-ant-api03-abcdef", "no execution [REDACTED]", id="a token shape is masked"
        ),
    ],
)
def test_an_api_error_answers_its_status_and_a_redacted_message(
    environ: dict[str, str], execution_id: str, message: str
) -> None:
    """ApiError -> the error body (not retryable, no switch), the message redacted."""
    services = fake_cli_services(environ, CLAUDE_CODE_OAUTH_TOKEN=BASELINE_OAUTH)

    async def scenario() -> httpx.Response:
        async with app_client(services) as client:
            return await client.post(f"/api/executions/{execution_id}/terminate")

    response = asyncio.run(scenario())
    assert response.status_code == 404
    assert response.json() == {
        "detail": {
            "message": message,
            "error_code": "not_found",
            "retryable": False,
            "switch_credential": False,
        }
    }


def test_a_retryable_api_error_shows_retryable_and_keeps_its_headers(
    environ: dict[str, str],
) -> None:
    """Busy (a drained registry refuses every turn): 409, the whole turn error, Retry-After."""
    services = fake_cli_services(environ)

    async def scenario() -> httpx.Response:
        await services.registry.drain(0)
        async with app_client(services) as client:
            return await client.post("/api/task", json={"message": "never runs"})

    response = asyncio.run(scenario())
    assert response.status_code == 409
    detail = response.json()["detail"]
    assert (detail["error_code"], detail["retryable"]) == ("busy", True)
    assert (detail["switch_credential"], detail["execution_id"]) == (False, None)
    assert detail["auth_route"] == "baseline"
    assert set(detail) == set(TurnErrorDetail.model_fields)
    assert response.headers["retry-after"] == str(BUSY_RETRY_AFTER_S)


def test_an_invalid_body_is_422_with_the_validation_list(environ: dict[str, str]) -> None:
    """RequestInvalid -> 422 {"detail": [{"type", "loc", "msg"}]}, not the error-object shape."""
    services = fake_cli_services(environ)

    async def scenario() -> httpx.Response:
        async with app_client(services) as client:
            return await client.post("/api/task", json={})

    response = asyncio.run(scenario())
    assert response.status_code == 422
    assert response.json() == {
        "detail": [{"type": "missing", "loc": ["body", "message"], "msg": "Field required"}]
    }


def test_app_state_carries_every_service(environ: dict[str, str]) -> None:
    """Each Services field is on app.state under its own name: the very same object."""
    services = fake_cli_services(environ)
    app = create_app(services.settings, services)
    for field in fields(Services):
        assert getattr(app.state, field.name) is getattr(services, field.name), field.name


def test_without_services_create_app_builds_its_own(environ: dict[str, str]) -> None:
    """create_app(settings) wires fresh services from those settings (token, slots)."""
    settings = Settings.from_environ(
        {
            **environ,
            "TRINITY_AGENT_AUTH_TOKEN": "unit-own-token-0001",
            "AGENT_SERVER_MAX_PARALLEL": "3",
        }
    )
    app = create_app(settings)
    assert app.state.settings is settings
    assert app.state.controller_token.get_secret_value() == "unit-own-token-0001"
    assert app.state.registry.max_parallel == 3
    assert app.state.turns.registry is app.state.registry


def test_openapi_json_serves_the_apps_own_document(environ: dict[str, str]) -> None:
    """GET /openapi.json is the app's contract: this version, every path, the error_code enum."""
    services = fake_cli_services(environ)

    async def scenario() -> tuple[httpx.Response, Any]:
        app = create_app(services.settings, services)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(
            transport=transport, base_url=BASE_URL, headers=HEADERS
        ) as client:
            return await client.get("/openapi.json"), contract_document()

    response, document = asyncio.run(scenario())
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    assert response.json() == json.loads(json.dumps(document))
    assert response.json()["info"]["version"] == __version__
    assert set(response.json()["paths"]) == {e.path for e in ENDPOINTS}
    error_detail = response.json()["components"]["schemas"]["ErrorDetail"]
    assert error_detail["properties"]["error_code"]["enum"] == api_error_codes()


@pytest.fixture
def child_watcher_kept() -> Iterator[None]:
    """The lifespan installs the pidfd child watcher process-wide (3.11): put back the old one."""
    if sys.version_info >= (3, 12):  # the lifespan leaves the watcher alone there
        yield
        return
    previous = asyncio.get_child_watcher()
    try:
        yield
    finally:
        asyncio.set_child_watcher(previous)


@pytest.mark.usefixtures("child_watcher_kept")
def test_the_lifespan_logs_the_start_and_drains_running_turns_at_shutdown(
    environ: dict[str, str], caplog: pytest.LogCaptureFixture
) -> None:
    """Startup says what it serves; shutdown kills a turn past the grace (504 killed)."""
    services = fake_cli_services(environ, AGENT_SERVER_SHUTDOWN_GRACE_S="0.2")
    app = create_app(services.settings, services)
    stop = asyncio.Event()
    said: list[str] = []

    async def receive() -> dict[str, str]:
        if not said:
            return {"type": "lifespan.startup"}
        await stop.wait()
        return {"type": "lifespan.shutdown"}

    async def send(message: Any) -> None:
        said.append(message["type"])

    async def scenario() -> tuple[httpx.Response, float]:
        lifespan = asyncio.create_task(app({"type": "lifespan"}, receive, send))
        await wait_until(lambda: "lifespan.startup.complete" in said)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(
            transport=transport, base_url=BASE_URL, headers=HEADERS
        ) as client:
            turn = asyncio.create_task(
                client.post("/api/task", json={"message": "@sleep 30", "execution_id": "late"})
            )
            await wait_until(lambda: len(services.registry) == 1)
            loop = asyncio.get_running_loop()
            started = loop.time()
            stop.set()
            await asyncio.wait_for(lifespan, 15)
            answer = await asyncio.wait_for(turn, 5)
            return answer, loop.time() - started

    with caplog.at_level(logging.INFO, logger="agent_server.app"):
        answer, shutdown_s = asyncio.run(scenario())
    assert said == ["lifespan.startup.complete", "lifespan.shutdown.complete"]
    assert "agent-server serving runtime claude-code for agent test-agent" in caplog.messages
    assert 0.2 <= shutdown_s < 10
    assert answer.status_code == 504
    assert answer.json()["detail"]["error_code"] == "killed"
    assert not services.registry.accepting
