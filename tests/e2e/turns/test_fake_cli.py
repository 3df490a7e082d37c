"""Turns through a real server and the fake Claude Code CLI (contract §4, §6).

The fake is a real executable that reports what it received: env names, credential
fingerprints, argv and session flags. So every assertion here is about the spawn
the server really made, not about what the server says it made.
"""

from __future__ import annotations

import json
import re
import stat
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from tests.conftest import SecretRegistry
from tests.e2e.conftest import TurnServers, wait_listed
from tests.support.fake_claude import PROVIDER_SWITCHES
from tests.support.messages_api import fingerprint
from tests.support.server import ServerProcess

OVERRIDE_HEADER = "X-Trinity-Auth-Override"
UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$")
SHADOW_NAMES = {"ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", *PROVIDER_SWITCHES}


def report(body: dict[str, Any]) -> dict[str, Any]:
    """The fake CLI's JSON report of what its spawn received."""
    result: dict[str, Any] = json.loads(body["response"])
    return result


def post(server: ServerProcess, path: str, body: dict[str, Any]) -> httpx.Response:
    """POST a turn with the controller token (one client per call: safe from threads)."""
    with server.client(timeout=90) as client:
        return client.post(path, json=body)


def running(server: ServerProcess) -> dict[str, Any]:
    """`GET /api/executions/running`."""
    with server.client() as client:
        response = client.get("/api/executions/running")
    assert response.status_code == 200, response.text
    result: dict[str, Any] = response.json()
    return result


def generation_and_fp(server: ServerProcess) -> tuple[int, str | None]:
    """The current credential generation and active token fingerprint."""
    with server.client() as client:
        status = client.get("/api/credentials/status").json()
    return int(status["generation"]), status["fingerprint"]


@pytest.fixture(scope="module")
def baseline_token(secret_registry: SecretRegistry) -> str:
    """The subscription token in the module server's process env."""
    return secret_registry.new("baseline_oauth")


@pytest.fixture(scope="module")
def server(
    module_turn_servers: TurnServers, secret_registry: SecretRegistry, baseline_token: str
) -> ServerProcess:
    """One guarded server: OAuth baseline, a `.env` full of stale keys and server-only names."""
    home = module_turn_servers.home("guarded")
    stale_key = secret_registry.new("stale_env_api_key")
    stale_auth = secret_registry.new("stale_env_auth_token")
    (home / ".env").write_text(
        f"ANTHROPIC_API_KEY={stale_key}\n"
        f"export ANTHROPIC_AUTH_TOKEN={stale_auth}\n"
        "CLAUDE_CODE_USE_BEDROCK=1\n"
        f"TRINITY_AGENT_AUTH_TOKEN={secret_registry.new('env_controller')}\n"
        "AGENT_SERVER_MAX_PARALLEL=1\n"
        "AGENT_SERVER_EXTRA=from-env-file\n"
        "AGENT_VISIBLE=yes\n"
    )
    return module_turn_servers.start(
        home,
        CLAUDE_CODE_OAUTH_TOKEN=baseline_token,
        AGENT_SERVER_SHUTDOWN_GRACE_S="5",
    )


# --- credentials reach exactly one spawn --------------------------------------------


def test_baseline_turn_is_served_by_the_subscription_token_despite_stale_env_keys(
    server: ServerProcess, baseline_token: str
) -> None:
    """The guard keeps `.env`'s API key and provider switch out of a baseline spawn."""
    response = post(server, "/api/task", {"message": "hello"})
    assert response.status_code == 200, response.text
    body = response.json()
    seen = report(body)
    assert seen["served_by"] == "CLAUDE_CODE_OAUTH_TOKEN"
    assert seen["fingerprints"] == {"CLAUDE_CODE_OAUTH_TOKEN": fingerprint(baseline_token)}
    assert not SHADOW_NAMES & set(seen["env_names"])
    assert OVERRIDE_HEADER.lower() not in response.headers
    meta = body["metadata"]
    assert meta["auth_route"] == "baseline"
    assert meta["fingerprint"] == "sha256:" + fingerprint(baseline_token)
    assert meta["api_key_source"] == "none"
    assert (meta["generation"], meta["fingerprint"]) == generation_and_fp(server)


