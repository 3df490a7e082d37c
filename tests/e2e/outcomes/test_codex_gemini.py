"""The §7 outcome contract, live: the real Codex and Gemini CLI through a real server.

The pinned CLIs (`make test`; any others with `make conformance`) run against loopback
stand-ins of the OpenAI Responses API and the Gemini API, which answer by the
credential a request carries. Codex and Gemini CLI take no per-turn credential, so
each credential is one server's baseline key (`OPENAI_API_KEY`, `GEMINI_API_KEY`);
one stand-in a API serves the module. The turns run once, concurrently (a Codex
upstream failure takes its own five reconnects, about 27 s), then the turns that
continue a session; each test reads its answer.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import SecretRegistry
from tests.e2e.conftest import TurnServers
from tests.support.api_stand_in import fingerprint
from tests.support.contract import ERROR_DETAIL_KEYS, stray_controller_words
from tests.support.gemini_api import MODEL as GEMINI_MODEL
from tests.support.gemini_api import UNKNOWN_MODEL as GEMINI_UNKNOWN_MODEL
from tests.support.gemini_api import GeminiApiStandIn
from tests.support.live import LiveAnswer as Answer
from tests.support.openai_api import UNKNOWN_MODEL as CODEX_UNKNOWN_MODEL
from tests.support.openai_api import ResponsesApiStandIn
from tests.support.real_clis import CODEX, GEMINI
from tests.support.server import ServerProcess

pytestmark = [pytest.mark.conformance, pytest.mark.timeout(300)]

SWITCHING_CODES = frozenset({"rate_limit", "billing", "auth"})
SYSTEM_PROMPT = 'You are "agent-7" of Trinity.\nAnswer in one line.'
TRINITY_BODY: dict[str, Any] = {
    "system_prompt": SYSTEM_PROMPT,
    "allowed_tools": ["Read", "Bash"],
    "persist_session": False,
    "images": None,
}
"""What Trinity's backend sends every runtime besides the message and the model."""

# server -> (runtime, the stand-in scenario its key names; None: no key at all)
SERVERS: dict[str, tuple[str, str | None]] = {
    "codex_good": ("codex", "good"),
    "codex_ratelimit": ("codex", "ratelimit"),
    "codex_usagelimit": ("codex", "usagelimit"),
    "codex_nocredit": ("codex", "nocredit"),
    "codex_badauth": ("codex", "badauth"),
    "codex_servererror": ("codex", "servererror"),
    "codex_unavailable": ("codex", "unavailable"),
    "codex_nokey": ("codex", None),
    "gemini_good": ("gemini-cli", "good"),
    "gemini_ratelimit": ("gemini-cli", "ratelimit"),
    "gemini_nocredit": ("gemini-cli", "nocredit"),
    "gemini_badkey": ("gemini-cli", "badkey"),
    "gemini_badauth": ("gemini-cli", "badauth"),
    "gemini_servererror": ("gemini-cli", "servererror"),
    "gemini_unavailable": ("gemini-cli", "unavailable"),
    "gemini_nokey": ("gemini-cli", None),
    "gemini_restricted": ("gemini-cli", "good"),
}

# turn -> (server, body besides the message); the model is the stand-in's unless given
TURNS: dict[str, tuple[str, dict[str, Any]]] = {
    "codex_success": ("codex_good", {}),
    "codex_trinity": ("codex_good", {**TRINITY_BODY}),
    "codex_model": ("codex_good", {"model": CODEX_UNKNOWN_MODEL}),
    "codex_rate_limit": ("codex_ratelimit", {}),
    "codex_usage_limit": ("codex_usagelimit", {}),
    "codex_quota": ("codex_nocredit", {}),
    "codex_auth_401": ("codex_badauth", {}),
    "codex_server_error": ("codex_servererror", {}),
    "codex_unavailable": ("codex_unavailable", {}),
    "codex_missing_key": ("codex_nokey", {}),
    "gemini_success": ("gemini_good", {}),
    "gemini_trinity": ("gemini_good", {**TRINITY_BODY}),
    "gemini_model": ("gemini_good", {"model": GEMINI_UNKNOWN_MODEL}),
    "gemini_rate_limit": ("gemini_ratelimit", {}),
    "gemini_daily_quota": ("gemini_nocredit", {}),
    "gemini_key_invalid": ("gemini_badkey", {}),
    "gemini_auth_401": ("gemini_badauth", {}),
    "gemini_server_error": ("gemini_servererror", {}),
    "gemini_unavailable": ("gemini_unavailable", {}),
    "gemini_missing_key": ("gemini_nokey", {}),
    "gemini_restricted": ("gemini_restricted", {}),
}


@dataclass(frozen=True)
class Agent:
    """One server and the key it was started with."""

    server: ServerProcess
    key: str | None


