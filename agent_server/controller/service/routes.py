"""The service's HTTP in and out: each handler checks its input, asks the instance, and
answers JSON (errors as `{"error", "message"}`, naming no secret and echoing no value)."""

from __future__ import annotations

import json
from importlib import resources
from typing import Any

from pydantic import SecretStr, ValidationError
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response, StreamingResponse

from agent_server.controller.errors import ControllerError, PoolFileError, StoreError
from agent_server.controller.pool.file import AGENT_NAME, CREDENTIAL_ID
from agent_server.controller.pool.status import pool_status
from agent_server.controller.service import liveness as live
from agent_server.controller.service.auth import bearer_matches
from agent_server.controller.service.instance import ServiceInstance
from agent_server.controller.service.metrics import CONTENT_TYPE
from agent_server.controller.service.turns import (
    MAX_BODY_BYTES,
    TurnRequest,
    new_execution_id,
)
from agent_server.controller.walker import Walker

PAGE = "page.html"
# The page's script and style are inline; it fetches only this origin and frames nothing.
PAGE_HEADERS = {
    "Cache-Control": "no-store",
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
        "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}


class Refused(Exception):
    """A request answered with a 4xx/5xx: `status`, a code and a few words."""

    def __init__(self, status: int, error: str, message: str) -> None:
        super().__init__(message)
        self.status, self.error, self.message = status, error, message


def refusal(exc: Refused) -> JSONResponse:
    """The one JSON shape of every refusal."""
    return JSONResponse({"error": exc.error, "message": exc.message}, status_code=exc.status)


def instance_of(request: Request) -> ServiceInstance:
    """The instance the app serves (lifespan state)."""
    instance: ServiceInstance = request.app.state.instance
    return instance


async def read_json(request: Request, limit: int) -> dict[str, Any]:
    """The body as a JSON object, read only up to `limit` bytes."""
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise Refused(413, "body_too_large", f"the body exceeds {limit} bytes")
    try:
        parsed = json.loads(body or b"{}")
    except (ValueError, UnicodeDecodeError) as exc:
        raise Refused(400, "invalid_json", "the body is not JSON") from exc
    if not isinstance(parsed, dict):
        raise Refused(422, "invalid_request", "the body must be a JSON object")
    return parsed


def _invalid(exc: ValidationError) -> Refused:
    fields = sorted({".".join(str(p) for p in error["loc"]) or "body" for error in exc.errors()})
    return Refused(422, "invalid_request", f"invalid fields: {', '.join(fields)}")


def known_agent(request: Request) -> str:
    """The path's agent, one the pool file names with its server; else 404."""
    agent = str(request.path_params["agent"])
    if agent not in instance_of(request).clients:
        raise Refused(404, "unknown_agent", "the pool file names no such agent with a url")
    return agent


async def post_turn(request: Request) -> Response:
    """`POST /v1/agents/{agent}/turns`: walk a turn; `async` answers 202 at once."""
    instance = instance_of(request)
    agent = known_agent(request)
    try:
        body = TurnRequest.model_validate(await read_json(request, MAX_BODY_BYTES))
    except ValidationError as exc:
        raise _invalid(exc) from exc
    if not instance.accepting:
        raise Refused(503, "shutting_down", "this instance is shutting down")
    execution_id = body.execution_id or new_execution_id()
    if instance.turns.running(execution_id):
        raise Refused(409, "turn_running", "a turn with this execution_id runs here")
    if body.run_async:
        instance.turns.start(execution_id, instance.run_turn(agent, body, execution_id))
        return JSONResponse({"execution_id": execution_id, "state": "running"}, status_code=202)
    try:
        result = await instance.run_turn(agent, body, execution_id)
    except StoreError:
        raise
    except ControllerError as exc:  # the agent's server could not be reached or misspoke
        raise Refused(502, "agent_unreachable", type(exc).__name__) from exc
    return JSONResponse(result.as_json())


async def get_turn(request: Request) -> Response:
    """`GET /v1/turns/{execution_id}`: an async turn's result (202 while it runs)."""
    execution_id = str(request.path_params["execution_id"])
    try:
        state = instance_of(request).turns.state(execution_id)
    except KeyError:
        raise Refused(404, "unknown_turn", "this instance knows no turn with this id") from None
    said: dict[str, Any] = {"execution_id": execution_id}
    if state is None:
        return JSONResponse({**said, "state": "running"}, status_code=202)
    if isinstance(state, str):
        return JSONResponse({**said, "state": "failed", "error": state})
    return JSONResponse({**said, "state": "done", "result": state.as_json()})


async def get_pool(request: Request) -> Response:
    """`GET /v1/pool`: `pool status --json`, turns in flight, and each agent's liveness."""
    instance = instance_of(request)
    snapshot = await instance.store.snapshot()
    now = instance.config.clock()
    status = pool_status(instance.pool.infos, snapshot, now)
    for row in status["credentials"]:
        row["in_flight"] = snapshot.in_flight(row["credential"], now)
        row["ceiling"] = instance.pool.ceiling(row["credential"])
    beats = live.beats_of(await instance.store.heartbeats())
    names = set(instance.clients) | set(snapshot.assignments) | set(beats)
    agents = []
    for name in sorted(names):
        beat = beats.get(name)
        assigned = snapshot.assignments.get(name)
        agents.append(
            {
                "agent": name,
                "credential": assigned.credential_id if assigned else None,
                "heartbeat": beat.as_json(now) if beat else None,
            }
        )
    return JSONResponse({**status, "agents": agents})


async def assign(request: Request) -> Response:
    """`POST /v1/agents/{agent}/assign` `{credential}`: `pool assign`."""
    walker, agent = instance_of(request).walker, known_agent(request)
    credential = (await read_json(request, 4096)).get("credential")
    if not isinstance(credential, str) or not CREDENTIAL_ID.fullmatch(credential):
        raise Refused(422, "invalid_request", "credential must be a credential id")
    made = await _pool_act(lambda: walker.assign(agent, credential))
    body = {"agent": made.agent, "credential": made.credential_id, "generation": made.generation}
    return JSONResponse(body)


async def stop(request: Request) -> Response:
    """`POST /v1/agents/{agent}/stop`: `pool stop`."""
    walker, agent = instance_of(request).walker, known_agent(request)
    cancelled = await _pool_act(lambda: walker.stop(agent))
    return JSONResponse({"agent": agent, "cancelled_turns": cancelled})


async def clear(request: Request) -> Response:
    """`DELETE /v1/credentials/{credential}/failures`: `pool clear`."""
    walker: Walker = instance_of(request).walker
    credential = str(request.path_params["credential"])
    await _pool_act(lambda: walker.clear(credential))
    return JSONResponse({"credential": credential, "cleared": True})


async def _pool_act(act: Any) -> Any:
    try:
        return await act()
    except PoolFileError as exc:
        raise Refused(404, "unknown_credential", str(exc)) from exc
    except StoreError:
        raise
    except ControllerError as exc:
        raise Refused(502, "agent_error", type(exc).__name__) from exc


async def events(request: Request) -> Response:
    """`GET /v1/events`: this instance's walk and heartbeat events, as server-sent events."""
    stream = instance_of(request).broadcast.stream()
    headers = {"Cache-Control": "no-store", "X-Accel-Buffering": "no"}
    return StreamingResponse(stream, media_type="text/event-stream", headers=headers)


async def heartbeat(request: Request) -> Response:
    """`POST /api/agents/{name}/heartbeat`: an agent's liveness; its own token as bearer."""
    instance = instance_of(request)
    name = str(request.path_params["name"])
    agent = instance.pool.agents.get(name) if AGENT_NAME.fullmatch(name) else None
    token = agent.token if agent is not None else SecretStr("\x00unknown")
    if not bearer_matches(request, token) or agent is None:
        raise Refused(401, "unauthorized", "a heartbeat takes the agent's own bearer token")
    try:
        body = live.HeartbeatBody.model_validate(await read_json(request, live.MAX_BODY_BYTES))
    except ValidationError as exc:
        raise _invalid(exc) from exc
    beat = live.Beat(name, instance.config.clock(), body)
    await instance.store.record_heartbeat(name, beat.received_at, body.model_dump_json())
    instance.broadcast.publish("heartbeat", beat.as_json())
    return Response(status_code=204)


async def metrics(request: Request) -> Response:
    """`GET /metrics`: Prometheus text; the gauges read from the store now."""
    instance = instance_of(request)
    snapshot = await instance.store.snapshot()
    beats = live.beats_of(await instance.store.heartbeats())
    text = instance.metrics.render(instance.pool, snapshot, beats, instance.config.clock())
    return Response(text, media_type=CONTENT_TYPE)


async def page(request: Request) -> Response:
    """`GET /`: the fleet page (a static file beside this module), if it is installed."""
    source = resources.files(__package__ or "").joinpath(PAGE)
    if not source.is_file():
        raise Refused(404, "no_page", "the page is not installed")
    return HTMLResponse(source.read_text(encoding="utf-8"), headers=PAGE_HEADERS)
