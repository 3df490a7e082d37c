"""The §7 outcome contract for Codex and Gemini CLI: a real server, fake CLIs.

`fake-codex` and `fake-gemini` are real executables that take the argv our adapters
build and print their CLI's event stream; a prompt directive picks the outcome. One
server a runtime serves the module. Each carries OPENAI_API_KEY, GEMINI_API_KEY,
ANTHROPIC_API_KEY and CLAUDE_CODE_OAUTH_TOKEN in its env: the boot guard, which
strips the API keys beside an OAuth token on a Claude runtime, must not touch them.
"""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import pytest

from agent_server.runtimes.codex import toml_string
from tests.conftest import SecretRegistry
from tests.e2e.conftest import TurnServers
from tests.support.api_stand_in import fingerprint
from tests.support.contract import ERROR_DETAIL_KEYS, stray_controller_words
from tests.support.images import ONE_IMAGE
from tests.support.live import LiveAnswer as Answer
from tests.support.server import FAKE_CODEX, FAKE_GEMINI, ServerProcess

RUNTIMES = ("codex", "gemini-cli")
BASELINE_KEYS = ("OPENAI_API_KEY", "GEMINI_API_KEY", "ANTHROPIC_API_KEY", "CLAUDE_CODE_OAUTH_TOKEN")
SWITCHING_CODES = frozenset({"rate_limit", "billing", "auth"})
GEMINI_RESET = timedelta(hours=1, minutes=49, seconds=8)


@dataclass(frozen=True)
class Runtime:
    """One runtime's server and the baseline credential values it booted with."""

    server: ServerProcess
    baseline: dict[str, str]


@pytest.fixture(scope="module")
def runtimes(
    module_turn_servers: TurnServers, secret_registry: SecretRegistry
) -> dict[str, Runtime]:
    """A codex and a gemini-cli server, each with every provider key in its env."""
    started = {}
    for runtime, command in (("codex", FAKE_CODEX), ("gemini-cli", FAKE_GEMINI)):
        baseline = {
            key: secret_registry.new(f"{runtime}-{key.lower()}".replace("-", ""))
            for key in BASELINE_KEYS
        }
        server = module_turn_servers.start(
            AGENT_RUNTIME=runtime, AGENT_SERVER_RUNTIME_COMMAND=str(command), **baseline
        )
        started[runtime] = Runtime(server, baseline)
    return started


@pytest.fixture(scope="module")
def missing_codex(module_turn_servers: TurnServers) -> ServerProcess:
    """A codex server whose runtime command does not exist."""
    home = module_turn_servers.home("missing-codex")
    return module_turn_servers.start(
        home, AGENT_RUNTIME="codex", AGENT_SERVER_RUNTIME_COMMAND=str(home / "no-such-codex")
    )


TRINITY_SYSTEM_PROMPT = 'You are "agent-1" on Trinity.\nReport to the platform.'
TRINITY_BODY: dict[str, Any] = {
    "model": None,
    "system_prompt": TRINITY_SYSTEM_PROMPT,
    "allowed_tools": ["Read", "Bash"],
    "persist_session": False,
    "images": None,
}
"""What Trinity's backend sends every runtime besides the message (issue 26)."""

