"""The turn routes (contract §5, §6): task (also async), chat, the running list,
terminate, and a finished turn's retained result."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from agent_server.errors import NoRetainedResult
from agent_server.execution.answer import TurnAnswer
from agent_server.execution.ask import AcceptedTurn, TurnAsk
from agent_server.execution.chat_session import ChatSession
from agent_server.execution.detached import detach
from agent_server.execution.registry import Execution, Registry
from agent_server.execution.turn import TurnRunner
from agent_server.records.results import Results
from agent_server.routes.requests import parse_json
from agent_server.routes.respond import answer
from agent_server.wire.names import AUTH_OVERRIDE_HEADER
from agent_server.wire.turns import (
    AsyncAccepted,
    ChatRequest,
    ParallelTaskRequest,
    RunningExecution,
    RunningExecutions,
    TerminateResponse,
)


async def task(request: Request) -> Response:
    """Run one stateless turn (a fresh session unless `resume_session_id`).

    With `async_result`, an execution id and a callback configured, answer 202 at once
    and deliver the result by callback (contract §6.8); otherwise answer in-line.
    """
    body = await parse_json(request, ParallelTaskRequest)
    ask = TurnAsk.from_request(body)
    if body.async_result:
        accepted = detach(request.app.state.turns, request.app.state.results, ask)
        if accepted is not None:
            return _accepted(request, accepted)
    return _respond(request, await _run_watched(request, ask))


async def chat(request: Request) -> Response:
    """One turn of the agent's chat: serialised, resuming its session across credentials.

    It is registered (queued) as soon as it is accepted, so it is listed and
    terminable while it waits for the chat turn before it.
    """
    body = await parse_json(request, ChatRequest)
    ask = TurnAsk.from_request(body)
    return _respond(request, await _run_watched(request, ask, request.app.state.chat))


async def running(request: Request) -> Response:
    """The turns in flight and the ids that finished recently."""
    registry: Registry = request.app.state.registry
    listed = registry.running()
    now = time.time()
    body = RunningExecutions(
        executions=[_listed(e, now) for e in listed],
        recently_completed_ids=registry.recently_completed(),
        pending_ids=[e.execution_id for e in listed if e.state == "queued"],
    )
    return answer(request, body.model_dump())


def _listed(execution: Execution, now: float) -> RunningExecution:
    """One row of the running list, with the CLI's last event and how old it is."""
    last = execution.progress.last
    return RunningExecution(
        execution_id=execution.execution_id,
        started_at=execution.started_at,
        auth_route=execution.auth_route,
        generation=execution.generation,
        state=execution.state,
        last_event=last[0] if last else None,
        last_event_at=datetime.fromtimestamp(last[1], UTC).isoformat() if last else None,
        last_event_age_s=round(max(0.0, now - last[1]), 3) if last else None,
    )


async def terminate(request: Request) -> Response:
    """Kill a running turn's process group; that turn answers `cancelled`."""
    registry: Registry = request.app.state.registry
    status = registry.terminate(request.path_params["execution_id"])
    return answer(request, TerminateResponse(status=status).model_dump())


async def result(request: Request) -> Response:
    """A finished turn's retained envelope, or 404 `no_retained_result` (also while the id
    runs again: never the previous run's record)."""
    results: Results = request.app.state.results
    registry: Registry = request.app.state.registry
    execution_id = request.path_params["execution_id"]
    if registry.holds(execution_id):
        msg = f"execution {execution_id} is running: its result is retained when it ends"
        raise NoRetainedResult(msg)
    record = await asyncio.to_thread(results.unwritten, execution_id)
    if record is not None:  # answered, its file not written yet: read your writes
        return answer(request, record)
    reader = await asyncio.to_thread(results.reader, execution_id)
    if reader is None:
        msg = f"no retained result for execution {execution_id}"
        raise NoRetainedResult(msg)
    # Streamed as written (redacted then), a chunk at a time: never whole in memory.
    return StreamingResponse(
        reader.chunks(),
        media_type="application/json",
        headers={"Content-Length": str(reader.size)},
    )


def _accepted(request: Request, accepted: AcceptedTurn) -> Response:
    """202 for an async turn running detached, with the override header when it has one."""
    route = accepted.credential.auth_route
    headers = {AUTH_OVERRIDE_HEADER: route} if route != "baseline" else None
    body = AsyncAccepted(execution_id=accepted.execution_id, status="accepted")
    return answer(request, body.model_dump(), status_code=202, headers=headers)


async def _run_watched(
    request: Request, ask: TurnAsk, chat: ChatSession | None = None
) -> TurnAnswer:
    """Run the turn while watching the connection.

    A client that leaves cancels a turn it named no id for (as terminate would):
    nobody could ever ask for its result. A named turn runs on; its result is
    retained under its id (§6.6).
    """
    turns: TurnRunner = request.app.state.turns
    accepted = turns.accept(ask, chat=chat)
    if ask.execution_id is not None:
        return await turns.finish(accepted)
    watcher = asyncio.create_task(_watch_disconnect(request, accepted.execution.cancel))
    try:
        return await turns.finish(accepted)
    finally:
        # Not awaited: it ends at the loop's next step, and the answer need not wait for it.
        watcher.cancel()


async def _watch_disconnect(request: Request, cancel: asyncio.Event) -> None:
    # The body is read already: the next ASGI message can only be the disconnect.
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            cancel.set()
            return


def _respond(request: Request, turn: TurnAnswer) -> Response:
    return answer(
        request,
        turn.body,
        status_code=turn.status,
        headers=turn.headers,
        serialised=turn.serialised,
    )
