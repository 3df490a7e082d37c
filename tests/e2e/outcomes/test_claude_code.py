"""The §7 outcome contract, live: the real Claude Code CLI through a real server.

One server (and one Messages API stand-in) serves the whole module; every turn picks
its outcome with an `auth_override` whose credential names a stand-in scenario. The
turns run once, concurrently, and each test reads its answer. Two more servers show
the container faults: one without IS_SANDBOX (we run as root), one whose runtime
command does not exist. The module runs twice: the CLI holding its credential, and
through the broker (§4.8), where what differs is what the contract says differs: a
turn the API answered no request of names no credential, the reading is the API's
headers (none without them), and a key's 429 resets when its `retry-after` says.
"""

from __future__ import annotations

import os
import secrets
import signal
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import SecretRegistry
from tests.e2e.conftest import (
    CONTAINER_FAULT_MESSAGE,
    ProcessProbe,
    TurnServers,
)
from tests.support.contract import ERROR_DETAIL_KEYS, stray_controller_words
from tests.support.messages_api import (
    KEY_RETRY_AFTER_S,
    QUIET_CLI,
    UNKNOWN_MODEL,
    Headroom,
    MessagesApiStandIn,
    fingerprint,
    require_real_cli,
)
from tests.support.messages_api import ScenarioCredentials as Credentials
from tests.support.server import ServerProcess, server_environ

pytestmark = [pytest.mark.realcli, pytest.mark.conformance]

RESET_IN_S = 3600
SWITCHING_CODES = frozenset({"rate_limit", "billing", "auth"})


@dataclass(frozen=True)
class Turn:
    """One turn to play: which server, its request body, and whether to kill it mid-way."""

    server: str
    body: dict[str, Any]
    kill: bool = False


@dataclass
class Answer:
    """A live answer, read once and kept for every test of the module."""

    status: int
    headers: httpx.Headers
    json: dict[str, Any]
    text: str
    sent: dict[str, Any] = field(default_factory=dict)

    @property
    def detail(self) -> dict[str, Any]:
        detail = self.json["detail"]
        assert isinstance(detail, dict), self.text
        return detail


@pytest.fixture(scope="module")
def real_claude() -> Path:
    """The real CLI (fails under CI when missing, skips locally)."""
    return require_real_cli()


@pytest.fixture(scope="module")
def api() -> Iterator[MessagesApiStandIn]:
    """One Messages API stand-in for the module; slow requests give up after 10 s."""
    with MessagesApiStandIn(reset_in_s=RESET_IN_S, slow_max_wait_s=10) as stand_in:
        yield stand_in


@pytest.fixture(scope="module")
def credentials(secret_registry: SecretRegistry) -> Credentials:
    """The module's credential values, registered for the leak checks."""
    return Credentials(secret_registry)


@pytest.fixture(scope="module", params=["direct", "brokered"])
def mode(request: pytest.FixtureRequest) -> str:
    """Every row twice: the CLI holding its credential, and through the broker (§4.8),
    where a credential's outcome is what the API answered the broker."""
    return str(request.param)


@pytest.fixture(scope="module")
def claude_servers(
    module_turn_servers: TurnServers, real_claude: Path, api: MessagesApiStandIn, mode: str
) -> dict[str, ServerProcess]:
    """The main server, one without IS_SANDBOX, and one whose runtime command is missing."""
    cli_env = {
        "AGENT_SERVER_RUNTIME_COMMAND": str(real_claude),
        "ANTHROPIC_BASE_URL": api.base_url,
        "AGENT_SERVER_BROKER": "1" if mode == "brokered" else "0",
        **QUIET_CLI,
    }
    main = module_turn_servers.start(**cli_env)
    # server_environ adds IS_SANDBOX=1 for root; this server must not have it at all.
    home = module_turn_servers.home("no-sandbox")
    environ = server_environ(home, **cli_env)
    environ.pop("IS_SANDBOX", None)
    unsandboxed = ServerProcess(environ, home.parent / "no-sandbox-server.log")
    module_turn_servers.started.append(unsandboxed)
    unsandboxed.start()
    missing = module_turn_servers.start(
        **{**cli_env, "AGENT_SERVER_RUNTIME_COMMAND": str(home / "no-such-claude")}
    )
    return {"main": main, "unsandboxed": unsandboxed, "missing": missing}