@pytest.fixture(scope="module")
def apis() -> Iterator[tuple[ResponsesApiStandIn, GeminiApiStandIn]]:
    """One stand-in of each API for the module."""
    with ResponsesApiStandIn() as openai, GeminiApiStandIn() as gemini:
        yield openai, gemini


@pytest.fixture(scope="module", params=["direct", "brokered"])
def mode(request: pytest.FixtureRequest) -> str:
    """Every row twice: the CLI holding its key, and through the broker (§4.8), where
    the key's outcome is what the API answered the broker."""
    return str(request.param)


def _environ(
    runtime: str,
    key: str | None,
    home: Path,
    apis: tuple[ResponsesApiStandIn, GeminiApiStandIn],
    mode: str,
) -> dict[str, str]:
    """A server's environment: the real CLI, pointed at its stand-in, with `key`."""
    openai, gemini = apis
    # Codex words a reset in the CLI's local time: the container's clock, UTC.
    env = {
        "AGENT_RUNTIME": runtime,
        "TZ": "UTC",
        "AGENT_SERVER_BROKER": "1" if mode == "brokered" else "0",
    }
    if runtime == "codex":
        env["AGENT_SERVER_RUNTIME_COMMAND"] = str(CODEX.require())
        env["CODEX_HOME"] = str(openai.write_codex_home(home / "codex-home"))
        # Through the broker, the key's upstream is the server's OPENAI_BASE_URL.
        env["OPENAI_BASE_URL"] = f"{openai.base_url}/v1"
        if key is not None:
            env["OPENAI_API_KEY"] = key
    else:
        env["AGENT_SERVER_RUNTIME_COMMAND"] = str(GEMINI.require())
        env["GOOGLE_GEMINI_BASE_URL"] = gemini.base_url
        if key is not None:
            env["GEMINI_API_KEY"] = key
    return env


@pytest.fixture(scope="module")
def agents(
    module_turn_servers: TurnServers,
    secret_registry: SecretRegistry,
    apis: tuple[ResponsesApiStandIn, GeminiApiStandIn],
    mode: str,
) -> dict[str, Agent]:
    """Every server of the module, started concurrently."""

    def start(name: str) -> Agent:
        runtime, scenario = SERVERS[name]
        key = None
        if scenario is not None:
            key = secret_registry.add(name, f"tsec{scenario}{secrets.token_hex(10)}")
        home = module_turn_servers.home(name)
        env = _environ(runtime, key, home, apis, mode)
        if name == "gemini_restricted":
            env["GEMINI_RESTRICTED_MODE"] = "true"
        return Agent(module_turn_servers.start(home, **env), key)

    with ThreadPoolExecutor(4) as pool:
        started = dict(zip(SERVERS, pool.map(start, SERVERS), strict=True))
    return started


def _play(agent: Agent, name: str, body: dict[str, Any]) -> Answer:
    runtime = "codex" if name.startswith("codex") else "gemini"
    model = None if runtime == "codex" else GEMINI_MODEL  # codex: its config.toml's
    sent = {
        "message": f"say hi ({name})",
        "model": model,
        "timeout_seconds": 120,
        "execution_id": f"conf-{name}-{secrets.token_hex(4)}",
        **body,
    }
    return Answer.ask(agent.server, sent, timeout=150)


@pytest.fixture(scope="module")
def live(agents: dict[str, Agent], secret_registry: SecretRegistry) -> dict[str, Answer]:
    """Every turn of the module, played once and concurrently; no body leaks a key."""
    with ThreadPoolExecutor(len(TURNS)) as pool:
        futures = {
            name: pool.submit(_play, agents[server], name, body)
            for name, (server, body) in TURNS.items()
        }
        answers = {name: future.result(timeout=170) for name, future in futures.items()}
    leaked = secret_registry.leaks(answer.text for answer in answers.values())
    assert not leaked, f"a key reached a response body: {leaked}"
    return answers


def _error(answer: Answer, status: int, error_code: str) -> dict[str, Any]:
    """The §7 body of a failed turn, checked against the contract's table."""
    assert answer.status == status, answer.text
    detail = answer.detail
    assert set(detail) == set(ERROR_DETAIL_KEYS)
    assert detail["error_code"] == error_code, answer.text
    assert detail["execution_id"] == answer.sent["execution_id"]
    assert detail["auth_route"] == "baseline"
    assert detail["switch_credential"] is (error_code in SWITCHING_CODES)
    assert detail["retryable"] is (error_code == "upstream_unavailable")
    assert isinstance(detail["execution_log"], list)
    assert not stray_controller_words(error_code, detail["message"]), detail["message"]
    return detail


# --- successes ----------------------------------------------------------------------


