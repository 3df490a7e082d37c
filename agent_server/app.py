"""`create_app(settings)`: the routes table, middleware, error mapping and lifespan."""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import fields
from typing import Any

from pydantic import BaseModel
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Route

from agent_server import __version__
from agent_server.auth import ControllerAuth
from agent_server.config import Settings
from agent_server.errors import (
    HTTP_ERROR_CODES,
    OTHER_HTTP_ERROR,
    ApiError,
    RequestInvalid,
    api_error_codes,
)
from agent_server.openapi import Answer, Endpoint, openapi_document
from agent_server.outcome.classify import ERROR_CODES, ERROR_STATUSES
from agent_server.process.group import Containment, use_pidfd_child_watcher
from agent_server.process.timings import RECORDS_AT_EXIT_S
from agent_server.records.heartbeat import Heartbeat, RunningTurn, heartbeat_url
from agent_server.routes import credentials, executions, health, progress
from agent_server.routes.respond import answer
from agent_server.services import Services
from agent_server.wire.credentials import CredentialStatus, ReloadTokenRequest, ReloadTokenResponse
from agent_server.wire.errors import (
    ErrorDetail,
    ErrorResponse,
    NoRetainedResultResponse,
    TurnError,
    TurnErrorDetail,
    ValidationFailed,
)
from agent_server.wire.health import Health
from agent_server.wire.results import LiveEvent, RetainedResult
from agent_server.wire.turns import (
    AsyncAccepted,
    ChatRequest,
    ParallelTaskRequest,
    RunningExecutions,
    TerminateResponse,
    TurnResponse,
)

logger = logging.getLogger("agent_server.app")

_TURN_ANSWERS: dict[int, Answer] = {
    200: TurnResponse,
    409: ErrorResponse,
    422: ValidationFailed,
}
# Every status of the outcome table answers a turn error (422 also a validation error).
for _status in sorted(ERROR_STATUSES):
    _TURN_ANSWERS[_status] = (ValidationFailed, TurnError) if _status == 422 else TurnError


async def _openapi(request: Request) -> Response:
    """The contract of this server (OpenAPI 3.1), generated from the pydantic models."""
    return answer(request, contract_document())


ENDPOINTS = (
    Endpoint("GET", "/health", health.health, "Liveness and readiness", None, {200: Health}, True),
    Endpoint(
        "GET",
        "/metrics",
        health.metrics,
        "Prometheus metrics",
        None,
        {200: None},
        public=True,
        media_type="text/plain",
    ),
    Endpoint(
        "POST",
        "/api/credentials/reload-token",
        credentials.reload_token,
        "Rotate the subscription OAuth token for every next spawn",
        ReloadTokenRequest,
        {
            200: ReloadTokenResponse,
            400: ErrorResponse,
            409: ErrorResponse,
            422: ValidationFailed,
            500: ErrorResponse,
        },
    ),
    Endpoint(
        "GET",
        "/api/credentials/status",
        credentials.status,
        "Which credential the next spawn uses, and the .env drift",
        None,
        {200: CredentialStatus},
    ),
    Endpoint(
        "POST",
        "/api/task",
        executions.task,
        "Run one turn (202 with async_result: its result comes by callback)",
        ParallelTaskRequest,
        {202: AsyncAccepted, **_TURN_ANSWERS},
    ),
    Endpoint(
        "POST",
        "/api/chat",
        executions.chat,
        "One turn of the agent's chat",
        ChatRequest,
        _TURN_ANSWERS,
    ),
    Endpoint(
        "GET",
        "/api/executions/running",
        executions.running,
        "Turns in flight",
        None,
        {200: RunningExecutions},
    ),
    Endpoint(
        "POST",
        "/api/executions/{execution_id}/terminate",
        executions.terminate,
        "Kill a running turn's process group",
        None,
        {200: TerminateResponse, 404: ErrorResponse},
    ),
    Endpoint(
        "GET",
        "/api/executions/{execution_id}/result",
        executions.result,
        "A finished turn's retained result",
        None,
        {200: RetainedResult, 404: NoRetainedResultResponse},
    ),
    Endpoint(
        "GET",
        "/api/executions/{execution_id}/events",
        progress.events,
        "A turn's live events (server-sent events, named by type)",
        None,
        {200: LiveEvent, 404: ErrorResponse},
        media_type="text/event-stream",
    ),
    Endpoint(
        "GET",
        "/api/executions/{execution_id}/stream",
        progress.stream,
        "A turn's live events as Trinity's agent streams them (unnamed, then stream_end)",
        None,
        {200: LiveEvent, 404: ErrorResponse},
        media_type="text/event-stream",
    ),
    Endpoint("GET", "/openapi.json", _openapi, "This contract, as OpenAPI 3.1", None, {200: None}),
)
"""Every route with its schemas: the routes table and the contract."""
ERROR_CODES_BY_MODEL: dict[type[BaseModel], Sequence[str]] = {
    ErrorDetail: api_error_codes(),
    TurnErrorDetail: ERROR_CODES,
}
"""The error_code values each error body can carry (the OpenAPI enums)."""


