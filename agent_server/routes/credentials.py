"""`POST /api/credentials/reload-token` and `GET /api/credentials/status` (contract §4)."""

from __future__ import annotations

import logging

from starlette.requests import Request
from starlette.responses import JSONResponse

from agent_server.errors import ApiError, RequestInvalid, TokenRequired
from agent_server.models import (
    CredentialFiles,
    CredentialStatus,
    OverrideFileStatus,
    ReloadTokenRequest,
    ReloadTokenResponse,
)
from agent_server.routes.requests import parse_json
from agent_server.services import Services
from agent_server.spawn_env.drift import auth_mode, effective_auth, env_drift, spawn_preview
from agent_server.spawn_env.layers import SUBSCRIPTION_SHADOW_KEYS

logger = logging.getLogger("agent_server.credentials")

RELOAD_INVALID = "validation_failed"
"""The reload metric's result for a body that fails validation (422)."""


async def reload_token(request: Request) -> JSONResponse:
    """Persist a rotated OAuth token, then make it every next spawn's credential.

    Every answer counts in `agent_server_credential_reloads_total{result}`: `changed`,
    `unchanged`, or the error code of the failure (`validation_failed` for a 422).
    """
    services: Services = request.app.state.services
    reloads = services.metrics.reloads
    try:
        response = await _reload(request, services)
    except ApiError as exc:
        reloads.labels(result=exc.error_code).inc()
        raise
    except RequestInvalid:
        reloads.labels(result=RELOAD_INVALID).inc()
        raise
    except Exception:
        reloads.labels(result=ApiError.error_code).inc()
        raise
    reloads.labels(result="changed" if response.changed else "unchanged").inc()
    return JSONResponse(response.model_dump())


async def _reload(request: Request, services: Services) -> ReloadTokenResponse:
    body = await parse_json(request, ReloadTokenRequest)
    if not body.token.get_secret_value().strip():
        msg = "token is required"
        raise TokenRequired(msg)
    services.redactor.add([body.token])
    result = await services.store.reload(
        body.token,
        remove_api_key=body.remove_api_key,
        expected_generation=body.expected_generation,
    )
    state = result.state
    dotenv = services.read_dotenv() if body.remove_api_key else {}
    shadow = [name for name in SUBSCRIPTION_SHADOW_KEYS if name in dotenv]
    logger.info(
        "reload-token: changed=%s generation=%s fingerprint=%s env_shadow=%s",
        result.changed,
        state.generation,
        state.fingerprint,
        ",".join(shadow) or "-",
    )
    assert state.fingerprint is not None  # noqa: S101 - the reload just set the token
    return ReloadTokenResponse(
        changed=result.changed,
        generation=state.generation,
        fingerprint=state.fingerprint,
        env_shadow=shadow,
    )


def build_status(services: Services) -> CredentialStatus:
    """The credential status of contract §4 for this configuration (also `agent-server status`)."""
    state = services.store.current
    dotenv = services.read_dotenv()
    preview = spawn_preview(state, dotenv)
    auth = effective_auth(preview)
    info = services.store.override_file.info()
    return CredentialStatus(
        agent_name=services.settings.agent_name,
        runtime=services.settings.runtime,
        generation=state.generation,
        fingerprint=state.fingerprint,
        auth_mode=auth_mode(auth),
        guard_armed=state.guard_armed,
        files=CredentialFiles(
            env_file=str(services.settings.env_file),
            override_file=OverrideFileStatus(
                exists=info.exists, mode=info.mode, size=info.size, mtime=info.mtime
            ),
        ),
        effective_auth=auth,
        env_drift=env_drift(state, dotenv, preview),
    )


async def credential_status(request: Request) -> JSONResponse:
    """Which credential the next spawn uses, and how `.env` drifts from the process env."""
    services: Services = request.app.state.services
    return JSONResponse(build_status(services).model_dump())