@pytest.mark.parametrize("name", ["codex_success", "gemini_success"])
def test_a_key_that_serves_is_a_success(
    live: dict[str, Answer], agents: dict[str, Agent], name: str
) -> None:
    """The reply names the server's own key; the session is the CLI's; usage is read."""
    answer = live[name]
    assert answer.status == 200, answer.text
    body = answer.json
    key = agents[TURNS[name][0]].key
    assert key is not None
    assert body["response"] == f"served-by fp={fingerprint(key)}"
    assert body["session_id"] and body["metadata"]["session_id"] == body["session_id"]
    assert (body["metadata"]["input_tokens"], body["metadata"]["output_tokens"]) == (1500, 5)
    assert body["metadata"]["not_enforced"] == []


@pytest.mark.parametrize(
    ("name", "unenforced"),
    [
        pytest.param("codex_trinity", ["allowed_tools"], id="codex"),
        pytest.param("gemini_trinity", ["allowed_tools", "persist_session"], id="gemini"),
    ],
)
def test_the_body_trinity_sends_runs_with_its_system_prompt(
    live: dict[str, Answer],
    apis: tuple[ResponsesApiStandIn, GeminiApiStandIn],
    agents: dict[str, Agent],
    name: str,
    unenforced: list[str],
) -> None:
    """The API saw the system prompt (Codex: a developer message after its own
    instructions; Gemini CLI: before the prompt); what cannot be enforced is named."""
    answer = live[name]
    assert answer.status == 200, answer.text
    assert answer.json["metadata"]["not_enforced"] == unenforced
    api = apis[0] if name.startswith("codex") else apis[1]
    key = agents[TURNS[name][0]].key
    assert key is not None
    seen = [r for r in api.by_credential(key) if answer.sent["message"] in r.user_text]
    assert seen, "the stand-in never saw this turn"
    if name.startswith("codex"):
        assert SYSTEM_PROMPT in seen[-1].system_text
        assert SYSTEM_PROMPT not in seen[-1].user_text
    else:
        assert seen[-1].user_text.endswith(f"{SYSTEM_PROMPT}\n\n---\n\n{answer.sent['message']}")


# --- rate limits, billing, auth -----------------------------------------------------


@pytest.mark.parametrize(
    ("name", "api_status", "reset_in"),
    [
        pytest.param("codex_rate_limit", None, None, id="codex 429 rate_limit_exceeded"),
        pytest.param("codex_usage_limit", None, timedelta(hours=1), id="codex usage limit"),
        pytest.param("gemini_rate_limit", 429, timedelta(hours=1), id="gemini per-minute quota"),
        pytest.param("gemini_daily_quota", 429, None, id="gemini per-day quota"),
    ],
)
def test_a_rate_limit_is_429_with_its_reset_when_the_cli_names_one(
    live: dict[str, Answer],
    mode: str,
    name: str,
    api_status: int | None,
    reset_in: timedelta | None,
) -> None:
    """429 rate_limit, switch; resets_at and Retry-After only when the CLI names a reset
    (Codex words it to the minute: `try again at 6:48 AM.`; Gemini CLI counts from the
    answer: `Please retry in 3600s.`) or, through the broker, the API's answer does.
    Through the broker the API's status is the exchange's, whatever the CLI prints."""
    answer = live[name]
    detail = _error(answer, 429, "rate_limit")
    assert detail["api_error_status"] == (429 if mode == "brokered" else api_status)
    if reset_in is None:
        assert detail["resets_at"] is None
        assert "Retry-After" not in answer.headers
        return
    resets_at = datetime.fromisoformat(detail["resets_at"].replace("Z", "+00:00"))
    took = answer.answered_at - answer.asked_at + timedelta(seconds=1)
    assert reset_in - timedelta(minutes=2) <= resets_at - answer.asked_at <= reset_in + took
    assert 0 < int(answer.headers["Retry-After"]) <= reset_in.total_seconds()


@pytest.mark.parametrize(
    ("name", "status", "error_code"),
    [
        pytest.param("codex_quota", 402, "billing", id="codex insufficient_quota is billing"),
        pytest.param("codex_auth_401", 503, "auth", id="codex 401 is auth"),
        pytest.param("codex_missing_key", 503, "auth", id="codex with no key is auth"),
        pytest.param("gemini_key_invalid", 503, "auth", id="gemini API_KEY_INVALID is auth"),
        pytest.param("gemini_auth_401", 503, "auth", id="gemini 401 is auth"),
        pytest.param("gemini_missing_key", 503, "auth", id="gemini with no key is auth"),
    ],
)
def test_a_credential_problem_asks_for_another(
    live: dict[str, Answer], name: str, status: int, error_code: str
) -> None:
    """Billing and auth answer their status and switch_credential."""
    _error(live[name], status, error_code)


