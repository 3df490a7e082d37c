"""The controller's typed client against a real server (the fake CLI): every route, typed
answers, and every refusal raised from the one exception tree."""

from __future__ import annotations

import asyncio
import json
import secrets
from collections.abc import Iterator

import pytest
from pydantic import SecretStr

from agent_server.controller.client import AcceptedReply, AgentClient, TurnReply
from agent_server.controller.errors import (
    ExecutionInProgress,
    GenerationMismatch,
    NotFound,
    RateLimited,
    TransportError,
    Unauthorized,
)
from agent_server.wire.turns import AuthOverride, ChatRequest, ParallelTaskRequest
from tests.conftest import SecretRegistry
from tests.e2e.conftest import TurnServers
from tests.support.callback_receiver import CallbackReceiver
from tests.support.fake_cli import fingerprint
from tests.support.server import ServerProcess, free_port

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120)]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
def callback_key(secret_registry: SecretRegistry) -> str:
    return secret_registry.new("client_callback")


@pytest.fixture(scope="module")
def receiver(callback_key: str) -> Iterator[CallbackReceiver]:
    with CallbackReceiver(callback_key) as running:
        yield running


@pytest.fixture(scope="module")
def server(
    module_turn_servers: TurnServers, receiver: CallbackReceiver, callback_key: str
) -> ServerProcess:
    """One server (fake CLI) for the module, with a callback so a task may go async; in
    the permission mode the replayed transcripts report."""
    return module_turn_servers.start(
        TRINITY_BACKEND_URL=receiver.base_url,
        TRINITY_MCP_API_KEY=callback_key,
        AGENT_SERVER_PERMISSION_MODE="default",
    )


def _client(server: ServerProcess, token: str | None = None) -> AgentClient:
    return AgentClient(server.base_url, SecretStr(token or server.token or ""))


def _id(name: str) -> str:
    return f"client-{name}-{secrets.token_hex(4)}"


async def test_health_and_status_are_typed(server: ServerProcess) -> None:
    """GET /health and the credential status come back as the wire models."""
    async with _client(server) as agent:
        health = await agent.health()
        status = await agent.status()
    assert health.status == "ok"
    assert "oauth_token" in health.capabilities.auth_override
    assert status.agent_name == "test-agent"


async def test_a_task_with_an_override_names_the_override_it_ran(
    server: ServerProcess, secret_registry: SecretRegistry
) -> None:
    """The answer is a TurnResponse and the applied override is read from the header."""
    token = secret_registry.new("client_oauth")
    request = ParallelTaskRequest(
        message="hi", auth_override=AuthOverride(oauth_token=SecretStr(token))
    )
    async with _client(server) as agent:
        reply = await agent.task(request)
    assert isinstance(reply, TurnReply)
    assert reply.auth_override == "oauth_token"
    assert reply.answer.metadata.auth_route == "oauth_token"
    assert json.loads(reply.answer.response)["fp"] == fingerprint(token)


async def test_a_refused_credential_raises_its_class(
    server: ServerProcess, secret_registry: SecretRegistry
) -> None:
    """A §7 rate limit is RateLimited, a CredentialRefused, with the override header."""
    token = SecretStr(secret_registry.new("client_limited"))
    request = ParallelTaskRequest(
        message="@scenario rate_limit_five_hour_oauth",
        auth_override=AuthOverride(oauth_token=token),
    )
    async with _client(server) as agent:
        with pytest.raises(RateLimited) as raised:
            await agent.task(request)
    assert raised.value.status == 429
    assert raised.value.switch_credential is True
    assert raised.value.auth_override == "oauth_token"
    assert raised.value.detail.rate_limit_type == "five_hour"


async def test_a_chat_turn(server: ServerProcess) -> None:
    """POST /api/chat answers with the session context."""
    async with _client(server) as agent:
        reply = await agent.chat(ChatRequest(message="hello"))
    assert reply.answer.session is not None
    assert reply.auth_override is None


async def test_reload_token_is_a_compare_and_set(
    server: ServerProcess, secret_registry: SecretRegistry
) -> None:
    """A reload with the current generation takes; with a stale one it is GenerationMismatch."""
    token = SecretStr(secret_registry.new("client_reload"))
    async with _client(server) as agent:
        current = (await agent.status()).generation
        reloaded = await agent.reload_token(token, expected_generation=current)
        with pytest.raises(GenerationMismatch):
            await agent.reload_token(token, expected_generation=current)
    assert reloaded.changed is True
    assert reloaded.fingerprint == f"sha256:{fingerprint(token.get_secret_value())}"


async def test_a_running_turn_is_listed_terminated_and_its_events_and_result_read(
    server: ServerProcess,
) -> None:
    """running, a second turn of the same id refused, terminate, the events to `terminal`,
    and the retained result."""
    execution_id = _id("long")
    async with _client(server) as agent:
        turn = asyncio.create_task(
            agent.task(ParallelTaskRequest(message="@sleep 30", execution_id=execution_id))
        )
        for _ in range(500):
            listed = await agent.running()
            if execution_id in {e.execution_id for e in listed.executions}:
                break
            await asyncio.sleep(0.02)
        with pytest.raises(ExecutionInProgress):
            await agent.task(ParallelTaskRequest(message="again", execution_id=execution_id))
        assert (await agent.terminate(execution_id)).status == "terminated"
        reply = await turn
        events = [event async for event in agent.events(execution_id)]
        retained = await agent.result(execution_id)
    assert isinstance(reply, TurnReply)
    assert reply.answer.status == "cancelled"
    assert events[-1].event == "terminal"
    assert json.loads(events[-1].data)["status"] == "cancelled"
    assert retained.status == "cancelled"
    assert retained.execution_id == execution_id


async def test_an_async_task_is_accepted(server: ServerProcess) -> None:
    """With async_result and a callback configured, the answer is an AcceptedReply (202)."""
    execution_id = _id("async")
    request = ParallelTaskRequest(message="hi", execution_id=execution_id, async_result=True)
    async with _client(server) as agent:
        reply = await agent.task(request)
    assert isinstance(reply, AcceptedReply)
    assert reply.accepted.execution_id == execution_id


async def test_unknown_ids_are_not_found(server: ServerProcess) -> None:
    """terminate, result and events of an id the server never saw raise NotFound."""
    async with _client(server) as agent:
        with pytest.raises(NotFound):
            await agent.terminate(_id("unknown"))
        with pytest.raises(NotFound) as result:
            await agent.result(_id("unknown"))
        with pytest.raises(NotFound):
            _ = [event async for event in agent.events(_id("unknown"))]
    assert result.value.error_code == "no_retained_result"


async def test_a_wrong_token_is_unauthorized(server: ServerProcess) -> None:
    """The server's 401 is Unauthorized."""
    async with _client(server, token="not-the-token-0123456789") as agent:
        with pytest.raises(Unauthorized):
            await agent.status()


async def test_no_server_is_a_transport_error() -> None:
    """A refused connection is TransportError, never httpx's own exception."""
    async with AgentClient(f"http://127.0.0.1:{free_port()}", SecretStr("x" * 16)) as agent:
        with pytest.raises(TransportError):
            await agent.health()
