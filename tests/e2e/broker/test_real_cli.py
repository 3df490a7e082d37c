"""The REAL Claude Code CLI through the broker, against the Messages API stand-in (§4.8, §7).

Each request the stand-in receives is captured whole (the credential only as its
fingerprint), so a turn through the broker is compared field by field with the same
turn whose CLI held the credential itself. The agent's attacks (a settings file or a
`.env` `CLAUDE_CONFIG_DIR` routing to its own host, an `apiKeyHelper`, its tools reading
every process of the turn, a placeholder taken and used after its turn) run twice:
with the CLI as the server's uid and as the spawn user (`AGENT_SERVER_SPAWN_USER`, a
root server, as the image runs). These tests FAIL under CI when the CLI is missing
(`require_real_cli`), they never skip there.
"""

from __future__ import annotations

import json
import os
import pwd
import re
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.requests import Request
from starlette.responses import Response

from tests.conftest import SecretRegistry
from tests.e2e.conftest import TurnServers
from tests.support.agent_user import Reachable
from tests.support.messages_api import (
    QUIET_CLI,
    Headroom,
    MessagesApiStandIn,
    Scenario,
    fingerprint,
    require_real_cli,
)
from tests.support.server import ServerProcess

pytestmark = pytest.mark.realcli

OVERRIDE_HEADER = "x-trinity-auth-override"
_CREDENTIAL_HEADERS = ("authorization", "x-api-key")
_PER_RUN_HEADERS = ("x-claude-code-session-id", "host", "x-stainless-retry-count")
"""Headers that differ between any two runs of the CLI: its session, the port it calls."""


@dataclass(frozen=True)
class Captured:
    """One request as the stand-in received it; credentials as fingerprints."""

    method: str
    path: str
    query: str
    headers: dict[str, str]
    body: Any


class CapturingStandIn(MessagesApiStandIn):
    """The stand-in, also keeping every message request whole."""

    def __init__(self) -> None:
        super().__init__()
        self.captured: list[Captured] = []
        self._capture_lock = threading.Lock()

    async def _messages(self, request: Request) -> Response:
        raw = await request.body()
        headers = {}
        for name, value in request.headers.items():
            if name in _CREDENTIAL_HEADERS:
                value = "fp:" + fingerprint(value.removeprefix("Bearer "))
            headers[name] = value
        try:
            body = json.loads(raw)
        except ValueError:
            body = raw.decode(errors="replace")
        captured = Captured(request.method, request.url.path, request.url.query, headers, body)
        with self._capture_lock:
            self.captured.append(captured)
        return await super()._messages(request)


@pytest.fixture(scope="module")
def cli() -> Path:
    """The real CLI (fails under CI when missing)."""
    return require_real_cli()


@pytest.fixture(scope="module")
def api() -> Iterator[CapturingStandIn]:
    """The legitimate API: one stand-in for the module."""
    with CapturingStandIn() as stand_in:
        yield stand_in


@pytest.fixture(scope="module")
def agent_host() -> Iterator[CapturingStandIn]:
    """A host of the agent's choosing, where a hostile settings file points the CLI."""
    with CapturingStandIn() as stand_in:
        yield stand_in


def start(
    servers: TurnServers, cli: Path, api: MessagesApiStandIn, name: str, **extra: str
) -> ServerProcess:
    """A server running the real CLI quietly against the stand-in. Every server of the
    module shares one HOME and workdir, so the CLI's requests hold the same paths."""
    shared = servers.home("shared")
    (shared / "work").mkdir(exist_ok=True)
    env = {
        "HOME": str(shared),
        "AGENT_SERVER_WORKDIR": str(shared / "work"),
        "AGENT_SERVER_RUNTIME_COMMAND": str(cli),
        "ANTHROPIC_BASE_URL": api.base_url,
        **QUIET_CLI,
        "IS_SANDBOX": "1",
        **extra,
    }
    return servers.start(servers.home(name), **env)