# name -> (runtime, prompt, extra body)
TURNS: dict[str, tuple[str, str, dict[str, Any]]] = {
    "codex_success": ("codex", "hello codex", {}),
    "codex_reconnected": ("codex", "@reconnect", {}),
    "codex_usage_limit": ("codex", "@usage-limit", {}),
    "codex_refresh_expired": ("codex", "@refresh-expired", {}),
    "codex_unauthorized": ("codex", "@unauthorized", {}),
    "codex_stream_error": ("codex", "@stream-error", {}),
    "codex_override": ("codex", "hello", {"auth_override": "oauth_token"}),
    "gemini_success": ("gemini-cli", "hello gemini", {"model": "gemini-2.5-flash"}),
    "gemini_resource_exhausted": ("gemini-cli", "@resource-exhausted", {}),
    "gemini_api_key_invalid": ("gemini-cli", "@api-key-invalid", {}),
    "gemini_exit_41": ("gemini-cli", "@exit 41", {}),
    "gemini_exit_53": ("gemini-cli", "@exit 53", {}),
    "gemini_exit_55": ("gemini-cli", "@exit 55", {}),
    "gemini_unavailable": ("gemini-cli", "@unavailable", {}),
    "gemini_override": ("gemini-cli", "hello", {"auth_override": "api_key"}),
    "codex_ephemeral_resume": (
        "codex",
        "hello again",
        {"persist_session": False, "resume_session_id": "019a-codex-thread"},
    ),
    "gemini_resume": (
        "gemini-cli",
        "hello again",
        {"resume_session_id": "3f0b6a2e-1111-4222-8333-944445555666"},
    ),
    "codex_unhonoured": ("codex", "hello", {"max_turns": 3, "images": [ONE_IMAGE]}),
    "gemini_unhonoured": ("gemini-cli", "hello", {"max_turns": 3, "images": [ONE_IMAGE]}),
    "codex_trinity": ("codex", "fix the test", TRINITY_BODY),
    "gemini_trinity": ("gemini-cli", "fix the test", TRINITY_BODY),
}


def _play(server: ServerProcess, name: str, prompt: str, extra: dict[str, Any]) -> Answer:
    body = {"message": prompt, "execution_id": f"{name}-{secrets.token_hex(4)}", **extra}
    return Answer.ask(server, body)


@pytest.fixture(scope="module")
def live(
    runtimes: dict[str, Runtime], missing_codex: ServerProcess, secret_registry: SecretRegistry
) -> dict[str, Answer]:
    """Every turn of the module, played once and concurrently."""
    jobs: dict[str, tuple[ServerProcess, str, dict[str, Any]]] = {}
    for name, (runtime, prompt, extra) in TURNS.items():
        body = dict(extra)
        if "auth_override" in body:
            kind = body["auth_override"]
            body["auth_override"] = {kind: secret_registry.new(f"{name}override")}
        jobs[name] = (runtimes[runtime].server, prompt, body)
    jobs["codex_missing"] = (missing_codex, "hello", {})
    with ThreadPoolExecutor(len(jobs)) as pool:
        futures = {
            name: pool.submit(_play, server, name, prompt, body)
            for name, (server, prompt, body) in jobs.items()
        }
        answers = {name: future.result(timeout=60) for name, future in futures.items()}
    leaked = secret_registry.leaks(answer.text for answer in answers.values())
    assert not leaked, f"credentials reached a response body: {leaked}"
    return answers


def _error(answer: Answer, status: int, error_code: str) -> dict[str, Any]:
    assert answer.status == status, answer.text
    detail = answer.detail
    assert set(detail) == set(ERROR_DETAIL_KEYS)
    assert detail["error_code"] == error_code
    assert detail["execution_id"] == answer.sent["execution_id"]
    assert detail["auth_route"] == "baseline"
    assert isinstance(detail["execution_log"], list)
    assert "X-Trinity-Auth-Override" not in answer.headers
    assert not stray_controller_words(error_code, detail["message"]), detail["message"]
    return detail


def _parse_instant(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


# --- success ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "runtime", "tokens"),
    [
        pytest.param("codex_success", "codex", (120, 7), id="codex"),
        pytest.param("gemini_success", "gemini-cli", (1410, 122), id="gemini"),
    ],
)
def test_a_served_turn_has_the_success_shape(
    live: dict[str, Answer], name: str, runtime: str, tokens: tuple[int, int]
) -> None:
    """Response text, session id and token counts come from the runtime's own stream."""
    answer = live[name]
    assert answer.status == 200, answer.text
    body = answer.json
    assert body["status"] == "success"
    report = answer.report()
    assert report["runtime"] == runtime
    assert report["prompt"] == answer.sent["message"]
    assert body["session_id"]
    assert body["metadata"]["session_id"] == body["session_id"]
    assert (body["metadata"]["input_tokens"], body["metadata"]["output_tokens"]) == tokens
    assert body["metadata"]["auth_route"] == "baseline"
    assert isinstance(body["execution_log"], list) and body["execution_log"]