def _turns(credentials: Credentials, api: MessagesApiStandIn) -> dict[str, Turn]:
    def oauth(scenario: str) -> dict[str, Any]:
        return {"oauth_token": credentials.new(scenario)}

    def task(override: dict[str, Any] | None, **extra: Any) -> dict[str, Any]:
        body: dict[str, Any] = {"message": "hi", "timeout_seconds": 60, **extra}
        if override is not None:
            body["auth_override"] = override
        return body

    gateway = {"base_url": api.base_url, "auth_token": credentials.new("gateway")}
    measured = credentials.new("good")
    api.headroom(measured, Headroom(five_hour=0.91, seven_day=0.35))
    return {
        "success": Turn("main", task(oauth("good"))),
        "headroom": Turn("main", task({"oauth_token": measured})),
        "gateway": Turn("main", task({"provider": gateway})),
        "five_hour": Turn("main", task(oauth("ratelimit"))),
        "seven_day": Turn("main", task(oauth("weekly"))),
        "api_key_429": Turn("main", task({"api_key": credentials.new("ratelimit")})),
        "auth_401": Turn("main", task(oauth("badauth"))),
        "billing": Turn("main", task({"api_key": credentials.new("nocredit")})),
        "model": Turn("main", task(oauth("good"), model=UNKNOWN_MODEL)),
        "overloaded": Turn("main", task(oauth("overloaded"))),
        "server_error": Turn("main", task(oauth("servererror"))),
        "no_credential": Turn("main", task(None)),
        "timeout": Turn("main", task(oauth("slow"), timeout_seconds=1)),
        "killed": Turn("main", task(oauth("slow")), kill=True),
        "root_refusal": Turn("unsandboxed", task(oauth("good"))),
        "missing_runtime": Turn("missing", task(oauth("good"))),
    }