def test_spawn_never_receives_the_controller_token_or_server_settings(
    server: ServerProcess,
) -> None:
    """Neither the process env nor `.env` can hand a spawn a server-only name."""
    response = post(server, "/api/task", {"message": "env", "execution_id": "env-names-1"})
    assert response.status_code == 200, response.text
    names = set(report(response.json())["env_names"])
    assert "TRINITY_AGENT_AUTH_TOKEN" not in names
    assert not [n for n in names if n.startswith("AGENT_SERVER_")]
    assert "AGENT_VISIBLE" in names  # `.env` itself does reach the spawn
    assert "TRINITY_EXECUTION_ID" in names


def test_each_parallel_turn_sees_exactly_its_own_credential_across_reloads(
    turn_servers: TurnServers, secret_registry: SecretRegistry
) -> None:
    """16 overlapping turns with mixed overrides, interleaved with 3 reloads."""
    home = turn_servers.home()
    (home / ".env").write_text(
        f"ANTHROPIC_API_KEY={secret_registry.new('par_env_key')}\nCLAUDE_CODE_USE_VERTEX=1\n"
    )
    server = turn_servers.start(home, CLAUDE_CODE_OAUTH_TOKEN=secret_registry.new("par_gen0"))
    generations = dict([generation_and_fp(server)])
    kinds = ["oauth_token", "api_key", "provider", "none"]
    asked: list[tuple[str, str | None, dict[str, Any]]] = []
    futures: list[Future[httpx.Response]] = []
    with ThreadPoolExecutor(16) as pool:
        for round_ in range(4):
            for kind in kinds:
                index = len(asked)
                body: dict[str, Any] = {
                    "message": f"turn {index}\n@sleep 0.4",
                    "execution_id": f"par-{index}",
                }
                secret = None if kind == "none" else secret_registry.new(f"par{kind}{index}")
                if kind in ("oauth_token", "api_key"):
                    body["auth_override"] = {kind: secret}
                elif kind == "provider":
                    body["model"] = "claude-asked-model"
                    body["auth_override"] = {
                        "provider": {
                            "base_url": f"http://127.0.0.1:9/gw{index}",
                            "auth_token": secret,
                            "model": f"glm-{index}",
                        }
                    }
                asked.append((kind, secret, body))
                futures.append(pool.submit(post, server, "/api/task", body))
            time.sleep(0.15)
            if round_ < 3:
                token = secret_registry.new(f"par_gen{round_ + 1}")
                with server.client() as client:
                    reload = client.post(
                        "/api/credentials/reload-token",
                        json={"token": token, "remove_api_key": True},
                    )
                assert reload.status_code == 200, reload.text
                assert reload.json()["fingerprint"] == "sha256:" + fingerprint(token)
                generations[reload.json()["generation"]] = reload.json()["fingerprint"]
        responses = [f.result() for f in futures]

    baseline_generations = set()
    for (kind, secret, body), response in zip(asked, responses, strict=True):
        assert response.status_code == 200, response.text
        answer = response.json()
        seen = report(answer)
        meta = answer["metadata"]
        assert meta["execution_id"] == body["execution_id"]
        assert not set(PROVIDER_SWITCHES) & set(seen["env_names"]), kind
        assert response.headers.get(OVERRIDE_HEADER) == (None if kind == "none" else kind)
        assert meta["auth_route"] == ("baseline" if kind == "none" else kind)
        if kind == "none":
            (fp,) = seen["fingerprints"].values()
            assert set(seen["fingerprints"]) == {"CLAUDE_CODE_OAUTH_TOKEN"}
            assert generations[meta["generation"]] == meta["fingerprint"] == "sha256:" + fp
            baseline_generations.add(meta["generation"])
            continue
        assert secret is not None
        assert meta["fingerprint"] == "sha256:" + fingerprint(secret)
        assert secret not in " ".join(seen["argv"])
        if kind == "oauth_token":
            assert seen["fingerprints"] == {"CLAUDE_CODE_OAUTH_TOKEN": fingerprint(secret)}
        elif kind == "api_key":
            assert seen["fingerprints"] == {"ANTHROPIC_API_KEY": fingerprint(secret)}
            assert seen["served_by"] == "ANTHROPIC_API_KEY"
        else:
            provider = body["auth_override"]["provider"]
            assert seen["fingerprints"] == {
                "ANTHROPIC_AUTH_TOKEN": fingerprint(secret),
                "ANTHROPIC_BASE_URL": fingerprint(provider["base_url"]),
            }
            assert seen["model"] == provider["model"]
    assert len(baseline_generations) >= 2, "the reloads did not interleave with the turns"