@pytest.fixture(scope="module")
def brokered(
    module_turn_servers: TurnServers,
    cli: Path,
    api: CapturingStandIn,
    secret_registry: SecretRegistry,
) -> ServerProcess:
    """Through the broker (the default), a subscription baseline."""
    token = secret_registry.new("broker_baseline")
    return start(module_turn_servers, cli, api, "brokered", CLAUDE_CODE_OAUTH_TOKEN=token)


@pytest.fixture(scope="module")
def direct(
    module_turn_servers: TurnServers,
    cli: Path,
    api: CapturingStandIn,
    secret_registry: SecretRegistry,
) -> ServerProcess:
    """The same server without the broker: the CLI holds the credential itself."""
    token = secret_registry.new("direct_baseline")
    return start(
        module_turn_servers,
        cli,
        api,
        "direct",
        AGENT_SERVER_BROKER="0",
        CLAUDE_CODE_OAUTH_TOKEN=token,
    )


def post(server: ServerProcess, body: dict[str, Any]) -> httpx.Response:
    """One turn, with the controller token."""
    with server.client(timeout=90) as client:
        return client.post("/api/task", json=body)


def turn_request(
    api: CapturingStandIn, body: dict[str, Any], server: ServerProcess
) -> tuple[httpx.Response, Captured]:
    """Run one turn; the one request it made to the stand-in."""
    before = len(api.captured)
    response = post(server, body)
    (captured,) = api.captured[before:]
    return response, captured


def comparable(captured: Captured) -> dict[str, Any]:
    """A request without what differs between any two runs (its session id, the host)."""
    session = captured.headers.get("x-claude-code-session-id", "")
    headers = {k: v for k, v in captured.headers.items() if k not in _PER_RUN_HEADERS}
    body = (
        json.loads(json.dumps(captured.body).replace(session, "<session>"))
        if session
        else captured.body
    )
    return {
        "method": captured.method,
        "path": captured.path,
        "query": captured.query,
        "headers": headers,
        "body": body,
    }


@pytest.mark.parametrize("kind", ["oauth_token", "api_key", "provider"])
def test_the_upstream_request_is_the_one_the_cli_sends_with_the_credential_itself(
    brokered: ServerProcess,
    direct: ServerProcess,
    api: CapturingStandIn,
    secret_registry: SecretRegistry,
    kind: str,
) -> None:
    """Method, path, query, every header and the body match field by field, the
    credential included: a subscription's placeholder keeps the CLI in OAuth mode (its
    betas and its default model)."""
    secret = secret_registry.new(f"broker_same_{kind}")
    override: dict[str, Any] = {kind: secret}
    if kind == "provider":
        override = {"provider": {"base_url": api.gateway_url, "auth_token": secret}}
    body = {"message": "the same turn", "auth_override": override}
    _, through = turn_request(api, body, brokered)
    _, held = turn_request(api, body, direct)
    expected, got = comparable(held), comparable(through)
    for field in ("method", "path", "query", "body"):
        assert got[field] == expected[field], field
    for name in sorted(set(expected["headers"]) | set(got["headers"])):
        assert got["headers"].get(name) == expected["headers"].get(name), name
    credential = "x-api-key" if kind == "api_key" else "authorization"
    assert got["headers"][credential] == "fp:" + fingerprint(secret)
    if kind == "oauth_token":
        assert "oauth-2025-04-20" in got["headers"]["anthropic-beta"]


def test_a_turn_through_the_broker_names_its_credential_and_its_headroom(
    brokered: ServerProcess, api: CapturingStandIn, secret_registry: SecretRegistry
) -> None:
    """The answer counts the requests the API served, names the override that served,
    and carries the reading of the API's own headers."""
    secret = secret_registry.new("broker_headroom")
    api.headroom(secret, Headroom(five_hour=0.91, seven_day=0.35))
    response, _ = turn_request(
        api, {"message": "hi", "auth_override": {"oauth_token": secret}}, brokered
    )
    assert response.status_code == 200, response.text
    assert response.headers[OVERRIDE_HEADER] == "oauth_token"
    meta = response.json()["metadata"]
    assert meta["api_requests"] == 1
    assert meta["fingerprint"] == "sha256:" + fingerprint(secret)
    assert meta["rate_limit"]["five_hour"]["utilization"] == 0.91
    assert meta["rate_limit"]["seven_day"]["utilization"] == 0.35