# --- no switch ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "model"),
    [
        pytest.param("codex_model", CODEX_UNKNOWN_MODEL, id="codex"),
        pytest.param("gemini_model", GEMINI_UNKNOWN_MODEL, id="gemini"),
    ],
)
def test_an_unknown_model_is_a_model_rejection(
    live: dict[str, Answer], name: str, model: str
) -> None:
    """400 model_unsupported; the message is the CLI's error (never its warning)."""
    detail = _error(live[name], 400, "model_unsupported")
    assert detail["message"].startswith("Model unsupported: ")
    assert model in detail["message"]
    assert "metadata" not in detail["message"].lower()


@pytest.mark.parametrize(
    "name",
    ["codex_server_error", "codex_unavailable", "gemini_server_error", "gemini_unavailable"],
)
def test_an_upstream_failure_is_retryable_without_a_switch(
    live: dict[str, Answer], name: str
) -> None:
    """500 and 503 answer 502 upstream_unavailable (Codex's 500 says only `high demand`)."""
    _error(live[name], 502, "upstream_unavailable")


def test_a_gemini_cli_that_refuses_to_run_here_is_the_containers(
    live: dict[str, Answer], controller_reason: Callable[[int, str], str | None]
) -> None:
    """Restricted mode (no workdir trusted): 503 container_fault the controller never
    switches on, whatever the key."""
    detail = _error(live["gemini_restricted"], 503, "container_fault")
    assert detail["message"].startswith("Permission bypass failed: Gemini CLI refuses")
    assert controller_reason(503, detail["message"]) is None


# --- /health knows before a turn runs -----------------------------------------------------


@pytest.mark.parametrize(
    ("server", "word"),
    [
        pytest.param("gemini_nokey", "no credential", id="gemini without a key"),
        pytest.param("gemini_restricted", "restricted mode", id="gemini in restricted mode"),
        pytest.param("gemini_good", None, id="gemini that can run"),
        pytest.param("codex_good", None, id="codex that can run"),
    ],
)
def test_health_says_whether_a_turn_can_run(
    agents: dict[str, Agent], server: str, word: str | None
) -> None:
    """Checked at boot: degraded with the reason, named without a value."""
    body = agents[server].server.get("/health").json()
    assert body["runtime_available"] is True
    if word is None:
        assert (body["status"], body["problems"]) == ("ok", [])
        return
    assert body["status"] == "degraded"
    assert any(word in problem for problem in body["problems"]), body


# --- sessions -----------------------------------------------------------------------


@pytest.mark.parametrize("runtime", ["codex", "gemini"])
def test_a_session_continues(
    live: dict[str, Answer], agents: dict[str, Agent], runtime: str
) -> None:
    """resume_session_id continues the real CLI's session: the same id comes back."""
    first = live[f"{runtime}_success"]
    session = first.json["session_id"]
    again = _play(agents[f"{runtime}_good"], f"{runtime}_resume", {"resume_session_id": session})
    assert again.status == 200, again.text
    assert again.json["session_id"] == session


# --- the controller -----------------------------------------------------------------


def test_the_controller_switches_exactly_on_rate_limit_billing_and_auth(
    live: dict[str, Answer], controller_reason: Callable[[int, str], str | None]
) -> None:
    """Played through the controller's mapping, only rate_limit, billing and auth switch."""
    for name, answer in live.items():
        if answer.status == 200:
            continue
        detail = answer.detail
        switches = controller_reason(answer.status, detail["message"]) is not None
        assert switches is detail["switch_credential"], (name, answer.text)
        assert switches is (detail["error_code"] in SWITCHING_CODES), (name, answer.text)


def test_a_gemini_turn_leaves_a_concurrent_turns_new_session(
    live: dict[str, Answer], agents: dict[str, Agent]
) -> None:
    """A session another turn has just begun (nothing resumable in it yet) survives a
    turn that starts meanwhile: Gemini CLI's own cleanup, which deletes such a session
    at every start, is off in the server's headless settings (§6.3)."""
    assert live["gemini_success"].status == 200
    agent = agents["gemini_good"]
    (chats,) = Path(agent.server.environ["HOME"]).glob(".gemini/tmp/*/chats")
    begun = chats / "session-2026-01-01T00-00-5e55b0a1.jsonl"
    begun.write_text(
        '{"sessionId":"5e55b0a1-0000-4000-8000-000000000001","startTime":'
        '"2026-01-01T00:00:00.000Z","lastUpdated":"2026-01-01T00:00:00.000Z","kind":"main"}\n'
    )
    try:
        answer = _play(agent, "gemini_meanwhile", {})
        assert answer.status == 200, answer.text
        assert begun.exists(), "the turn's Gemini CLI deleted another turn's new session"
    finally:
        begun.unlink(missing_ok=True)
