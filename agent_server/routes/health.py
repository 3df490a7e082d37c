"""`GET /health` (contract §8): no auth, no secrets, always 200 while serving."""

from __future__ import annotations

import os
import shutil

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from agent_server import __version__
from agent_server.metrics import CONTENT_TYPE
from agent_server.models import Capabilities, Health
from agent_server.services import Services

AUTH_OVERRIDE_KINDS = ["oauth_token", "api_key", "provider"]


def runtime_available(command: str) -> bool:
    """True when the runtime command resolves to an executable file."""
    if os.sep in command:
        return os.path.isfile(command) and os.access(command, os.X_OK)
    return shutil.which(command) is not None


async def health(request: Request) -> JSONResponse:
    """Liveness and readiness: the body says what is wrong, the status stays 200."""
    services: Services = request.app.state.services
    settings = services.settings
    available = runtime_available(settings.runtime_command)
    body = Health(
        status="ok" if available else "degraded",
        agent_name=settings.agent_name,
        runtime=settings.runtime,
        runtime_available=available,
        version=__version__,
        active_executions=services.active_executions(),
        auth="insecure" if services.controller_token is None else "token",
        capabilities=Capabilities(
            auth_override=AUTH_OVERRIDE_KINDS if services.supports_auth_override else []
        ),
    )
    return JSONResponse(body.model_dump())


async def metrics(request: Request) -> Response:
    """Prometheus text exposition (no auth, no secrets)."""
    services: Services = request.app.state.services
    return Response(services.metrics.render(), media_type=CONTENT_TYPE)
