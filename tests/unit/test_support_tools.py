"""The test tools themselves: the fake CLI and the Messages API stand-in."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.messages_api import (
    UNKNOWN_MODEL,
    MessagesApiStandIn,
    Scenario,
    fingerprint,
    messages_api_fixture,  # noqa: F401
    real_cli_fixture,  # noqa: F401
)
from tests.support.server import FAKE_CLAUDE

ARGV = ["--print", "--output-format", "stream-json", "--verbose", "--permission-mode", "default"]
OAUTH = "sk-ant-oat01-good-aaaa"
API_KEY = "sk-ant-api03-good-bbbb"


def run_fake(
    prompt: str, *args: str, env: dict[str, str] | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """Run the fake CLI by absolute path, as the server would."""
    return subprocess.run(
        [str(FAKE_CLAUDE), *ARGV, *args],
        input=prompt,
        env={"PATH": os.environ["PATH"], **(env or {})},
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=10,
        check=False,
    )


def events(stdout: str) -> list[dict[str, Any]]:
    """Parse stream-json: every non-empty line must be one JSON object."""
    return [json.loads(line) for line in stdout.splitlines() if line.strip()]


def report(stdout: str) -> dict[str, Any]:
    """Return the fake CLI's JSON report from its result event."""
    result = events(stdout)[-1]
    assert result["type"] == "result"
    parsed: dict[str, Any] = json.loads(result["result"])
    return parsed


# -- the fake CLI ------------------------------------------------------------


def test_fake_cli_is_an_executable_script() -> None:
    """fake-claude is executable and starts with the python3 shebang."""
    assert os.access(FAKE_CLAUDE, os.X_OK)
    assert FAKE_CLAUDE.read_text().startswith("#!/usr/bin/env python3\n")