def _kill_when_running(execution_id: str, timeout: float = 20) -> None:
    """SIGKILL the turn's processes (an OOM kill, as far as the server can tell)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        marks = ProcessProbe.of_execution(execution_id)
        if marks:
            for mark in marks:
                if ProcessProbe.survivor(mark) == "alive":
                    os.kill(mark.pid, signal.SIGKILL)
            return
        time.sleep(0.02)
    msg = f"execution {execution_id} never started a process"
    raise AssertionError(msg)


def _play(server: ServerProcess, name: str, turn: Turn) -> Answer:
    body = {**turn.body, "execution_id": f"live-{name}-{secrets.token_hex(4)}"}
    with server.client(timeout=90) as client:
        if turn.kill:
            with ThreadPoolExecutor(1) as pool:
                pending = pool.submit(client.post, "/api/task", json=body)
                _kill_when_running(body["execution_id"])
                response = pending.result(timeout=90)
        else:
            response = client.post("/api/task", json=body)
    return Answer(response.status_code, response.headers, response.json(), response.text, body)


@pytest.fixture(scope="module")
def live(
    claude_servers: dict[str, ServerProcess],
    credentials: Credentials,
    api: MessagesApiStandIn,
) -> dict[str, Answer]:
    """Every turn of the module, played once and concurrently; no body leaks a credential."""
    turns = _turns(credentials, api)
    with ThreadPoolExecutor(len(turns)) as pool:
        futures = {
            name: pool.submit(_play, claude_servers[turn.server], name, turn)
            for name, turn in turns.items()
        }
        answers = {name: future.result(timeout=110) for name, future in futures.items()}
    for name, answer in answers.items():
        leaked = [value for value in credentials.values if value in answer.text]
        assert not leaked, f"{name}: a credential reached the response body"
    return answers


def _assert_error_shape(answer: Answer, error_code: str, *, named: bool = True) -> dict[str, Any]:
    """The §7 body; `named`: the answer names its override's route in the header (with
    the broker, only a turn the API answered a request of does)."""
    detail = answer.detail
    assert set(detail) == set(ERROR_DETAIL_KEYS), answer.text
    assert detail["error_code"] == error_code, answer.text
    assert detail["execution_id"] == answer.sent["execution_id"]
    assert isinstance(detail["execution_log"], list)
    assert isinstance(detail["metadata"], dict)
    assert detail["metadata"]["execution_id"] == answer.sent["execution_id"]
    override = answer.sent.get("auth_override")
    route = next(iter(override)) if override else "baseline"
    assert detail["auth_route"] == route
    expected = route if override and named else None
    assert answer.headers.get("X-Trinity-Auth-Override") == expected
    assert not stray_controller_words(error_code, detail["message"]), detail["message"]
    return detail


# --- successes ------------------------------------------------------------------------


def test_a_served_turn_is_a_success_with_the_override_credential(live: dict[str, Answer]) -> None:
    """The oauth_token override served: the stand-in saw exactly that credential."""
    answer = live["success"]
    assert answer.status == 200, answer.text
    token = answer.sent["auth_override"]["oauth_token"]
    assert answer.json["response"] == f"served-by kind=bearer fp={fingerprint(token)}"
    assert answer.json["metadata"]["auth_route"] == "oauth_token"
    assert answer.headers["X-Trinity-Auth-Override"] == "oauth_token"
    assert answer.json["session_id"]


def test_a_provider_override_reaches_its_gateway(live: dict[str, Answer]) -> None:
    """The provider override's auth token is sent as a bearer to its base URL."""
    answer = live["gateway"]
    assert answer.status == 200, answer.text
    token = answer.sent["auth_override"]["provider"]["auth_token"]
    assert answer.json["response"] == f"served-by kind=bearer fp={fingerprint(token)}"
    assert answer.headers["X-Trinity-Auth-Override"] == "provider"


def _ahead_s(instant: str) -> float:
    moment = datetime.fromisoformat(instant.replace("Z", "+00:00"))
    return (moment - datetime.now(UTC)).total_seconds()


def test_a_success_carries_the_providers_headroom_reading(
    live: dict[str, Answer], claude_servers: dict[str, ServerProcess], mode: str
) -> None:
    """The CLI's rate_limit_event of a served turn is its metadata.rate_limit, and it is
    retained with the result."""
    answer = live["headroom"]
    assert answer.status == 200, answer.text
    reading = answer.json["metadata"]["rate_limit"]
    assert reading["status"] == "allowed_warning"
    assert reading["rate_limit_type"] == "five_hour"
    assert reading["five_hour"]["utilization"] == 0.91
    assert reading["five_hour"]["status"] == "allowed_warning"
    assert reading["seven_day"] == {
        "utilization": 0.35,
        "resets_at": reading["seven_day"]["resets_at"],
        "status": "allowed",
    }
    assert 3400 < _ahead_s(reading["five_hour"]["resets_at"]) <= 3601
    retained = claude_servers["main"].get(f"/api/executions/{answer.sent['execution_id']}/result")
    assert retained.json()["metadata"]["rate_limit"] == reading
    bare = live["success"].json["metadata"]["rate_limit"]
    if mode == "brokered":  # the reading is the API's headers, and there were none
        assert bare is None
        return
    # Without the headers the CLI still reports a reading: allowed, and nothing measured.
    assert bare["status"] == "allowed"
    assert bare["five_hour"] is None
    assert bare["seven_day"] is None


def test_a_wall_is_a_rejected_reading_in_the_failures_metadata(live: dict[str, Answer]) -> None:
    """The rejected rate_limit_event of a 429 is the failed turn's metadata.rate_limit."""
    reading = live["five_hour"].detail["metadata"]["rate_limit"]
    assert reading["status"] == "rejected"
    assert reading["rate_limit_type"] == "five_hour"
    assert reading["five_hour"]["utilization"] == 1
    assert live["auth_401"].detail["metadata"]["rate_limit"] is None


