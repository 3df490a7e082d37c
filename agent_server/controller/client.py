"""A typed async client of one agent-server: every route, answers as the wire models.

    async with AgentClient("http://agent-1:8000", SecretStr(token)) as agent:
        reply = await agent.task(ParallelTaskRequest(message="fix the test"))
        print(reply.answer.response, reply.auth_override)

Every non-2xx answer raises from `errors.error_from_response`, and no answer is
ever retried here: the walk is the only retry loop. Secrets stay `SecretStr` until
they are written into a request body or the controller-token header.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Self, TypeVar

import httpx
from pydantic import BaseModel, SecretStr, ValidationError

from agent_server.controller.errors import ProtocolError, TransportError, error_from_response
from agent_server.controller.sse import EventStreamReader
from agent_server.wire.credentials import CredentialStatus, ReloadTokenResponse
from agent_server.wire.health import Health
from agent_server.wire.names import (
    AUTH_OVERRIDE_HEADER,
    AUTH_OVERRIDE_KINDS,
    CONTROLLER_TOKEN_HEADER,
    AuthOverrideKind,
)
from agent_server.wire.results import LiveEvent, RetainedResult
from agent_server.wire.turns import (
    AsyncAccepted,
    AuthOverride,
    ChatRequest,
    ParallelTaskRequest,
    RunningExecutions,
    TerminateResponse,
    TurnResponse,
)

Model = TypeVar("Model", bound=BaseModel)
DEFAULT_TIMEOUT_S = 30.0
"""For every request but a turn's, whose own deadline decides (`timeout_s`)."""
TURN_MARGIN_S = 15.0
"""How much longer than the turn's own deadline a turn's request may take to answer."""


@dataclass(frozen=True)
class TurnReply:
    """A turn's 200: the answer, and the override the server says it applied."""

    answer: TurnResponse
    auth_override: AuthOverrideKind | None
    """`X-Trinity-Auth-Override`: None when no override was applied (or the server is
    older than the header)."""


@dataclass(frozen=True)
class AcceptedReply:
    """An async turn's 202: it runs; its result comes by callback (or `result`)."""

    accepted: AsyncAccepted
    auth_override: AuthOverrideKind | None