def test_fake_cli_emits_init_assistant_result(tmp_path: Path) -> None:
    """Without directives the fake answers init, assistant, result, and exits 0."""
    done = run_fake("hello", env={"CLAUDE_CODE_OAUTH_TOKEN": OAUTH}, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    stream = events(done.stdout)
    assert [e["type"] for e in stream] == ["system", "assistant", "result"]
    init, result = stream[0], stream[-1]
    assert init["subtype"] == "init"
    assert init["permissionMode"] == "default"
    assert init["apiKeySource"] == "none"
    assert result["is_error"] is False
    assert result["session_id"] == init["session_id"]
    assert report(done.stdout)["cwd"] == str(tmp_path)


def test_fake_cli_reports_fingerprints_never_values() -> None:
    """Credential values appear only as sha256-12 fingerprints in the report."""
    env = {"CLAUDE_CODE_OAUTH_TOKEN": OAUTH, "ANTHROPIC_BASE_URL": "http://127.0.0.1:9"}
    done = run_fake("hello", env=env)
    assert OAUTH not in done.stdout
    got = report(done.stdout)
    assert got["fingerprints"] == {name: fingerprint(value) for name, value in env.items()}
    assert {"CLAUDE_CODE_OAUTH_TOKEN", "ANTHROPIC_BASE_URL", "PATH"} <= set(got["env_names"])


@pytest.mark.parametrize(
    ("env", "served_by", "api_key_source"),
    [
        pytest.param(
            {"CLAUDE_CODE_OAUTH_TOKEN": OAUTH},
            "CLAUDE_CODE_OAUTH_TOKEN",
            "none",
            id="oauth alone serves",
        ),
        pytest.param(
            {"CLAUDE_CODE_OAUTH_TOKEN": OAUTH, "ANTHROPIC_API_KEY": API_KEY},
            "ANTHROPIC_API_KEY",
            "ANTHROPIC_API_KEY",
            id="an API key shadows the oauth token",
        ),
        pytest.param(
            {"CLAUDE_CODE_OAUTH_TOKEN": OAUTH, "ANTHROPIC_AUTH_TOKEN": "gw-token-1234"},
            "ANTHROPIC_AUTH_TOKEN",
            "none",
            id="an auth token shadows the oauth token",
        ),
        pytest.param(
            {"ANTHROPIC_AUTH_TOKEN": "gw-token-1234", "ANTHROPIC_API_KEY": API_KEY},
            "ANTHROPIC_API_KEY",
            "ANTHROPIC_API_KEY",
            id="an API key beats an auth token",
        ),
        pytest.param({}, None, "none", id="no credential serves nothing"),
    ],
)
def test_fake_cli_follows_the_real_precedence(
    env: dict[str, str], served_by: str | None, api_key_source: str
) -> None:
    """served_by and apiKeySource follow the real CLI's credential precedence."""
    done = run_fake("hello", env=env)
    got = report(done.stdout)
    assert got["served_by"] == served_by
    assert got["fp"] == (fingerprint(env[served_by]) if served_by else None)
    assert events(done.stdout)[0]["apiKeySource"] == api_key_source


def test_fake_cli_records_session_handling() -> None:
    """--resume and --session-id land in the report and in the events' session_id."""
    resumed = run_fake("hi", "--resume", "abc-session", "--no-session-persistence")
    assert report(resumed.stdout)["session"] == {
        "resume": "abc-session",
        "session_id": None,
        "effective": "abc-session",
        "persist": False,
    }
    fresh = run_fake("hi", "--session-id", "new-session")
    assert report(fresh.stdout)["session"]["session_id"] == "new-session"
    assert events(fresh.stdout)[0]["session_id"] == "new-session"


def test_fake_cli_replays_a_fixture_with_our_session() -> None:
    """@scenario replays a reference fixture's events and exit code."""
    done = run_fake("@scenario rate_limit_five_hour_oauth", "--session-id", "s-1")
    assert done.returncode == 1
    stream = events(done.stdout)
    limit = next(e for e in stream if e["type"] == "rate_limit_event")
    assert limit["rate_limit_info"]["rateLimitType"] == "five_hour"
    assert {e["session_id"] for e in stream} == {"s-1"}


def test_fake_cli_unknown_session_matches_the_real_cli() -> None:
    """@unknown-session with --resume prints the real CLI's error result and exits 1."""
    done = run_fake("@unknown-session", "--resume", "gone")
    assert done.returncode == 1
    (result,) = events(done.stdout)
    assert result["subtype"] == "error_during_execution"
    assert result["errors"] == ["No conversation found with session ID: gone"]
    assert done.stderr == "No conversation found with session ID: gone\n"


@pytest.mark.parametrize(
    ("prompt", "returncode", "stderr"),
    [
        pytest.param("@exit 3", 3, "", id="exit code"),
        pytest.param("@kill-self", -signal.SIGKILL, "", id="killed by a signal"),
        pytest.param("@stderr boom\n@exit 2", 2, "boom\n", id="stderr text"),
        pytest.param(
            "@root-refusal",
            1,
            "--dangerously-skip-permissions cannot be used with root/sudo privileges "
            "for security reasons\n",
            id="root refusal",
        ),
    ],
)
def test_fake_cli_exit_directives(prompt: str, returncode: int, stderr: str) -> None:
    """Exit directives end the turn without a result event."""
    done = run_fake(prompt)
    assert done.returncode == returncode
    assert done.stderr == stderr
    assert all(e["type"] != "result" for e in events(done.stdout))


def test_fake_cli_echo_env_prints_the_value() -> None:
    """@echo-env prints a value on purpose, so tests can prove the redactor."""
    done = run_fake("@echo-env CLAUDE_CODE_OAUTH_TOKEN", env={"CLAUDE_CODE_OAUTH_TOKEN": OAUTH})
    texts = [
        e["message"]["content"][0]["text"] for e in events(done.stdout) if e["type"] == "assistant"
    ]
    assert texts[0] == OAUTH


def test_fake_cli_print_bytes_streams_valid_events() -> None:
    """@print-bytes prints at least N bytes of valid assistant events, then a result."""
    done = run_fake("@print-bytes 300000")
    assert len(done.stdout) >= 300_000
    assert events(done.stdout)[-1]["type"] == "result"


def test_fake_cli_grandchild_shares_the_process_group() -> None:
    """@spawn-grandchild starts a sleeper in the fake's process group and names its pid."""
    proc = subprocess.Popen(
        [str(FAKE_CLAUDE), *ARGV],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert proc.stdin is not None
        assert proc.stdout is not None
        proc.stdin.write("@spawn-grandchild 30\n@sleep 30\n")
        proc.stdin.close()
        proc.stdout.readline()  # init
        event = json.loads(proc.stdout.readline())
        assert event["subtype"] == "fake_grandchild"
        assert os.getpgid(event["pid"]) == proc.pid
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=5)
        if proc.stdout is not None:
            proc.stdout.close()


# -- the Messages API stand-in over plain HTTP -------------------------------


def post_message(
    api: MessagesApiStandIn, headers: dict[str, str], model: str = "m"
) -> httpx.Response:
    """Send one streaming Messages request to the stand-in."""
    body = {"model": model, "stream": True, "max_tokens": 8, "messages": []}
    return httpx.post(
        f"{api.base_url}/v1/messages?beta=true", json=body, headers=headers, timeout=5
    )


def test_stand_in_serves_with_the_credential_fingerprint(messages_api: MessagesApiStandIn) -> None:
    """A success names the credential kind and fingerprint, and records no raw value."""
    reply = post_message(messages_api, {"authorization": f"Bearer {OAUTH}"})
    assert reply.status_code == 200
    assert f"served-by kind=bearer fp={fingerprint(OAUTH)}" in reply.text
    (seen,) = messages_api.requests
    assert (seen.credential_kind, seen.fingerprint, seen.model) == (
        "bearer",
        fingerprint(OAUTH),
        "m",
    )
    assert OAUTH not in repr(messages_api.requests)


@pytest.mark.parametrize(
    ("credential", "status", "error_type"),
    [
        pytest.param("sk-ant-oat01-ratelimit-1", 429, "rate_limit_error", id="ratelimit"),
        pytest.param("sk-ant-oat01-weekly-1", 429, "rate_limit_error", id="weekly"),
        pytest.param("sk-ant-oat01-badauth-1", 401, "authentication_error", id="badauth"),
        pytest.param("sk-ant-api03-nocredit-1", 400, "invalid_request_error", id="nocredit"),
        pytest.param("sk-ant-oat01-overloaded-1", 529, "overloaded_error", id="overloaded"),
    ],
)
def test_stand_in_chooses_the_outcome_by_credential(
    messages_api: MessagesApiStandIn, credential: str, status: int, error_type: str
) -> None:
    """Default substrings of the credential choose the error, in the API's error shape."""
    reply = post_message(messages_api, {"authorization": f"Bearer {credential}"})
    assert reply.status_code == status
    assert reply.json()["type"] == "error"
    assert reply.json()["error"]["type"] == error_type


def test_stand_in_sends_unified_rate_limit_headers(messages_api: MessagesApiStandIn) -> None:
    """A weekly cap carries the headers the CLI turns into a rate_limit_event."""
    reply = post_message(messages_api, {"authorization": "Bearer sk-ant-oat01-weekly-1"})
    assert reply.headers["anthropic-ratelimit-unified-status"] == "rejected"
    assert reply.headers["anthropic-ratelimit-unified-representative-claim"] == "seven_day"
    assert int(reply.headers["anthropic-ratelimit-unified-reset"]) > 0


def test_stand_in_registry_beats_substrings_and_model_404(messages_api: MessagesApiStandIn) -> None:
    """api.on() overrides the defaults; an unknown model answers 404."""
    messages_api.on("plain-token-1", Scenario.BILLING)
    assert post_message(messages_api, {"x-api-key": "plain-token-1"}).status_code == 400
    missing = post_message(messages_api, {"x-api-key": API_KEY}, model=UNKNOWN_MODEL)
    assert missing.status_code == 404
    assert missing.json()["error"]["type"] == "not_found_error"


def test_stand_in_slow_waits_for_release(messages_api: MessagesApiStandIn) -> None:
    """A slow credential's request is received and held until api.release()."""
    replies: list[httpx.Response] = []
    headers = {"authorization": "Bearer sk-ant-oat01-slow-1"}
    sender = threading.Thread(target=lambda: replies.append(post_message(messages_api, headers)))
    sender.start()
    messages_api.wait_for_requests(1, timeout=5)
    sender.join(timeout=0.2)
    assert sender.is_alive(), "the slow request answered before release()"
    messages_api.release()
    sender.join(timeout=5)
    assert "served-by" in replies[0].text


# -- the real CLI against the stand-in ---------------------------------------


def run_real(
    cli: Path, api: MessagesApiStandIn, home: Path, **credentials: str
) -> list[dict[str, Any]]:
    """Run one real-CLI turn against the stand-in and return its events."""
    done = subprocess.run(
        [str(cli), *ARGV],
        input="hi",
        env=api.cli_env(home, **credentials),
        cwd=home,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    return events(done.stdout)


@pytest.mark.realcli
@pytest.mark.timeout(30)
def test_real_cli_turn_served_by_oauth_token(
    real_cli: Path, messages_api: MessagesApiStandIn, tmp_path: Path
) -> None:
    """The real CLI sends an OAuth token as Bearer and prints the stand-in's reply."""
    stream = run_real(real_cli, messages_api, tmp_path, CLAUDE_CODE_OAUTH_TOKEN=OAUTH)
    assert stream[-1]["result"] == f"served-by kind=bearer fp={fingerprint(OAUTH)}"
    assert stream[0]["apiKeySource"] == "none"


@pytest.mark.realcli
@pytest.mark.timeout(30)
def test_real_cli_turn_served_by_api_key(
    real_cli: Path, messages_api: MessagesApiStandIn, tmp_path: Path
) -> None:
    """The real CLI sends an API key as x-api-key, shadowing an OAuth token."""
    stream = run_real(
        real_cli, messages_api, tmp_path, CLAUDE_CODE_OAUTH_TOKEN=OAUTH, ANTHROPIC_API_KEY=API_KEY
    )
    assert stream[-1]["result"] == f"served-by kind=x-api-key fp={fingerprint(API_KEY)}"
    assert stream[0]["apiKeySource"] == "ANTHROPIC_API_KEY"


@pytest.mark.realcli
@pytest.mark.timeout(30)
def test_real_cli_reports_the_five_hour_window(
    real_cli: Path, messages_api: MessagesApiStandIn, tmp_path: Path
) -> None:
    """The stand-in's 429 makes the real CLI emit a rejected five_hour rate_limit_event."""
    stream = run_real(
        real_cli, messages_api, tmp_path, CLAUDE_CODE_OAUTH_TOKEN="sk-ant-oat01-ratelimit-1"
    )
    info = next(e for e in stream if e["type"] == "rate_limit_event")["rate_limit_info"]
    assert (info["status"], info["rateLimitType"]) == ("rejected", "five_hour")
    assert info["resetsAt"] > 0
    assert stream[-1]["api_error_status"] == 429
