"""The turn routes (contract §5, §6): task, chat, the running list and terminate."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from starlette.requests import Request
from starlette.responses import Response

from agent_server.execution.answer import TurnAnswer
from agent_server.execution.chat_session import ChatSession
from agent_server.execution.registry import Registry
from agent_server.execution.turn import TurnAsk, TurnRunner
from agent_server.routes.requests import parse_json
from agent_server.routes.respond import answer
from agent_server.turn_models import (
    ChatRequest,
    ParallelTaskRequest,
    RunningExecution,
    RunningExecutions,
    TerminateResponse,
)

logger = logging.getLogger("agent_server.executions")


async def task(request: Request) -> Response:
    """Run one stateless turn (a fresh session unless `resume_session_id`)."""
    body = await parse_json(request, ParallelTaskRequest)
    if body.async_result:
        # Accepted for the controller's sake; this server answers every turn in-line.
        logger.info("async_result asked: the turn is answered synchronously")
    ask = TurnAsk(
        message=body.message,
        execution_id=body.execution_id,
        model=body.model,
        system_prompt=body.system_prompt,
        allowed_tools=tuple(body.allowed_tools) if body.allowed_tools is not None else None,
        max_turns=body.max_turns,
        timeout_s=body.timeout_seconds,
        resume_session_id=body.resume_session_id,
        persist_session=body.persist_session,
        auth_override=body.auth_override,
        images=tuple(body.images) if body.images else None,
    )
    return _respond(request, await _run_watched(request, ask))


async def chat(request: Request) -> Response:
    """One turn of the agent's chat: serialised, resuming its session across credentials.

    It is registered (queued) as soon as it is accepted, so it is listed and
    terminable while it waits for the chat turn before it.
    """
    body = await parse_json(request, ChatRequest)
    ask = TurnAsk(
        message=body.message,
        execution_id=body.execution_id,
        model=body.model,
        system_prompt=body.system_prompt,
        auth_override=body.auth_override,
        images=tuple(body.images) if body.images else None,
        reset_unknown_session=True,
    )
    return _respond(request, await _run_watched(request, ask, request.app.state.chat))


async def running(request: Request) -> Response:
    """The turns in flight and the ids that finished recently."""
    registry: Registry = request.app.state.registry
    listed = registry.running()
    body = RunningExecutions(
        executions=[
            RunningExecution(
                execution_id=e.execution_id,
                started_at=e.started_at,
                auth_route=e.auth_route,
                generation=e.generation,
                state=e.state,
            )
            for e in listed
        ],
        recently_completed_ids=registry.recently_completed(),
        pending_ids=[e.execution_id for e in listed if e.state == "queued"],
    )
    return answer(request, body.model_dump())


async def terminate(request: Request) -> Response:
    """Kill a running turn's process group; that turn answers `cancelled`."""
    registry: Registry = request.app.state.registry
    status = registry.terminate(request.path_params["execution_id"])
    return answer(request, TerminateResponse(status=status).model_dump())


async def _run_watched(
    request: Request, ask: TurnAsk, chat: ChatSession | None = None
) -> TurnAnswer:
    """Run the turn while watching the connection: a client that leaves cancels it."""
    turns: TurnRunner = request.app.state.turns
    gone = asyncio.Event()
    watcher = asyncio.create_task(_watch_disconnect(request, gone))
    try:
        return await turns.run(ask, gone, chat=chat)
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher


async def _watch_disconnect(request: Request, gone: asyncio.Event) -> None:
    # The body is read already: the next ASGI message can only be the disconnect.
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            gone.set()
            return


def _respond(request: Request, turn: TurnAnswer) -> Response:
    return answer(request, turn.body, status_code=turn.status, headers=turn.headers)