# --- rate limits ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "window"),
    [
        pytest.param("five_hour", "five_hour", id="the five-hour wall"),
        pytest.param("seven_day", "seven_day", id="the weekly wall"),
    ],
)
def test_a_subscription_wall_is_a_rate_limit_with_its_reset(
    live: dict[str, Answer], name: str, window: str
) -> None:
    """429 rate_limit, the window, resets_at about an hour ahead, Retry-After, switch."""
    answer = live[name]
    assert answer.status == 429, answer.text
    detail = _assert_error_shape(answer, "rate_limit")
    assert detail["rate_limit_type"] == window
    assert detail["switch_credential"] is True
    assert detail["retryable"] is False
    assert detail["api_error_status"] == 429
    resets_at = datetime.fromisoformat(detail["resets_at"].replace("Z", "+00:00"))
    ahead = (resets_at - datetime.now(UTC)).total_seconds()
    assert RESET_IN_S - 120 < ahead <= RESET_IN_S + 1
    retry_after = int(answer.headers["Retry-After"])
    assert RESET_IN_S - 120 < retry_after <= RESET_IN_S + 1


def test_an_api_key_429_has_no_invented_reset(live: dict[str, Answer], mode: str) -> None:
    """A per-key 429 is no window's. The CLI reports no reset instant (resets_at null, no
    Retry-After); through the broker the API's own `retry-after` is the reset."""
    answer = live["api_key_429"]
    assert answer.status == 429, answer.text
    detail = _assert_error_shape(answer, "rate_limit")
    assert detail["rate_limit_type"] is None
    assert detail["switch_credential"] is True
    if mode == "direct":
        assert detail["resets_at"] is None
        assert "Retry-After" not in answer.headers
        return
    assert 0 < _ahead_s(detail["resets_at"]) <= KEY_RETRY_AFTER_S + 1
    assert 0 < int(answer.headers["Retry-After"]) <= KEY_RETRY_AFTER_S + 1


# --- auth and billing -----------------------------------------------------------------


def test_a_rejected_token_is_auth(live: dict[str, Answer]) -> None:
    """A 401 from the API answers 503 auth and asks for another credential."""
    answer = live["auth_401"]
    assert answer.status == 503, answer.text
    detail = _assert_error_shape(answer, "auth")
    assert detail["switch_credential"] is True
    assert detail["retryable"] is False
    assert detail["api_error_status"] == 401


def test_no_credential_at_all_is_auth(live: dict[str, Answer]) -> None:
    """With no baseline credential and no override, the CLI is not logged in: 503 auth."""
    answer = live["no_credential"]
    assert answer.status == 503, answer.text
    detail = _assert_error_shape(answer, "auth")
    assert detail["switch_credential"] is True
    assert detail["auth_route"] == "baseline"


def test_a_key_without_credit_is_billing(live: dict[str, Answer]) -> None:
    """The API's 400 'credit balance too low' answers 402 billing, switch."""
    answer = live["billing"]
    assert answer.status == 402, answer.text
    detail = _assert_error_shape(answer, "billing")
    assert detail["switch_credential"] is True
    assert detail["retryable"] is False


# --- no switch ------------------------------------------------------------------------


def test_an_unknown_model_is_a_model_rejection(live: dict[str, Answer]) -> None:
    """claude-nonexistent-9 answers 400 model_unsupported; another credential won't help."""
    answer = live["model"]
    assert answer.status == 400, answer.text
    detail = _assert_error_shape(answer, "model_unsupported")
    assert detail["switch_credential"] is False
    assert detail["message"].startswith("Model unsupported: ")
    assert detail["retryable"] is False


@pytest.mark.parametrize(
    ("name", "api_status"),
    [
        pytest.param("overloaded", 529, id="overloaded 529"),
        pytest.param("server_error", 500, id="internal error 500"),
    ],
)
def test_a_transient_upstream_failure_is_retryable_without_a_switch(
    live: dict[str, Answer], name: str, api_status: int
) -> None:
    """529 and 500 answer 502 upstream_unavailable: retry later, same credential."""
    answer = live[name]
    assert answer.status == 502, answer.text
    detail = _assert_error_shape(answer, "upstream_unavailable")
    assert detail["retryable"] is True
    assert detail["switch_credential"] is False
    assert detail["api_error_status"] == api_status