@functools.cache
def contract_document() -> dict[str, Any]:
    """/openapi.json: made at its first request, not at boot (a server that never serves
    it keeps the time and the memory)."""
    return openapi_document(
        ENDPOINTS, title="agent-server", version=__version__, error_codes=ERROR_CODES_BY_MODEL
    )


def create_app(settings: Settings, services: Services | None = None) -> Starlette:
    """Build the ASGI app for `settings` (services are built here unless given)."""
    services = services or Services.build(settings)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        # Adopt orphaned grandchildren of the CLI so the runner can reap them even
        # when PID 1 of the container does not (no tini, server not exec'd).
        use_pidfd_child_watcher()
        services.reaper.install(asyncio.get_running_loop())
        _announce_containment(services.reaper.containment)
        logger.info(
            "agent-server serving runtime %s for agent %s", settings.runtime, settings.agent_name
        )
        # Before serving, blocking work is the loop's: nothing waits on it yet, and a
        # worker thread made now would stay, and cost the idle server its memory arena.
        services.results.sweep()
        if services.results.callbacks is not None:
            services.results.callbacks.sweep_later()
        services.readiness.check_at_boot()
        if services.broker is not None:
            await services.broker.start()
        heartbeat = _heartbeat(settings, services)
        if heartbeat is not None:
            heartbeat.start()
        yield
        if heartbeat is not None:
            await heartbeat.stop()
        await services.registry.drain(settings.shutdown_grace_s)
        if services.broker is not None:
            await services.broker.stop()
        # Turns have answered; their results are being retained and sent (kept if not).
        await services.results.close(RECORDS_AT_EXIT_S)
        services.spawn_files.close()
        services.reaper.uninstall(asyncio.get_running_loop())

    routes = [Route(e.path, e.handler, methods=[e.method]) for e in ENDPOINTS]
    app = Starlette(
        routes=routes,
        lifespan=lifespan,
        exception_handlers={
            ApiError: _api_error,
            RequestInvalid: _request_invalid,
            HTTPException: _http_error,
            ClientDisconnect: _client_left,
            Exception: _unexpected,
        },
    )
    # Each route takes its collaborators from app.state by name (Starlette's idiom).
    for field in fields(services):
        setattr(app.state, field.name, getattr(services, field.name))
    app.add_middleware(ControllerAuth, token=services.controller_token)
    return app


async def _api_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ApiError)  # noqa: S101 - registered for ApiError only
    # A message may quote what the client sent (an execution id): `answer` redacts it.
    detail = exc.body()
    return answer(request, {"detail": detail}, status_code=exc.status, headers=exc.headers)


async def _request_invalid(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, RequestInvalid)  # noqa: S101 - registered for RequestInvalid only
    return answer(request, {"detail": exc.errors}, status_code=422)


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)  # noqa: S101 - registered for HTTPException only
    code = HTTP_ERROR_CODES.get(exc.status_code, OTHER_HTTP_ERROR)
    return answer(
        request,
        {
            "detail": {
                "message": str(exc.detail),
                "error_code": code,
                "retryable": False,
                "switch_credential": False,
            }
        },
        status_code=exc.status_code,
        headers=exc.headers,
    )


async def _client_left(request: Request, exc: Exception) -> Response:
    # The client went (or was closed for sending its body too slowly, contract §8) before
    # its body was read: nobody is left to answer, and nothing went wrong here.
    logger.debug("client left during its body: %s %s", request.method, request.url.path)
    return Response(status_code=400)


async def _unexpected(request: Request, exc: Exception) -> Response:
    logger.exception("unexpected error on %s %s", request.method, request.url.path)
    return answer(request, {"detail": ApiError("internal error").body()}, status_code=500)


def _announce_containment(containment: Containment) -> None:
    """Say at boot what ends a turn's processes (contract §10; `/health` says it too)."""
    if containment == "subreaper_sweep":
        logger.info(
            "containment: subreaper_sweep: a turn's process group is killed at its end, "
            "and every process that left the group is this server's to sweep"
        )
    else:
        logger.warning(
            "containment: process_group: the kernel refused the child subreaper, so a "
            "process that leaves its turn's group (setsid, a double fork) is not swept"
        )


def _heartbeat(settings: Settings, services: Services) -> Heartbeat | None:
    """The liveness heartbeat to the controller, when it is configured."""
    if settings.callback_url is None or settings.callback_key is None:
        return None
    registry = services.registry

    def running() -> list[RunningTurn]:
        turns = []
        for execution in registry.running():
            tool, summary = execution.progress.tool or (None, None)
            turns.append(RunningTurn(execution.execution_id, tool, summary, execution.started_at))
        return turns

    url = heartbeat_url(settings.callback_url, settings.agent_name)
    return Heartbeat(
        url,
        settings.callback_key,
        running,
        services.redactor.redact,
        settings.heartbeat_interval_s,
        services.metrics,
    )
