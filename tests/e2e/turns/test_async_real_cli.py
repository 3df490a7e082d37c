"""Async turns take per-spawn overrides (contract §6.8): the real Claude Code CLI, the
loopback Messages API and a loopback callback receiver. Each override kind serves its
own turn; the 202 names it, and so does the envelope the controller receives."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from typing import Any

import pytest

from tests.conftest import SecretRegistry
from tests.e2e.conftest import TurnServers
from tests.support.callback_receiver import CallbackReceiver
from tests.support.messages_api import QUIET_CLI, MessagesApiStandIn, fingerprint, require_real_cli
from tests.support.server import ServerProcess

pytestmark = [pytest.mark.realcli, pytest.mark.timeout(180)]


@pytest.fixture(scope="module")
def api() -> Iterator[MessagesApiStandIn]:
    with MessagesApiStandIn() as stand_in:
        yield stand_in


@pytest.fixture(scope="module")
def receiver(secret_registry: SecretRegistry) -> Iterator[CallbackReceiver]:
    with CallbackReceiver(secret_registry.new("async_callback_key")) as running:
        yield running


@pytest.fixture(scope="module")
def server(
    module_turn_servers: TurnServers,
    api: MessagesApiStandIn,
    receiver: CallbackReceiver,
    secret_registry: SecretRegistry,
) -> ServerProcess:
    """The real CLI, a baseline OAuth token that the overrides must displace."""
    return module_turn_servers.start(
        AGENT_SERVER_RUNTIME_COMMAND=str(require_real_cli()),
        ANTHROPIC_BASE_URL=api.base_url,
        CLAUDE_CODE_OAUTH_TOKEN=secret_registry.new("async_baseline"),
        **receiver.environ(),
        **QUIET_CLI,
    )


@pytest.mark.parametrize(
    ("kind", "sent_as"),
    [
        pytest.param("oauth_token", "bearer", id="oauth_token"),
        pytest.param("api_key", "x-api-key", id="api_key"),
        pytest.param("provider", "bearer", id="provider"),
    ],
)
def test_each_override_kind_serves_its_async_turn(
    server: ServerProcess,
    api: MessagesApiStandIn,
    receiver: CallbackReceiver,
    secret_registry: SecretRegistry,
    kind: str,
    sent_as: str,
) -> None:
    """202 with the header; the model API saw the override; the envelope says its route."""
    secret = secret_registry.new("good")
    override: dict[str, Any] = (
        {"provider": {"base_url": api.base_url, "auth_token": secret}}
        if kind == "provider"
        else {kind: secret}
    )
    execution_id = f"async-{kind}-{secrets.token_hex(3)}"
    body = {
        "message": "hi",
        "execution_id": execution_id,
        "async_result": True,
        "timeout_seconds": 90,
        "auth_override": override,
    }
    accepted = server.post("/api/task", json=body)
    assert accepted.status_code == 202, accepted.text
    assert accepted.headers["X-Trinity-Auth-Override"] == kind
    envelope = receiver.wait_for_id(execution_id, timeout=90).body
    assert envelope["status"] == "success", envelope.get("error")
    assert envelope["auth_route"] == kind
    assert envelope["response"] == f"served-by kind={sent_as} fp={fingerprint(secret)}"
    (request,) = [r for r in api.message_requests if r.fingerprint == fingerprint(secret)]
    assert request.credential_kind == sent_as


def test_an_async_rate_limit_tells_the_controller_to_walk_on(
    server: ServerProcess, receiver: CallbackReceiver, secret_registry: SecretRegistry
) -> None:
    """The override hit its five-hour wall: failed, Trinity's billing/rate_limit, and our
    detail with switch_credential and the reset about an hour ahead."""
    execution_id = f"async-wall-{secrets.token_hex(3)}"
    body = {
        "message": "hi",
        "execution_id": execution_id,
        "async_result": True,
        "auth_override": {"oauth_token": secret_registry.new("ratelimit")},
    }
    assert server.post("/api/task", json=body).status_code == 202
    envelope = receiver.wait_for_id(execution_id, timeout=90).body
    assert (envelope["status"], envelope["error_code"]) == ("failed", "billing")
    assert envelope["terminal_reason"] == "rate_limit"
    assert envelope["auth_route"] == "oauth_token"
    detail = envelope["detail"]
    assert (detail["error_code"], detail["switch_credential"]) == ("rate_limit", True)
    assert detail["rate_limit_type"] == "five_hour"
    assert detail["resets_at"] is not None