# --- argv and sessions ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("extra", "check"),
    [
        pytest.param(
            {},
            lambda s: (
                UUID.match(s["session"]["session_id"])
                and s["session"]["resume"] is None
                and s["session"]["persist"]
            ),
            id="a task starts a fresh uuid4 session",
        ),
        pytest.param(
            {"persist_session": False},
            lambda s: "--no-session-persistence" in s["argv"] and not s["session"]["persist"],
            id="persist_session false adds --no-session-persistence",
        ),
        pytest.param(
            {"resume_session_id": "a1b2c3d4-0000-4000-8000-000000000001"},
            lambda s: (
                s["session"]["resume"] == "a1b2c3d4-0000-4000-8000-000000000001"
                and "--session-id" not in s["argv"]
            ),
            id="resume_session_id resumes that session",
        ),
        pytest.param(
            {"model": "claude-x-1", "max_turns": 3, "system_prompt": "be brief"},
            lambda s: (
                s["model"] == "claude-x-1"
                and s["max_turns"] == 3
                and s["append_system_prompt"] == "be brief"
            ),
            id="model, max_turns and system prompt reach argv",
        ),
        pytest.param(
            {"allowed_tools": ["Read", "Bash(git:*)"]},
            lambda s: s["allowed_tools"] == ["Read,Bash(git:*)"],
            id="allowed tools reach argv",
        ),
    ],
)
def test_task_argv(server: ServerProcess, extra: dict[str, Any], check: Callable[..., Any]) -> None:
    """The task's fields become the CLI's print-mode flags."""
    response = post(server, "/api/task", {"message": "argv", **extra})
    assert response.status_code == 200, response.text
    seen = report(response.json())
    assert check(seen), seen["argv"]
    assert seen["argv"][:6] == [
        "--print",
        "--output-format",
        "stream-json",
        "--verbose",
        "--permission-mode",
        "bypassPermissions",
    ]
    assert seen["prompt"].startswith("argv")  # on stdin, never in argv
    assert "argv" not in seen["argv"]


def test_provider_override_rewrites_model_and_routes_to_the_gateway(
    server: ServerProcess, secret_registry: SecretRegistry
) -> None:
    """Provider: `--model` becomes the given model; only the gateway's credential stays."""
    token = secret_registry.new("gateway_token")
    provider = {"base_url": "https://gateway.invalid/api", "auth_token": token, "model": "glm-4.6"}
    response = post(
        server,
        "/api/task",
        {"message": "gw", "model": "claude-sonnet-x", "auth_override": {"provider": provider}},
    )
    assert response.status_code == 200, response.text
    assert response.headers[OVERRIDE_HEADER] == "provider"
    seen = report(response.json())
    assert seen["argv"][seen["argv"].index("--model") + 1] == "glm-4.6"
    assert seen["served_by"] == "ANTHROPIC_AUTH_TOKEN"
    assert seen["fingerprints"] == {
        "ANTHROPIC_AUTH_TOKEN": fingerprint(token),
        "ANTHROPIC_BASE_URL": fingerprint(provider["base_url"]),
    }
    assert "CLAUDE_CODE_OAUTH_TOKEN" not in seen["env_names"]
    assert "ANTHROPIC_API_KEY" not in seen["env_names"]