class AgentClient:
    """One agent-server, reached over HTTP with the controller token."""

    def __init__(
        self,
        base_url: str,
        token: SecretStr,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self._http = httpx.AsyncClient(
            base_url=self.base_url,
            timeout=timeout_s,
            transport=transport,
            headers={CONTROLLER_TOKEN_HEADER: token.get_secret_value()},
        )

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the connections."""
        await self._http.aclose()

    # --- turns ---------------------------------------------------------------------------

    async def task(self, request: ParallelTaskRequest) -> TurnReply | AcceptedReply:
        """`POST /api/task`: one turn (a 202 `AcceptedReply` when it went async)."""
        response = await self._send(
            "POST", "/api/task", json=_turn_body(request), timeout=_turn_timeout(request)
        )
        applied = _applied(response)
        if response.status_code == 202:
            return AcceptedReply(_model(AsyncAccepted, response), applied)
        return TurnReply(_model(TurnResponse, response), applied)

    async def chat(self, request: ChatRequest) -> TurnReply:
        """`POST /api/chat`: one turn of the agent's chat."""
        # No deadline of ours: a chat waits for the chat before it, then runs its own 900 s.
        response = await self._send("POST", "/api/chat", json=_turn_body(request), timeout=None)
        return TurnReply(_model(TurnResponse, response), _applied(response))

    # --- credentials ----------------------------------------------------------------------

    async def reload_token(
        self,
        token: SecretStr,
        *,
        remove_api_key: bool = False,
        expected_generation: int | None = None,
    ) -> ReloadTokenResponse:
        """`POST /api/credentials/reload-token`; `expected_generation` makes it a CAS."""
        body = {
            "token": token.get_secret_value(),
            "remove_api_key": remove_api_key,
            "expected_generation": expected_generation,
        }
        response = await self._send("POST", "/api/credentials/reload-token", json=body)
        return _model(ReloadTokenResponse, response)

    async def status(self) -> CredentialStatus:
        """`GET /api/credentials/status`."""
        return _model(CredentialStatus, await self._send("GET", "/api/credentials/status"))

    async def health(self) -> Health:
        """`GET /health`."""
        return _model(Health, await self._send("GET", "/health"))

    # --- executions -----------------------------------------------------------------------

    async def running(self) -> RunningExecutions:
        """`GET /api/executions/running`."""
        return _model(RunningExecutions, await self._send("GET", "/api/executions/running"))

    async def terminate(self, execution_id: str) -> TerminateResponse:
        """`POST /api/executions/{id}/terminate`."""
        path = f"/api/executions/{execution_id}/terminate"
        return _model(TerminateResponse, await self._send("POST", path))

    async def result(self, execution_id: str) -> RetainedResult:
        """`GET /api/executions/{id}/result`: a finished turn's retained envelope."""
        path = f"/api/executions/{execution_id}/result"
        return _model(RetainedResult, await self._send("GET", path))

    async def events(
        self, execution_id: str, *, last_event_id: str | None = None
    ) -> AsyncIterator[LiveEvent]:
        """`GET /api/executions/{id}/events`: the turn's live events, `terminal` last."""
        headers = {"Last-Event-ID": last_event_id} if last_event_id else {}
        path = f"/api/executions/{execution_id}/events"
        # Reads wait for the next event: the server's comment every 15 s keeps it short.
        timeout = httpx.Timeout(DEFAULT_TIMEOUT_S, read=60.0)
        try:
            async with self._http.stream("GET", path, headers=headers, timeout=timeout) as answer:
                if not answer.is_success:
                    await answer.aread()
                    raise error_from_response(answer)
                reader = EventStreamReader()
                async for chunk in answer.aiter_text():
                    for event in reader.text(chunk):
                        yield event
        except httpx.TransportError as exc:
            raise TransportError(_transport_message(exc)) from exc

    # --- the one exchange -----------------------------------------------------------------

    async def _send(self, method: str, path: str, **options: Any) -> httpx.Response:
        """One request, one answer; a transport failure or a non-2xx answer raises."""
        try:
            response = await self._http.request(method, path, **options)
        except httpx.TransportError as exc:
            raise TransportError(_transport_message(exc)) from exc
        if not response.is_success:
            raise error_from_response(response)
        return response


def _transport_message(exc: httpx.TransportError) -> str:
    # httpx's message names the URL at most; no header (so no token) is in it.
    return f"{type(exc).__name__}: {exc}"


def _model(model: type[Model], response: httpx.Response) -> Model:
    try:
        return model.model_validate_json(response.content)
    except ValidationError as exc:
        msg = (
            f"{response.request.url.path} answered {response.status_code} with no {model.__name__}"
        )
        raise ProtocolError(msg) from exc


def _applied(response: httpx.Response) -> AuthOverrideKind | None:
    header = response.headers.get(AUTH_OVERRIDE_HEADER)
    return next((kind for kind in AUTH_OVERRIDE_KINDS if kind == header), None)


def _turn_timeout(request: ParallelTaskRequest) -> float:
    return request.timeout_seconds + TURN_MARGIN_S


def _turn_body(request: ParallelTaskRequest | ChatRequest) -> dict[str, Any]:
    """The request as JSON, its override's secrets written out (only here)."""
    body = request.model_dump(mode="json", exclude_none=True, exclude={"auth_override"})
    if request.auth_override is not None:
        body["auth_override"] = _override_body(request.auth_override)
    return body


def _override_body(override: AuthOverride) -> dict[str, Any]:
    if override.oauth_token is not None:
        return {"oauth_token": override.oauth_token.get_secret_value()}
    if override.api_key is not None:
        return {"api_key": override.api_key.get_secret_value()}
    provider = override.provider
    if provider is None:  # AuthOverride's validator allows exactly one of the three
        msg = "auth_override holds none of its three kinds"
        raise ValueError(msg)
    return {
        "provider": {
            "base_url": provider.base_url,
            "auth_token": provider.auth_token.get_secret_value(),
            **({"model": provider.model} if provider.model else {}),
        }
    }