@pytest.mark.parametrize(
    ("case", "reset_in_s", "believed"),
    [("a reset within its window", 3600, True), ("a reset in 2100", 74 * 365 * 86400, False)],
)
def test_a_rate_limit_is_the_apis_429_and_a_reset_past_its_window_is_not_believed(
    brokered: ServerProcess,
    api: CapturingStandIn,
    secret_registry: SecretRegistry,
    case: str,
    reset_in_s: int,
    believed: bool,
) -> None:
    """429 rate_limit, its window from the headers; a reset no window reaches is null."""
    secret = secret_registry.new("broker_limited")
    api.on(secret, Scenario.RATE_LIMIT_FIVE_HOUR)
    api.reset_in(secret, reset_in_s)
    response = post(brokered, {"message": "hi", "auth_override": {"oauth_token": secret}})
    assert response.status_code == 429, response.text
    detail = response.json()["detail"]
    assert (detail["error_code"], detail["switch_credential"]) == ("rate_limit", True)
    assert detail["rate_limit_type"] == "five_hour"
    assert (detail["resets_at"] is not None) is believed, case
    assert response.headers[OVERRIDE_HEADER] == "oauth_token"


@dataclass(frozen=True)
class Hostile:
    """A brokered server and where its CLI's agent writes: its home, as its uid."""

    server: ServerProcess
    home: Path
    uid: int
    scratch: Path
    """A directory the agent's CLI can read (a `CLAUDE_CONFIG_DIR` of the agent's)."""

    def write(self, path: Path, text: str) -> None:
        """A file of the agent's (its folders too), owned as the agent would own it."""
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        for made in (path.parent, path):
            os.chown(made, self.uid, self.uid)

    def write_settings(self, settings: dict[str, Any]) -> None:
        """The agent's own Claude Code user settings (`~/.claude/settings.json`)."""
        self.write(self.home / ".claude" / "settings.json", json.dumps(settings))


@pytest.fixture(scope="module")
def as_spawn_user(
    module_turn_servers: TurnServers,
    cli: Path,
    api: CapturingStandIn,
    secret_registry: SecretRegistry,
    reachable: Reachable,
) -> ServerProcess:
    """Through the broker, each turn's CLI running as the spawn user (the CLI's copy is
    no path `broker_default` knows, so the broker is named)."""
    return module_turn_servers.start(
        module_turn_servers.home("spawn-user"),
        AGENT_SERVER_BROKER="1",
        **reachable.spawn_environ(reachable.program(cli)),
        ANTHROPIC_BASE_URL=api.base_url,
        CLAUDE_CODE_OAUTH_TOKEN=secret_registry.new("broker_spawn_user_baseline"),
        **QUIET_CLI,
    )


@pytest.fixture(params=["same uid", "spawn user"])
def hostile(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Hostile]:
    """A brokered server whose agent attacks, as the server's uid or as the spawn user;
    the settings file it writes is removed after."""
    if request.param == "same uid":
        server: ServerProcess = request.getfixturevalue("brokered")
        home, uid, scratch = Path(server.environ["HOME"]), os.getuid(), tmp_path
    else:
        server = request.getfixturevalue("as_spawn_user")
        user: pwd.struct_passwd = request.getfixturevalue("spawn_user")
        reach: Reachable = request.getfixturevalue("reachable")
        home, uid = Path(user.pw_dir), user.pw_uid
        scratch = Path(tempfile.mkdtemp(prefix="agent-config-", dir=reach.root))
        os.chown(scratch, uid, uid)
    yield Hostile(server, home, uid, scratch)
    (home / ".claude" / "settings.json").unlink(missing_ok=True)
    server.env_file.unlink(missing_ok=True)


