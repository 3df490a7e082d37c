"""`POST /api/credentials/reload-token` and `GET /api/credentials/status` (contract §4)."""

from __future__ import annotations

import logging

from starlette.requests import Request
from starlette.responses import Response

from agent_server.config import Settings
from agent_server.credentials.status import credential_status, env_shadow
from agent_server.credentials.store import CredentialStore
from agent_server.errors import ApiError, RequestInvalid, TokenInvalid, TokenRequired
from agent_server.redaction.redactor import Redactor
from agent_server.routes.requests import parse_json
from agent_server.routes.respond import answer
from agent_server.spawn_env.builder import SpawnEnvBuilder
from agent_server.wire import codes
from agent_server.wire.credentials import ReloadTokenRequest, ReloadTokenResponse
from agent_server.wire.values import token_problem

logger = logging.getLogger("agent_server.credentials")

RELOAD_INVALID = codes.VALIDATION_FAILED.code
"""The reload metric's result for a body that fails validation (422)."""


async def reload_token(request: Request) -> Response:
    """Persist a rotated OAuth token, then make it every next spawn's credential.

    Every answer counts in `agent_server_credential_reloads_total{result}`: `changed`,
    `unchanged`, or the error code of the failure (`validation_failed` for a 422).
    """
    reloads = request.app.state.metrics.reloads
    try:
        response = await _reload(request)
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
    return answer(request, response.model_dump())


async def _reload(request: Request) -> ReloadTokenResponse:
    store: CredentialStore = request.app.state.store
    redactor: Redactor = request.app.state.redactor
    spawn_envs: SpawnEnvBuilder = request.app.state.spawn_envs
    body = await parse_json(request, ReloadTokenRequest)
    token = body.token.get_secret_value()
    if not token.strip():
        msg = "token is required"
        raise TokenRequired(msg)
    problem = token_problem(token)
    if problem is not None:
        msg = f"token {problem}"
        raise TokenInvalid(msg)
    redactor.add([body.token])
    result = await store.reload(
        body.token,
        remove_api_key=body.remove_api_key,
        expected_generation=body.expected_generation,
    )
    state = result.state
    shadow = env_shadow(state, await spawn_envs.read_dotenv())
    await request.app.state.readiness.check()  # /health follows the credential in force
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


async def status(request: Request) -> Response:
    """Which credential the next spawn uses, and how `.env` drifts from the process env."""
    settings: Settings = request.app.state.settings
    spawn_envs: SpawnEnvBuilder = request.app.state.spawn_envs
    report = credential_status(
        request.app.state.store,
        await spawn_envs.read_dotenv(),
        agent_name=settings.agent_name,
        runtime=settings.runtime,
        env_file=settings.env_file,
        env_file_problem=spawn_envs.dotenv.problem,
    )
    return answer(request, report.model_dump())