def test_codex_gets_the_argv_our_adapter_builds(live: dict[str, Answer]) -> None:
    """`exec --json --skip-git-repo-check --dangerously-bypass-approvals-and-sandbox -` (the
    server's default mode is bypassPermissions), the prompt on stdin, not argv."""
    report = live["codex_success"].report()
    assert report["argv"] == [
        "exec", "--json", "--skip-git-repo-check", "--dangerously-bypass-approvals-and-sandbox",
        "-",
    ]  # fmt: skip


def test_codex_takes_ephemeral_and_resume(live: dict[str, Answer]) -> None:
    """`persist_session: false` is `--ephemeral`; a resumed thread is `resume <id>`."""
    answer = live["codex_ephemeral_resume"]
    report = answer.report()
    assert report["argv"] == [
        "exec", "--json", "--skip-git-repo-check", "--dangerously-bypass-approvals-and-sandbox",
        "--ephemeral", "resume", "019a-codex-thread", "-",
    ]  # fmt: skip
    assert answer.json["session_id"] == "019a-codex-thread"


def test_gemini_resumes_a_session_by_id(live: dict[str, Answer]) -> None:
    """`resume_session_id` is `--resume <id>`, and the session reported is the CLI's."""
    answer = live["gemini_resume"]
    assert "--resume" in answer.report()["argv"]
    assert answer.json["session_id"] == "3f0b6a2e-1111-4222-8333-944445555666"


@pytest.mark.parametrize(
    ("name", "runtime", "fields"),
    [
        pytest.param("codex_unhonoured", "codex", ["max_turns", "images"], id="codex"),
        pytest.param("gemini_unhonoured", "gemini-cli", ["max_turns", "images"], id="gemini"),
    ],
)
def test_a_field_the_runtime_cannot_honour_is_a_422(
    live: dict[str, Answer],
    runtimes: dict[str, Runtime],
    name: str,
    runtime: str,
    fields: list[str],
) -> None:
    """A turn cap or images the CLI has no form for are refused by name; nothing runs."""
    answer = live[name]
    assert answer.status == 422, answer.text
    issues = answer.json["detail"]
    assert [issue["loc"] for issue in issues] == [["body", field] for field in fields]
    assert all(runtime in issue["msg"] for issue in issues)
    assert {issue["type"] for issue in issues} == {"unsupported_by_runtime"}
    with runtimes[runtime].server.client() as client:
        finished = client.get("/api/executions/running").json()["recently_completed_ids"]
    assert answer.sent["execution_id"] not in finished


def test_a_gemini_chat_continues_its_conversation(runtimes: dict[str, Runtime]) -> None:
    """The second chat turn resumes the session the first one reported."""
    with runtimes["gemini-cli"].server.client() as client:
        first = client.post("/api/chat", json={"message": "remember 7"})
        second = client.post("/api/chat", json={"message": "what did I say?"})
    assert (first.status_code, second.status_code) == (200, 200), second.text
    session = first.json()["session_id"]
    argv = json.loads(second.json()["response"])["argv"]
    assert argv[argv.index("--resume") + 1] == session
    assert second.json()["session_id"] == session


def test_gemini_gets_the_model_and_yolo(live: dict[str, Answer]) -> None:
    """`--output-format stream-json --model m --yolo --skip-trust`; its init names the session
    and model; as root the server hands it its headless settings (retries off)."""
    answer = live["gemini_success"]
    report = answer.report()
    assert report["argv"] == [
        "--output-format", "stream-json", "--model", "gemini-2.5-flash", "--yolo", "--skip-trust",
    ]  # fmt: skip
    assert answer.json["metadata"]["model"] == "gemini-2.5-flash"
    root = os.geteuid() == 0
    headless = {"general": {"maxAttempts": 1, "sessionRetention": {"enabled": False}}}
    assert report["settings"] == (headless if root else None)