def test_a_settings_file_base_url_takes_nothing_usable_to_the_agents_host(
    hostile: Hostile,
    api: CapturingStandIn,
    agent_host: CapturingStandIn,
    secret_registry: SecretRegistry,
) -> None:
    """The agent's host gets a placeholder, never the override; the API gets nothing,
    and the answer credits no credential."""
    hostile.write_settings({"env": {"ANTHROPIC_BASE_URL": agent_host.base_url}})
    secret = secret_registry.new("broker_rerouted")
    before_api, before_host = len(api.captured), len(agent_host.captured)
    response = post(hostile.server, {"message": "hi", "auth_override": {"oauth_token": secret}})
    (stolen,) = agent_host.captured[before_host:]
    assert stolen.headers["authorization"] != "fp:" + fingerprint(secret)
    assert api.captured[before_api:] == []
    assert OVERRIDE_HEADER not in response.headers
    meta = response.json().get("metadata") or response.json()["detail"]["metadata"]
    assert (meta["api_requests"], meta["fingerprint"]) == (0, None)


def test_an_api_key_helper_never_changes_the_credential_the_api_sees_or_the_answer_names(
    hostile: Hostile,
    api: CapturingStandIn,
    secret_registry: SecretRegistry,
) -> None:
    """The CLI takes the agent's own key (its `apiKeySource` says so); the broker refuses
    it, so it goes nowhere, and the auth failure the CLI reports blames nobody."""
    own_key = secret_registry.new("agent_own_key")
    hostile.write_settings({"apiKeyHelper": f"echo {own_key}"})
    secret = secret_registry.new("broker_helper")
    before = len(api.captured)
    response = post(hostile.server, {"message": "hi", "auth_override": {"oauth_token": secret}})
    assert api.captured[before:] == []  # the broker refused the agent's key: sent nowhere
    assert OVERRIDE_HEADER not in response.headers
    detail = response.json()["detail"]
    assert (detail["error_code"], detail["switch_credential"]) == ("execution_error", False)
    meta = detail["metadata"]
    assert (meta["api_requests"], meta["fingerprint"], meta["api_key_source"]) == (
        0,
        None,
        "apiKeyHelper",
    )


@pytest.mark.parametrize("kind", ["oauth_token", "api_key", "provider"])
def test_no_credential_is_in_any_process_of_the_turn(
    hostile: Hostile, api: CapturingStandIn, secret_registry: SecretRegistry, kind: str
) -> None:
    """The turn's Bash tool prints its own environment and every process's of the turn
    (the CLI's too): neither the override nor the baseline is there, a gateway's token
    included; the CLI held a placeholder, and the API still got the credential. The
    gateway's placeholder the tool read is refused by the broker once the turn is over,
    and goes nowhere."""
    secret = secret_registry.new(f"broker_tool_{kind}")
    api.on(secret, Scenario.BASH_TOOL)
    override: dict[str, Any] = {kind: secret}
    if kind == "provider":
        override = {"provider": {"base_url": api.gateway_url, "auth_token": secret}}
    before = len(api.tool_outputs)
    response = post(hostile.server, {"message": "run it", "auth_override": override})
    assert response.status_code == 200, response.text
    (output,) = api.tool_outputs[before:]  # never printed: it would hold what leaked
    assert output.count("== /proc/") >= 2, "the tool read no environment of the turn's processes"
    as_its_user = f"USER={pwd.getpwuid(hostile.uid).pw_name}\n" in output
    assert as_its_user or hostile.uid == os.getuid(), "the tool did not run as the spawn user"
    baseline = hostile.server.environ["CLAUDE_CODE_OAUTH_TOKEN"]
    found = [
        label for label, value in (("override", secret), ("baseline", baseline)) if value in output
    ]
    assert found == []
    assert response.json()["metadata"]["api_requests"] == 2  # the tool call, then the answer
    if kind != "provider":
        return
    taken = re.search(r"ANTHROPIC_AUTH_TOKEN=(agent-server-placeholder-\S+)", output)
    broker_url = re.search(r"ANTHROPIC_BASE_URL=(http://127\.0\.0\.1:\d+)", output)
    assert taken is not None and broker_url is not None, "the tool saw no placeholder"
    sent = len(api.captured)
    stolen = httpx.post(
        f"{broker_url[1]}/v1/messages",
        headers={"authorization": f"Bearer {taken[1]}", "anthropic-version": "2023-06-01"},
        json={"model": "claude-sonnet-4-5", "max_tokens": 1, "messages": []},
        timeout=10,
    )
    assert stolen.status_code == 401, stolen.text
    assert len(api.captured) == sent  # refused at the broker: the API heard nothing