# --- validation -----------------------------------------------------------------------


def _bad_overrides(secret: str) -> list[Any]:
    return [
        {},
        {"oauth_token": secret, "api_key": secret},
        {"oauth_token": secret, "provider": {"base_url": "http://x.invalid", "auth_token": secret}},
        {"oauth_token": ""},
        {"api_key": "   "},
        {"oauth_token": f"{secret} tail"},
        {"api_key": f"{secret}\x01"},
        {"oauth_token": f"{secret}\n"},
        {"provider": {"base_url": "http://x.invalid", "auth_token": ""}},
        {"provider": {"base_url": "http://x.invalid"}},
        {"provider": {"base_url": "not a url", "auth_token": secret}},
        {"oauth_token": secret, "extra": 1},
        {"oauth_token": None},
    ]


@pytest.mark.parametrize("path", ["/api/task", "/api/chat"])
def test_invalid_auth_override_is_422_and_spawns_nothing(
    server: ServerProcess, secret_registry: SecretRegistry, path: str
) -> None:
    """None, two kinds, empty, whitespace or control characters: 422, no value echoed."""
    secret = secret_registry.new("invalid_override")
    ids = []
    for index, override in enumerate(_bad_overrides(secret)):
        execution_id = f"invalid-{path.rsplit('/', 1)[1]}-{index}"
        ids.append(execution_id)
        response = post(
            server, path, {"message": "x", "execution_id": execution_id, "auth_override": override}
        )
        assert response.status_code == 422, (override, response.text)
        assert isinstance(response.json()["detail"], list)
        assert secret not in response.text
    listing = running(server)
    assert not set(ids) & set(listing["recently_completed_ids"])
    assert not set(ids) & {e["execution_id"] for e in listing["executions"]}


# --- redaction ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "variable"),
    [
        ("baseline", "CLAUDE_CODE_OAUTH_TOKEN"),
        ("oauth_token", "CLAUDE_CODE_OAUTH_TOKEN"),
        ("api_key", "ANTHROPIC_API_KEY"),
        ("provider", "ANTHROPIC_AUTH_TOKEN"),
    ],
)
@pytest.mark.parametrize("ending", ["success", "error"])
def test_echoed_credentials_are_masked_everywhere(
    server: ServerProcess,
    secret_registry: SecretRegistry,
    baseline_token: str,
    kind: str,
    variable: str,
    ending: str,
) -> None:
    """A CLI that prints its credential leaks it into no response, log or transcript."""
    body: dict[str, Any] = {"message": f"@echo-env {variable}"}
    if ending == "error":
        body["message"] += "\n@stderr boom\n@exit 3"
    secret = baseline_token
    if kind != "baseline":
        secret = secret_registry.new(f"echo_{kind}")
        value: Any = secret
        if kind == "provider":
            value = {"base_url": "https://gw.invalid", "auth_token": secret}
        body["auth_override"] = {kind: value}
    response = post(server, "/api/task", body)
    assert response.status_code == (200 if ending == "success" else 500), response.text
    assert secret not in response.text
    assert secret not in server.log_text()
    answer = response.json()
    log = answer["execution_log"] if ending == "success" else answer["detail"]["execution_log"]
    echoed = next(e for e in log if e.get("type") == "assistant")
    assert echoed["message"]["content"][0]["text"] == "[REDACTED]"


# --- execution ids, the running list -----------------------------------------------