@pytest.mark.parametrize(
    ("name", "runtime", "unenforced"),
    [
        pytest.param("codex_trinity", "codex", ["allowed_tools"], id="codex"),
        pytest.param(
            "gemini_trinity", "gemini-cli", ["allowed_tools", "persist_session"], id="gemini"
        ),
    ],
)
def test_the_body_trinity_sends_every_runtime_runs(
    live: dict[str, Answer],
    runtimes: dict[str, Runtime],
    name: str,
    runtime: str,
    unenforced: list[str],
) -> None:
    """Its system prompt is honoured as the CLI can take it; what the CLI cannot enforce is
    named in the answer's metadata and in a WARNING: never a 422 for a turn that can run."""
    answer = live[name]
    assert answer.status == 200, answer.text
    assert answer.json["metadata"]["not_enforced"] == unenforced
    report = answer.report()
    if runtime == "codex":  # an appended developer message, as Claude Code appends one
        assert report["config"] == {"developer_instructions": toml_string(TRINITY_SYSTEM_PROMPT)}
        assert report["prompt"] == "fix the test"
        assert "--ephemeral" in report["argv"]
    else:  # prepended: GEMINI_SYSTEM_MD would replace the CLI's own instructions
        assert report["prompt"] == f"{TRINITY_SYSTEM_PROMPT}\n\n---\n\nfix the test"
    log = runtimes[runtime].server.log_text()
    assert f"cannot enforce {', '.join(unenforced)}" in log


def test_a_codex_turn_that_reconnected_then_completed_served(live: dict[str, Answer]) -> None:
    """A transient reconnect `error` followed by turn.completed is a success."""
    assert live["codex_reconnected"].status == 200, live["codex_reconnected"].text


# --- rate limits --------------------------------------------------------------------


def test_codex_usage_limit_is_a_rate_limit_at_the_quoted_clock(live: dict[str, Answer]) -> None:
    """`try again at 3:29 PM.` is the next 15:29 UTC: 429 with resets_at and Retry-After."""
    answer = live["codex_usage_limit"]
    detail = _error(answer, 429, "rate_limit")
    assert detail["switch_credential"] is True
    resets_at = _parse_instant(detail["resets_at"])
    assert (resets_at.hour, resets_at.minute, resets_at.second) == (15, 29, 0)
    assert timedelta(0) <= resets_at - answer.asked_at <= timedelta(days=1)
    assert 1 <= int(answer.headers["Retry-After"]) <= 86400
    assert detail["message"].startswith("You\u2019ve hit your usage limit")


def test_gemini_resource_exhausted_is_a_rate_limit_after_its_span(
    live: dict[str, Answer],
) -> None:
    """429 RESOURCE_EXHAUSTED `reset after 1h49m8s`: resets_at that far ahead."""
    answer = live["gemini_resource_exhausted"]
    detail = _error(answer, 429, "rate_limit")
    assert detail["switch_credential"] is True
    assert detail["api_error_status"] == 429
    ahead = _parse_instant(detail["resets_at"]) - answer.asked_at
    assert GEMINI_RESET - timedelta(seconds=5) <= ahead <= GEMINI_RESET + timedelta(seconds=30)
    retry_after = int(answer.headers["Retry-After"])
    assert GEMINI_RESET.total_seconds() - 30 <= retry_after <= GEMINI_RESET.total_seconds() + 1


# --- auth and the rest --------------------------------------------------------------


@pytest.mark.parametrize(
    "name",
    [
        pytest.param("codex_refresh_expired", id="codex refresh token expired"),
        pytest.param("codex_unauthorized", id="codex 401 on stderr"),
        pytest.param("gemini_api_key_invalid", id="gemini API key not valid"),
        pytest.param("gemini_exit_41", id="gemini exit 41"),
    ],
)
def test_auth_failures_are_503_auth(live: dict[str, Answer], name: str) -> None:
    """Every auth failure answers 503 auth and asks for another credential."""
    detail = _error(live[name], 503, "auth")
    assert detail["switch_credential"] is True
    assert detail["retryable"] is False


