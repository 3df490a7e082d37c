"""A hostile CLI under the broker: it holds a placeholder, and what it prints blames nobody.

The fake CLI makes no request at all: whatever it prints, the API answered nothing on
the turn's credential, so the answer names no credential and switches none (§4.8, §7).
Every test runs twice: the CLI as the server's uid, and as the spawn user.
"""

from __future__ import annotations

import json

import httpx
import pytest

from tests.conftest import SecretRegistry
from tests.e2e.conftest import TurnServers
from tests.support.agent_user import Reachable
from tests.support.fake_cli import fingerprint
from tests.support.server import FAKE_CLAUDE, ServerProcess

OVERRIDE_HEADER = "x-trinity-auth-override"


@pytest.fixture(scope="module", params=["same uid", "spawn user"])
def server(
    request: pytest.FixtureRequest,
    module_turn_servers: TurnServers,
    secret_registry: SecretRegistry,
) -> ServerProcess:
    """A brokered server running the fake CLI, a subscription baseline (in the recorded
    transcripts' permission mode, which they replay), its turns as the server's uid or
    as the spawn user."""
    token = secret_registry.new(f"fake_broker_baseline_{request.param.replace(' ', '_')}")
    as_user: dict[str, str] = {}
    if request.param == "spawn user":
        reach: Reachable = request.getfixturevalue("reachable")
        as_user = reach.spawn_environ(reach.stand_in("fake-claude"))
    return module_turn_servers.start(
        AGENT_SERVER_BROKER="1",
        CLAUDE_CODE_OAUTH_TOKEN=token,
        AGENT_SERVER_PERMISSION_MODE="default",
        **as_user,
    )


def post(server: ServerProcess, body: dict[str, object]) -> httpx.Response:
    with server.client(timeout=60) as client:
        return client.post("/api/task", json=body)


def test_the_cli_holds_a_placeholder_in_its_credentials_mode(
    server: ServerProcess, secret_registry: SecretRegistry
) -> None:
    """The override's variable, on its descriptor, holds a placeholder: not the override,
    and never the baseline beside it."""
    secret = secret_registry.new("fake_broker_override")
    response = post(server, {"message": "hi", "auth_override": {"oauth_token": secret}})
    assert response.status_code == 200, response.text
    report = json.loads(response.json()["response"])
    assert report["served_by"] == "CLAUDE_CODE_OAUTH_TOKEN"
    assert report["descriptors"] == ["CLAUDE_CODE_OAUTH_TOKEN"]
    baseline = server.environ["CLAUDE_CODE_OAUTH_TOKEN"]
    held = set(report["fingerprints"].values())
    assert held.isdisjoint({fingerprint(secret), fingerprint(baseline)})
    # It made no request through the broker: no credential served this turn.
    assert OVERRIDE_HEADER not in response.headers
    meta = response.json()["metadata"]
    assert (meta["api_requests"], meta["fingerprint"]) == (0, None)


@pytest.mark.parametrize(
    "scenario", ["rate_limit_five_hour_oauth", "auth_oauth_401", "billing_credit_low_api_key"]
)
def test_a_printed_refusal_blames_nobody(
    server: ServerProcess, secret_registry: SecretRegistry, scenario: str
) -> None:
    """The CLI prints the real CLI's own refusal; the API never gave it: 500
    execution_error, no switch, no credential named."""
    secret = secret_registry.new(f"fake_broker_{scenario}")
    body = {"message": f"@scenario {scenario}", "auth_override": {"oauth_token": secret}}
    response = post(server, body)
    assert response.status_code == 500, response.text
    detail = response.json()["detail"]
    assert (detail["error_code"], detail["switch_credential"]) == ("execution_error", False)
    assert (detail["resets_at"], detail["metadata"]["fingerprint"]) == (None, None)
    assert OVERRIDE_HEADER not in response.headers


@pytest.mark.parametrize("mode", ["same uid", "spawn user"])
@pytest.mark.parametrize(
    ("runtime", "stand_in", "variable"),
    [("codex", "fake-codex", "OPENAI_API_KEY"), ("gemini-cli", "fake-gemini", "GEMINI_API_KEY")],
)
def test_a_key_only_clis_spawn_holds_only_a_placeholder(
    request: pytest.FixtureRequest,
    module_turn_servers: TurnServers,
    secret_registry: SecretRegistry,
    mode: str,
    runtime: str,
    stand_in: str,
    variable: str,
) -> None:
    """Codex's and Gemini CLI's key, the baseline's and an override's: the CLI's
    environment holds a placeholder in the key's variable, never either key."""
    label = f"{runtime}_{mode}".replace("-", "_").replace(" ", "_")
    baseline, override = secret_registry.new(f"{label}_base"), secret_registry.new(f"{label}_over")
    env = {"AGENT_RUNTIME": runtime, "AGENT_SERVER_BROKER": "1", variable: baseline}
    if mode == "spawn user":
        reach: Reachable = request.getfixturevalue("reachable")
        env |= reach.spawn_environ(reach.stand_in(stand_in))
    else:
        env["AGENT_SERVER_RUNTIME_COMMAND"] = str(FAKE_CLAUDE.with_name(stand_in))
    server = module_turn_servers.start(**env)
    response = post(server, {"message": "hi", "auth_override": {"api_key": override}})
    assert response.status_code == 200, response.text
    report = json.loads(response.json()["response"])
    assert list(report["fingerprints"]) == [variable]
    assert report["fingerprints"][variable] not in {fingerprint(baseline), fingerprint(override)}