def test_our_deadline_is_a_timeout(live: dict[str, Answer], mode: str) -> None:
    """A turn past its timeout_seconds answers 504 timeout."""
    answer = live["timeout"]
    assert answer.status == 504, answer.text
    detail = _assert_error_shape(answer, "timeout", named=mode == "direct")
    assert detail["switch_credential"] is False


def test_a_cli_killed_by_a_signal_is_killed(live: dict[str, Answer], mode: str) -> None:
    """The CLI SIGKILLed mid-turn (as by the OOM killer) answers 504 killed."""
    answer = live["killed"]
    assert answer.status == 504, answer.text
    detail = _assert_error_shape(answer, "killed", named=mode == "direct")
    assert detail["switch_credential"] is False
    assert detail["metadata"]["exit_code"] == -signal.SIGKILL


def test_root_without_sandbox_is_a_permission_bypass_fault(
    live: dict[str, Answer], mode: str
) -> None:
    """As root without IS_SANDBOX the CLI refuses bypassPermissions: 503 container_fault."""
    answer = live["root_refusal"]
    assert answer.status == 503, answer.text
    detail = _assert_error_shape(answer, "container_fault", named=mode == "direct")
    assert detail["message"].startswith("Permission bypass failed")
    assert detail["switch_credential"] is False


def test_a_missing_runtime_is_the_literal_container_fault(
    live: dict[str, Answer], mode: str
) -> None:
    """A runtime command that does not exist answers the exact message the controller knows."""
    answer = live["missing_runtime"]
    assert answer.status == 503, answer.text
    detail = _assert_error_shape(answer, "container_fault", named=mode == "direct")
    assert detail["message"] == CONTAINER_FAULT_MESSAGE
    assert detail["switch_credential"] is False


# --- the controller over every live answer --------------------------------------------


def test_the_controller_switches_exactly_on_rate_limit_billing_and_auth(
    live: dict[str, Answer], controller_reason: Callable[[int, str], str | None]
) -> None:
    """Played through the controller's mapping, only rate_limit, billing and auth switch."""
    readings = {}
    for name, answer in live.items():
        if answer.status == 200:
            continue
        detail = answer.detail
        reason = controller_reason(answer.status, detail["message"])
        readings[name] = (detail["error_code"], reason)
        assert (reason is not None) is detail["switch_credential"], (name, answer.text)
        assert (reason is not None) is (detail["error_code"] in SWITCHING_CODES), name
    assert readings == {
        "five_hour": ("rate_limit", "rate_limit"),
        "seven_day": ("rate_limit", "rate_limit"),
        "api_key_429": ("rate_limit", "rate_limit"),
        "auth_401": ("auth", "auth"),
        "no_credential": ("auth", "auth"),
        "billing": ("billing", "auth"),
        "model": ("model_unsupported", None),
        "overloaded": ("upstream_unavailable", None),
        "server_error": ("upstream_unavailable", None),
        "timeout": ("timeout", None),
        "killed": ("killed", None),
        "root_refusal": ("container_fault", None),
        "missing_runtime": ("container_fault", None),
    }


def test_the_stand_in_saw_each_override_credential(
    live: dict[str, Answer], api: MessagesApiStandIn
) -> None:
    """Each override reached the API as its own credential kind (no baseline leaks in)."""
    kinds = {r.fingerprint: r.credential_kind for r in api.message_requests}
    for name in ("five_hour", "auth_401", "overloaded"):
        token = live[name].sent["auth_override"]["oauth_token"]
        assert kinds[fingerprint(token)] == "bearer", name
    for name in ("api_key_429", "billing"):
        key = live[name].sent["auth_override"]["api_key"]
        assert kinds[fingerprint(key)] == "x-api-key", name