@pytest.mark.parametrize(
    ("name", "status", "error_code", "retryable"),
    [
        pytest.param("codex_stream_error", 502, "upstream_unavailable", True, id="codex 500"),
        pytest.param("gemini_unavailable", 502, "upstream_unavailable", True, id="gemini 503"),
        pytest.param("gemini_exit_53", 422, "max_turns", False, id="gemini exit 53"),
        pytest.param("gemini_exit_55", 503, "container_fault", False, id="gemini exit 55"),
    ],
)
def test_failures_no_credential_fixes(
    live: dict[str, Answer], name: str, status: int, error_code: str, retryable: bool
) -> None:
    """Upstream trouble and the turn limit never ask for a switch."""
    detail = _error(live[name], status, error_code)
    assert detail["switch_credential"] is False
    assert detail["retryable"] is retryable


def test_a_missing_codex_is_the_container_fault_the_controller_knows(
    live: dict[str, Answer], controller_reason: Callable[[int, str], str | None]
) -> None:
    """A missing runtime answers 503 container_fault that the controller does not switch on."""
    detail = _error(live["codex_missing"], 503, "container_fault")
    assert detail["switch_credential"] is False
    assert controller_reason(503, detail["message"]) is None, detail["message"]


# --- auth_override and the boot guard -----------------------------------------------


@pytest.mark.parametrize(
    ("name", "runtime"),
    [
        pytest.param("codex_override", "codex", id="codex"),
        pytest.param("gemini_override", "gemini-cli", id="gemini"),
    ],
)
def test_an_auth_override_is_ignored_with_a_warning(
    live: dict[str, Answer], runtimes: dict[str, Runtime], name: str, runtime: str
) -> None:
    """No header, auth_route baseline, the baseline keys unchanged, a WARNING logged."""
    answer = live[name]
    assert answer.status == 200, answer.text
    assert "X-Trinity-Auth-Override" not in answer.headers
    assert answer.json["metadata"]["auth_route"] == "baseline"
    (override,) = answer.sent["auth_override"].values()
    report = answer.report()
    assert fingerprint(override) not in report["fingerprints"].values()
    baseline = runtimes[runtime].baseline
    assert report["fingerprints"]["ANTHROPIC_API_KEY"] == fingerprint(baseline["ANTHROPIC_API_KEY"])
    records = [
        json.loads(line)
        for line in runtimes[runtime].server.log_text().splitlines()
        if line.startswith("{")
    ]
    warnings = [
        r
        for r in records
        if r.get("level") == "WARNING"
        and "auth_override" in r.get("message", "")
        and answer.sent["execution_id"] in json.dumps(r)
    ]
    assert warnings, "no WARNING names the ignored auth_override"


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_the_boot_guard_leaves_a_non_claude_runtimes_keys(
    live: dict[str, Answer], runtimes: dict[str, Runtime], runtime: str
) -> None:
    """Every provider key of the server env reaches the spawn with its own value."""
    name = "codex_success" if runtime == "codex" else "gemini_success"
    report = live[name].report()
    baseline = runtimes[runtime].baseline
    assert set(BASELINE_KEYS) <= set(report["env_names"])
    assert report["fingerprints"] == {key: fingerprint(value) for key, value in baseline.items()}
    with runtimes[runtime].server.client() as client:
        status = client.get("/api/credentials/status").json()
    assert status["guard_armed"] is False


# --- the controller -----------------------------------------------------------------


def test_the_controller_switches_exactly_on_rate_limit_and_auth(
    live: dict[str, Answer], controller_reason: Callable[[int, str], str | None]
) -> None:
    """Played through the controller's mapping, only rate_limit, billing and auth switch."""
    for name, answer in live.items():
        if answer.status == 200 or isinstance(answer.json["detail"], list):
            continue  # served, or a request refused before any turn ran
        detail = answer.detail
        switches = controller_reason(answer.status, detail["message"]) is not None
        assert switches is detail["switch_credential"], (name, answer.text)
        assert switches is (detail["error_code"] in SWITCHING_CODES), (name, answer.text)
