"""`GET /health` and `GET /metrics` (contract §8): no auth, no secrets."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from agent_server import __version__
from agent_server.config import Settings
from agent_server.execution.registry import Registry
from agent_server.metrics import CONTENT_TYPE, Metrics
from agent_server.readiness import Readiness, runtime_available
from agent_server.routes.respond import answer, answer_text
from agent_server.runtimes.base import TURN_OPTIONS, RuntimeAdapter, override_kinds
from agent_server.wire.health import Capabilities, Health


async def health(request: Request) -> Response:
    """Liveness and readiness: the body says what is wrong, the status stays 200."""
    settings: Settings = request.app.state.settings
    adapter: RuntimeAdapter = request.app.state.adapter
    registry: Registry = request.app.state.registry
    readiness: Readiness = request.app.state.readiness
    available = runtime_available(settings.runtime_command)
    problems = list(readiness.problems)
    if not available:
        problems.insert(0, "the runtime command (AGENT_SERVER_RUNTIME_COMMAND) is no executable")
    body = Health(
        status="degraded" if problems else "ok",
        problems=problems,
        agent_name=settings.agent_name,
        runtime=settings.runtime,
        runtime_available=available,
        version=__version__,
        active_executions=len(registry),
        auth="insecure" if request.app.state.controller_token is None else "token",
        isolation="same_uid" if settings.spawn_user is None else "spawn_user",
        spawn_user=settings.spawn_user.name if settings.spawn_user else None,
        containment=request.app.state.reaper.containment,
        capabilities=Capabilities(
            auth_override=list(override_kinds(adapter, settings.broker)),
            turn_options=[name for name in TURN_OPTIONS if name in adapter.honours],
            not_enforced=[name for name in TURN_OPTIONS if name in adapter.not_enforced],
        ),
    )
    return answer(request, body.model_dump())


async def metrics(request: Request) -> Response:
    """Prometheus text exposition (no auth, no secrets)."""
    registry: Metrics = request.app.state.metrics
    return answer_text(request, registry.render().decode("utf-8"), CONTENT_TYPE)