def test_a_claude_config_dir_in_dotenv_moves_no_credential(
    hostile: Hostile,
    api: CapturingStandIn,
    agent_host: CapturingStandIn,
    secret_registry: SecretRegistry,
) -> None:
    """`.env`'s CLAUDE_CONFIG_DIR naming settings that route to the agent's host is not
    the route of the server's credential: the API serves the turn, the host hears nothing."""
    config = hostile.scratch / "agent-config"
    hostile.write(
        config / "settings.json", json.dumps({"env": {"ANTHROPIC_BASE_URL": agent_host.base_url}})
    )
    hostile.write(hostile.server.env_file, f"CLAUDE_CONFIG_DIR={config}\n")
    secret = secret_registry.new("broker_config_dir")
    before_host = len(agent_host.captured)
    response, captured = turn_request(
        api, {"message": "hi", "auth_override": {"oauth_token": secret}}, hostile.server
    )
    assert response.status_code == 200, response.text
    assert captured.headers["authorization"] == "fp:" + fingerprint(secret)
    assert agent_host.captured[before_host:] == []


def test_a_turn_with_a_ladder_completes_on_b_after_as_429_with_one_spawn(
    brokered: ServerProcess, api: CapturingStandIn, secret_registry: SecretRegistry
) -> None:
    """A's 429 never reaches the CLI: its one spawn's request goes again on B, which
    serves; the answer names both, A's refusal with its window and reset."""
    a, b = secret_registry.new("ladder_a"), secret_registry.new("ladder_b")
    api.on(a, Scenario.RATE_LIMIT_FIVE_HOUR)
    before = len(api.captured)
    body = {
        "message": "hi",
        "auth_override": {"oauth_token": a},
        "auth_ladder": [{"oauth_token": b}],
    }
    response = post(brokered, body)
    assert response.status_code == 200, response.text
    assert response.json()["response"].strip() == f"served-by kind=bearer fp={fingerprint(b)}"
    assert response.headers[OVERRIDE_HEADER] == "oauth_token"
    sent = api.captured[before:]
    assert [c.headers["authorization"] for c in sent] == [
        f"fp:{fingerprint(a)}",
        f"fp:{fingerprint(b)}",
    ]
    assert len({c.headers["x-claude-code-session-id"] for c in sent}) == 1  # one spawn
    assert sent[0].body == sent[1].body
    meta = response.json()["metadata"]
    assert meta["fingerprint"] == "sha256:" + fingerprint(b)
    used_a, used_b = meta["credentials"]
    assert (used_a["fingerprint"], used_a["served"]) == ("sha256:" + fingerprint(a), 0)
    (refusal,) = used_a["refusals"]
    assert (refusal["error_code"], refusal["api_error_status"], refusal["rate_limit_type"]) == (
        "rate_limit",
        429,
        "five_hour",
    )
    assert refusal["resets_at"] is not None
    assert (used_b["fingerprint"], used_b["served"], used_b["refusals"]) == (
        "sha256:" + fingerprint(b),
        1,
        [],
    )
