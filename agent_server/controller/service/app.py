"""The service's Starlette app: its routes table, the bearer gate, and its lifespan.

    app = create_app(ServiceConfig(pool, store), token)

Every route but `GET /` (the page) and the heartbeat (its agent's own token) takes
the operator's bearer token.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

from pydantic import SecretStr
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from agent_server.controller.errors import StoreError
from agent_server.controller.service import routes as r
from agent_server.controller.service.auth import bearer_matches
from agent_server.controller.service.instance import ServiceConfig, ServiceInstance
from agent_server.controller.service.openapi import openapi_document

Handler = Callable[[Request], Awaitable[Response]]


def _guarded(handler: Handler, token: SecretStr) -> Handler:
    async def guarded(request: Request) -> Response:
        if not bearer_matches(request, token):
            raise r.Refused(401, "unauthorized", "a bearer token is required")
        return await handler(request)

    guarded.__doc__ = handler.__doc__
    return guarded


def route_table(token: SecretStr) -> list[Route]:
    """Every route: (path, handler, methods), the operator's ones behind the bearer gate."""
    document = openapi_document()

    async def openapi(_: Request) -> Response:
        return JSONResponse(document)

    operator: list[tuple[str, Handler, str]] = [
        ("/v1/openapi.json", openapi, "GET"),
        ("/v1/pool", r.get_pool, "GET"),
        ("/v1/agents/{agent}/turns", r.post_turn, "POST"),
        ("/v1/turns/{execution_id}", r.get_turn, "GET"),
        ("/v1/agents/{agent}/assign", r.assign, "POST"),
        ("/v1/agents/{agent}/stop", r.stop, "POST"),
        ("/v1/credentials/{credential}/failures", r.clear, "DELETE"),
        ("/v1/events", r.events, "GET"),
        ("/metrics", r.metrics, "GET"),
    ]
    table = [Route(path, _guarded(h, token), methods=[m]) for path, h, m in operator]
    table.append(Route("/", r.page, methods=["GET"]))
    table.append(Route("/api/agents/{name}/heartbeat", r.heartbeat, methods=["POST"]))
    return table


async def _refused(_: Request, exc: Exception) -> Response:
    if isinstance(exc, StoreError):  # the store cannot be reached: nothing was changed here
        return r.refusal(r.Refused(503, "store_unavailable", "the pool's store cannot be used"))
    assert isinstance(exc, r.Refused)  # noqa: S101 - registered for these two only
    return r.refusal(exc)


def create_app(config: ServiceConfig, token: SecretStr) -> Starlette:
    """The app of one instance; its lifespan starts and closes the instance."""
    instance = ServiceInstance(config)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await instance.start()
        try:
            yield
        finally:
            await instance.close()

    app = Starlette(
        routes=route_table(token),
        lifespan=lifespan,
        exception_handlers={r.Refused: _refused, StoreError: _refused},
    )
    app.state.instance = instance
    return app