def test_a_running_execution_id_is_409_and_a_finished_one_may_be_reissued(
    server: ServerProcess,
) -> None:
    """The walk re-issues the same id on the next rung, with a fresh session."""
    with ThreadPoolExecutor(1) as pool:
        first = pool.submit(
            post, server, "/api/task", {"message": "@sleep 1.5", "execution_id": "walk-1"}
        )
        listing = wait_listed(server, "walk-1")
        (entry,) = [e for e in listing["executions"] if e["execution_id"] == "walk-1"]
        assert entry["auth_route"] == "baseline"
        assert entry["generation"] == generation_and_fp(server)[0]
        assert entry["started_at"]
        for path in ("/api/task", "/api/chat"):
            clash = post(server, path, {"message": "again", "execution_id": "walk-1"})
            assert clash.status_code == 409, clash.text
            assert clash.json()["detail"]["error_code"] == "execution_in_progress"
            assert OVERRIDE_HEADER.lower() not in clash.headers
        done = first.result()
    assert done.status_code == 200, done.text
    listing = running(server)
    assert "walk-1" in listing["recently_completed_ids"]
    assert "walk-1" not in {e["execution_id"] for e in listing["executions"]}
    again = post(server, "/api/task", {"message": "rung 2", "execution_id": "walk-1"})
    assert again.status_code == 200, again.text
    first_session = report(done.json())["session"]["session_id"]
    second_session = report(again.json())["session"]["session_id"]
    assert UUID.match(second_session)
    assert first_session != second_session
    assert again.json()["metadata"]["execution_id"] == "walk-1"


def test_the_running_list_shows_an_override_turn(
    server: ServerProcess, secret_registry: SecretRegistry
) -> None:
    """A running turn lists its auth route and generation; the id moves to completed."""
    override = {"api_key": secret_registry.new("listed_key")}
    with ThreadPoolExecutor(1) as pool:
        turn = pool.submit(
            post,
            server,
            "/api/task",
            {"message": "@sleep 1", "execution_id": "listed-1", "auth_override": override},
        )
        listing = wait_listed(server, "listed-1")
        (entry,) = [e for e in listing["executions"] if e["execution_id"] == "listed-1"]
        assert entry["auth_route"] == "api_key"
        assert isinstance(entry["generation"], int)
        assert turn.result().status_code == 200
    assert "listed-1" in running(server)["recently_completed_ids"]


# --- limits: the parallel cap and the log cap --------------------------------------


@pytest.fixture(scope="module")
def limited(module_turn_servers: TurnServers, secret_registry: SecretRegistry) -> ServerProcess:
    """A server with 2 turn slots and a 64 KiB execution_log cap."""
    return module_turn_servers.start(
        CLAUDE_CODE_OAUTH_TOKEN=secret_registry.new("limited_oauth"),
        AGENT_SERVER_MAX_PARALLEL="2",
        AGENT_SERVER_MAX_LOG_BYTES="65536",
    )


def test_over_the_parallel_cap_is_409_busy_never_429(
    limited: ServerProcess, secret_registry: SecretRegistry
) -> None:
    """The third concurrent turn answers busy with Retry-After; the two finish."""
    with ThreadPoolExecutor(2) as pool:
        turns = [
            pool.submit(post, limited, "/api/task", {"message": "@sleep 1.5", "execution_id": i})
            for i in ("slot-1", "slot-2")
        ]
        wait_listed(limited, "slot-1", "slot-2")
        for path in ("/api/task", "/api/chat"):
            third = post(
                limited,
                path,
                {"message": "x", "auth_override": {"oauth_token": secret_registry.new("busy")}},
            )
            assert third.status_code == 409, third.text
            assert third.json()["detail"]["error_code"] == "busy"
            assert int(third.headers["Retry-After"]) >= 1
            assert third.headers[OVERRIDE_HEADER] == "oauth_token"
        assert [t.result().status_code for t in turns] == [200, 200]
    assert post(limited, "/api/task", {"message": "free again"}).status_code == 200


def test_execution_log_is_capped_and_keeps_the_result(limited: ServerProcess) -> None:
    """1 MB of CLI output: log_truncated, the result still there, the body bounded."""
    response = post(limited, "/api/task", {"message": "@print-bytes 1000000"})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["metadata"]["log_truncated"] is True
    assert body["execution_log"][-1]["type"] == "result"
    assert report(body)["prompt"] == "@print-bytes 1000000"
    assert len(response.content) < 65536 + 3 * len(body["response"]) + 16384
    small = post(limited, "/api/task", {"message": "small"}).json()
    assert small["metadata"]["log_truncated"] is False


# --- a runtime without Claude credentials ---------------------------------------------


def test_a_runtime_without_override_support_ignores_it_with_a_warning(
    turn_servers: TurnServers, secret_registry: SecretRegistry
) -> None:
    """Codex: no header, auth_route baseline, one WARNING in the log."""
    server = turn_servers.start(AGENT_RUNTIME="codex")
    secret = secret_registry.new("codex_override")
    response = post(server, "/api/task", {"message": "x", "auth_override": {"oauth_token": secret}})
    assert OVERRIDE_HEADER.lower() not in response.headers
    body = response.json()
    meta = body["metadata"] if response.status_code == 200 else body["detail"]
    assert meta["auth_route"] == "baseline"
    warnings = [
        json.loads(line)
        for line in server.log_text().splitlines()
        if '"WARNING"' in line and "auth_override ignored" in line
    ]
    assert len(warnings) == 1, server.log_text()
    assert secret not in response.text


# --- the chat session -----------------------------------------------------------------


def test_chat_session_survives_a_restart_and_restarts_once_when_unknown(
    turn_servers: TurnServers, secret_registry: SecretRegistry
) -> None:
    """The session id lives in the state dir; an unknown session starts a new one once."""
    home = turn_servers.home()
    environ = {"CLAUDE_CODE_OAUTH_TOKEN": secret_registry.new("chat_oauth")}
    first_server = turn_servers.start(home, **environ)
    first = post(first_server, "/api/chat", {"message": "one"})
    assert first.status_code == 200, first.text
    session = first.json()["session_id"]
    assert report(first.json())["session"]["session_id"] == session
    assert report(first.json())["session"]["resume"] is None
    first_server.stop()
    kept = home / "state" / "chat-session-id"
    assert kept.read_text().strip() == session
    assert stat.S_IMODE(kept.stat().st_mode) & 0o077 == 0

    second_server = turn_servers.start(home, **environ)
    resumed = post(second_server, "/api/chat", {"message": "two"})
    assert resumed.status_code == 200, resumed.text
    assert report(resumed.json())["session"]["resume"] == session
    assert resumed.json()["metadata"]["session_reset"] is False

    reset = post(second_server, "/api/chat", {"message": "@unknown-session"})
    assert reset.status_code == 200, reset.text
    assert reset.json()["metadata"]["session_reset"] is True
    new_session = reset.json()["session_id"]
    assert new_session != session
    assert report(reset.json())["session"]["resume"] is None
    assert report(reset.json())["session"]["session_id"] == new_session

    after = post(second_server, "/api/chat", {"message": "three"})
    assert report(after.json())["session"]["resume"] == new_session


def test_chats_run_one_at_a_time(server: ServerProcess) -> None:
    """Two chats sent together never overlap, and the second resumes the first's session."""
    with ThreadPoolExecutor(2) as pool:
        started = time.monotonic()
        chats = [
            pool.submit(post, server, "/api/chat", {"message": "@sleep 0.6", "execution_id": i})
            for i in ("chat-a", "chat-b")
        ]
        listed = wait_listed(server, "chat-a", "chat-b")
        states = sorted(e["state"] for e in listed["executions"])
        assert states == ["queued", "running"]  # both are listed: the second waits its turn
        assert len(listed["pending_ids"]) == 1
        answers = [c.result() for c in chats]
    assert time.monotonic() - started >= 1.2
    assert [a.status_code for a in answers] == [200, 200]
    sessions = {a.json()["session_id"] for a in answers}
    assert len(sessions) == 1


# --- the threads above must not outlive the module ---------------------------------


@pytest.fixture(autouse=True)
def _no_stray_threads() -> Iterator[None]:
    before = set(threading.enumerate())
    yield
    stray = [t for t in set(threading.enumerate()) - before if t.is_alive() and not t.daemon]
    assert not stray, stray
