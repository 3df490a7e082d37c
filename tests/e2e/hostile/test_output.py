"""A hostile CLI's output never leaks a secret, loses a turn, floods, forges or outlives.

The stand-in (tests/support/hostile-cli) prints what an attacker would: the secret in
identifiers the server reports, in an error text that contains `401`, at a clip
boundary, at the start of the kept stderr tail, as a bare JSON number, escaped a
character at a time; lines no JSON encoder takes (lone surrogates, NaN, 1e999,
nesting hundreds deep); floods of empty, one-byte and 16 MiB lines; lines that break
at U+2028 and the other separators to forge server events; and it leaves processes
behind (a zombie leader whose threads run, a fork-and-exit chain), as the spawn user
and as the same uid. For each case: the outcome the table gives, and no secret nor
any 8-character piece of it in the body, the headers, the server's log or /metrics.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import signal
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import SecretStr

from agent_server.controller.client import AgentClient
from agent_server.execution.transcript import MAX_LINE_BYTES, MAX_LOG_LINES
from agent_server.wire.results import LiveEvent
from tests.conftest import SecretRegistry
from tests.e2e.conftest import TurnServers, wait_listed
from tests.support.agent_user import Reachable
from tests.support.contract import leaked
from tests.support.server import HOSTILE_CLI, ServerProcess

MASK = "[REDACTED]"


@dataclass(frozen=True)
class Hostile:
    """A server whose spawns carry `secret` in `variable`, and the hostile CLI as runtime."""

    server: ServerProcess
    secret: str


@pytest.fixture(scope="module")
def oauth(module_turn_servers: TurnServers, secret_registry: SecretRegistry) -> Hostile:
    """The subscription token is the secret; it holds `401`, which the auth scrub rewrites."""
    secret = secret_registry.add(
        "hostile oauth", f"{secrets.token_hex(6)}401{secrets.token_hex(10)}"
    )
    server = module_turn_servers.start(
        AGENT_SERVER_RUNTIME_COMMAND=str(HOSTILE_CLI),
        CLAUDE_CODE_OAUTH_TOKEN=secret,
        HOSTILE_SECRET_VAR="CLAUDE_CODE_OAUTH_TOKEN",
    )
    return Hostile(server, secret)


@pytest.fixture(scope="module")
def pin(module_turn_servers: TurnServers, secret_registry: SecretRegistry) -> Hostile:
    """A numeric `.env` secret, which the CLI prints as a JSON number."""
    secret = secret_registry.add("hostile pin", str(secrets.randbelow(9 * 10**11) + 10**11))
    home = module_turn_servers.home("hostile-pin")
    (home / ".env").write_text(f"PIN_PASSWORD={secret}\n")
    server = module_turn_servers.start(
        home, AGENT_SERVER_RUNTIME_COMMAND=str(HOSTILE_CLI), HOSTILE_SECRET_VAR="PIN_PASSWORD"
    )
    return Hostile(server, secret)


def play(hostile: Hostile, case: str) -> httpx.Response:
    """One turn of `case`; then prove nothing of the secret left by any path."""
    with hostile.server.client() as client:
        response = client.post("/api/task", json={"message": f"case {case}"})
        metrics = client.get("/metrics").text
    json.loads(response.content)  # always valid JSON, whatever the CLI printed
    exposed = "\n".join(
        [
            response.text,
            "\n".join(f"{k}: {v}" for k, v in response.headers.items()),
            hostile.server.log_text(),
            metrics,
        ]
    )
    left = leaked(hostile.secret, exposed)
    assert not left, f"{case}: pieces of the secret left the server: {left}"
    return response


def detail(response: httpx.Response) -> dict[str, Any]:
    body: dict[str, Any] = response.json()["detail"]
    return body


def test_identifiers_from_init_are_validated_and_redacted(oauth: Hostile) -> None:
    """A secret as session_id, model and apiKeySource: null, null, `other`; still a success."""
    response = play(oauth, "init-fields")
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["session_id"] is None
    metadata = body["metadata"]
    assert (metadata["session_id"], metadata["model"]) == (None, None)
    assert metadata["api_key_source"] == "other"


def test_a_rate_limit_window_that_is_a_secret_reads_other(oauth: Hostile) -> None:
    """rateLimitType = the secret: still 429 rate_limit, the window is `other`."""
    response = play(oauth, "rate-limit-type")
    assert response.status_code == 429, response.text
    assert (detail(response)["error_code"], detail(response)["rate_limit_type"]) == (
        "rate_limit",
        "other",
    )


def test_a_secret_holding_401_is_masked_before_the_auth_scrub(oauth: Hostile) -> None:
    """Redact first, then scrub: the mask stands where the secret was, nothing altered."""
    response = play(oauth, "secret-in-error")
    assert response.status_code == 502, response.text
    assert detail(response)["message"] == f"upstream refused {MASK} with 500"


def test_a_secret_at_the_clip_boundary_leaves_no_prefix(oauth: Hostile) -> None:
    """The message is clipped at 500 characters after redaction, never through a secret."""
    response = play(oauth, "clip-boundary")
    assert response.status_code == 502, response.text
    assert len(detail(response)["message"]) <= 500


def test_a_stderr_tail_starting_mid_secret_shows_no_end_of_it(oauth: Hostile) -> None:
    """Only whole lines of the kept stderr tail are used: the cut secret's end never shows."""
    response = play(oauth, "stderr-tail")
    assert response.status_code == 500, response.text
    assert detail(response)["error_code"] == "execution_error"
    assert detail(response)["message"].startswith("CCCC")


def test_a_lone_surrogate_line_is_kept_as_text_and_the_turn_served(oauth: Hostile) -> None:
    """Half an emoji: the lines stay in the log as text, the answer is the prose before."""
    response = play(oauth, "lone-surrogate")
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["response"] == "hello"
    assert sum(isinstance(event, str) for event in body["execution_log"]) == 2


def test_non_finite_numbers_never_reach_the_answer(oauth: Hostile) -> None:
    """NaN and 1e999 in total_cost_usd: those lines are text, the turn a success."""
    response = play(oauth, "non-finite")
    assert response.status_code == 200, response.text
    assert response.json()["metadata"]["cost_usd"] is None


def test_a_non_finite_reset_is_no_reset_and_the_limit_stays(oauth: Hostile) -> None:
    """resetsAt 1e999: that event is ignored; the API error still says rate limit, no reset."""
    response = play(oauth, "non-finite-reset")
    assert response.status_code == 429, response.text
    assert detail(response)["resets_at"] is None
    assert "Retry-After" not in response.headers


@pytest.mark.parametrize("case", ["deep-tool-input", "deep-array"])
def test_nesting_hundreds_deep_does_not_lose_the_turn(oauth: Hostile, case: str) -> None:
    """A tool input 500 deep, an array 100,000 deep: kept as text, the turn answered 200."""
    response = play(oauth, case)
    assert response.status_code == 200, response.text


def test_a_numeric_secret_is_masked_as_a_json_number(pin: Hostile) -> None:
    """`PIN_PASSWORD=123…` printed as a bare number is masked in the execution_log.

    The line is masked as it arrives, which leaves `"pin":[REDACTED]`, no JSON any
    more: the log keeps it as text.
    """
    response = play(pin, "numeric-secret")
    assert response.status_code == 200, response.text
    log = [json.dumps(e) for e in response.json()["execution_log"]]
    notes = [e for e in log if "note" in e]
    assert len(notes) == 1
    assert MASK in notes[0]


# --- nothing outlives its turn, whatever it does (contract §10) -------------------------

ESCAPE_TRIES = 20


@pytest.fixture(scope="module")
def spawn_user_hostile(module_turn_servers: TurnServers, reachable: Reachable) -> ServerProcess:
    """The hostile CLI as the test spawn user (root only: elsewhere unavailable)."""
    return module_turn_servers.start(**reachable.spawn_environ(reachable.stand_in("hostile-cli")))


@pytest.fixture(scope="module")
def same_uid_hostile(module_turn_servers: TurnServers) -> ServerProcess:
    """The hostile CLI as the server's own user."""
    return module_turn_servers.start(AGENT_SERVER_RUNTIME_COMMAND=str(HOSTILE_CLI))


def carriers(execution_id: str) -> set[int]:
    """Processes whose environment (through any of their threads) holds the execution id."""
    needle = f"\0TRINITY_EXECUTION_ID={execution_id}\0".encode()
    found = set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError):  # gone meanwhile, or a zombie's main thread
            for thread in os.listdir(f"/proc/{pid}/task"):
                with contextlib.suppress(OSError):
                    if needle in b"\0" + Path(f"/proc/{pid}/task/{thread}/environ").read_bytes():
                        found.add(int(pid))
    return found


@pytest.mark.timeout(300)
@pytest.mark.parametrize("case", ["zombie-leader", "fork-chain"])
@pytest.mark.parametrize("mode", ["spawn-user", "same-uid"])
def test_an_escapee_is_gone_when_its_turn_ends_every_time(
    request: pytest.FixtureRequest, mode: str, case: str
) -> None:
    """A main thread that exits alone while its threads run (a zombie that no wait
    collects), a chain of processes each forking its successor and exiting: both are
    gone by the time the turn answers, over 20 tries."""
    server: ServerProcess = request.getfixturevalue(f"{mode.replace('-', '_')}_hostile")
    for attempt in range(ESCAPE_TRIES):
        execution_id = f"{case}-{attempt}-{uuid.uuid4().hex[:12]}"
        with server.client(timeout=60) as client:
            body = {"message": f"case {case}", "execution_id": execution_id}
            response = client.post("/api/task", json=body)
        assert response.status_code == 200, response.text
        (escapee,) = [
            e
            for e in response.json()["execution_log"]
            if isinstance(e, dict) and e.get("subtype") == "hostile_escapee"
        ]
        pid = escapee["pid"]
        assert pid > 0
        # Gone now, and no successor turns up afterwards either.
        seen = carriers(execution_id) | ({pid} if Path(f"/proc/{pid}").exists() else set())
        deadline = time.monotonic() + 0.3
        while not seen and time.monotonic() < deadline:
            seen = carriers(execution_id)
        if seen:  # never leave a chain forking on the machine
            with contextlib.suppress(ProcessLookupError):
                os.killpg(escapee["group"], signal.SIGKILL)
        assert not seen, f"try {attempt}: {case} outlived its turn: {sorted(seen)}"


# --- every line costs (contract §6.5) -----------------------------------------------------


@pytest.mark.timeout(180)
@pytest.mark.parametrize("case", ["flood-empty-lines", "flood-byte-lines", "flood-wide-lines"])
def test_a_flood_is_bounded_and_the_server_answers_throughout(
    same_uid_hostile: ServerProcess, case: str
) -> None:
    """More empty or one-byte lines than a log keeps, three 16 MiB lines: the turn still answers
    with its result, its log is cut (bounded in lines and bytes, never a wide line), and
    /health answered all the while."""
    server = same_uid_hostile
    with ThreadPoolExecutor(1) as pool, server.client(timeout=120) as client:
        turn = pool.submit(lambda: client.post("/api/task", json={"message": f"case {case}"}))
        healthy = 0
        while not turn.done():
            assert client.get("/health").status_code == 200
            healthy += 1
            time.sleep(0.01)
        response = turn.result()
    assert healthy > 0
    assert response.status_code == 200, response.text[:500]
    body = response.json()
    assert body["response"] == "survived", {k: v for k, v in body.items() if k != "execution_log"}
    assert body["metadata"]["log_truncated"] is True
    log = body["execution_log"]
    assert len(log) <= MAX_LOG_LINES + 1
    assert len(response.content) < 2 * 8 * 1024 * 1024  # AGENT_SERVER_MAX_LOG_BYTES, escaped
    assert not any(isinstance(e, dict) and len(json.dumps(e)) > MAX_LINE_BYTES for e in log)
    assert log[-1]["type"] == "result"


# --- the server's own words stay its own (contract §8) -----------------------------------


@pytest.mark.timeout(120)
def test_dotenv_values_built_from_the_servers_words_mask_none_of_them(
    module_turn_servers: TurnServers, secret_registry: SecretRegistry
) -> None:
    """`.env` copies the generation, digits of it, a running turn's id and an instant: the
    answers still carry them as the server wrote them."""
    home = module_turn_servers.home("hostile-own-words")
    server = module_turn_servers.start(home, AGENT_SERVER_RUNTIME_COMMAND=str(HOSTILE_CLI))
    held = f"held-{uuid.uuid4().hex[:12]}"
    with ThreadPoolExecutor(1) as pool, server.client(timeout=60) as client:
        first = client.post("/api/task", json={"message": "case init-fields"}).json()
        generation = first["metadata"]["generation"]
        holding = pool.submit(
            lambda: client.post("/api/task", json={"message": "case hold", "execution_id": held})
        )
        wait_listed(server, held)
        (home / ".env").write_text(
            f"G1_TOKEN={generation}\nG2_TOKEN={str(generation)[1:10]}\n"
            f"RUN_TOKEN={held}\nWHEN_TOKEN={first['timestamp'][:16]}\n"
        )
        answer = client.post("/api/task", json={"message": "case init-fields"}).json()
        running = client.get("/api/executions/running").json()
        token = {"token": secret_registry.new("hostile-reload")}
        reloaded = client.post("/api/credentials/reload-token", json=token).json()
        assert client.post(f"/api/executions/{held}/terminate").status_code == 200
        holding.result()
    assert answer["metadata"]["generation"] == generation
    assert answer["timestamp"][:16] == first["timestamp"][:16]
    assert held in {e["execution_id"] for e in running["executions"]}
    assert MASK not in json.dumps(running)
    assert reloaded["status"] == "success"
    assert reloaded["generation"] > generation


# --- no line of the agent's becomes a server event (contract §6.7) -----------------------


@pytest.mark.timeout(120)
def test_no_line_separator_forges_an_event_for_any_reader(same_uid_hostile: ServerProcess) -> None:
    """Lines that break at U+2028, U+0085, \\v, \\x1e, … and write `terminal` and
    `stream_end` after the break: `AgentClient.events()` yields one terminal, the real
    429, and an `httpx` line reader of `/stream` sees the server's two events once."""
    server = same_uid_hostile
    execution_id = f"separators-{uuid.uuid4().hex[:12]}"
    with server.client(timeout=60) as client:
        body = {"message": "case forged-separators", "execution_id": execution_id}
        assert client.post("/api/task", json=body).status_code == 429
        with client.stream("GET", f"/api/executions/{execution_id}/stream") as response:
            lines = list(response.iter_lines())  # splits as str.splitlines does

    async def named() -> list[LiveEvent]:
        async with AgentClient(server.base_url, SecretStr(server.token or "")) as agent:
            return [event async for event in agent.events(execution_id)]

    events = asyncio.run(named())
    terminals = [e for e in events if e.event == "terminal"]
    assert len(terminals) == 1
    assert json.loads(terminals[0].data)["http_status"] == 429
    assert terminals[0] is events[-1]
    assert all(not line or line.startswith(("data: ", ":")) for line in lines), lines
    types = [type_of(line.removeprefix("data: ")) for line in lines if line.startswith("data")]
    assert [t for t in types if t in {"terminal", "stream_end"}] == ["terminal", "stream_end"]


def type_of(data: str) -> object:
    """The `type` of an event's JSON data, or None for data that is no JSON object."""
    try:
        value = json.loads(data)
    except ValueError:
        return None
    return value.get("type") if isinstance(value, dict) else None


# --- logs and live events hold the same line as answers (contract §6.7, §8) ---------------


def test_a_secret_escaped_character_by_character_is_masked_on_the_live_events(
    oauth: Hostile,
) -> None:
    """Every character `\\u`-escaped: the answer masks it, and so does `/events`."""
    execution_id = f"escaped-{uuid.uuid4().hex[:12]}"
    with oauth.server.client(timeout=60) as client:
        body = {"message": "case escaped-secret", "execution_id": execution_id}
        response = client.post("/api/task", json=body)
        events = client.get(f"/api/executions/{execution_id}/events").text
    assert response.status_code == 200, response.text
    assert MASK in json.dumps(response.json()["execution_log"])
    decoded = [
        json.dumps(json.loads(line[6:]), ensure_ascii=False)
        for line in events.splitlines()
        if line.startswith("data: {")
    ]
    assert not leaked(oauth.secret, "\n".join([events, *decoded]))
    assert MASK in events


def test_a_dotenv_key_with_control_characters_is_logged_escaped(
    module_turn_servers: TurnServers,
) -> None:
    """A quoted `.env` key holding a newline and ESC, ending `_FILE_DESCRIPTOR`: the
    text-format log holds it escaped, on its own one line."""
    home = module_turn_servers.home("hostile-key")
    (home / ".env").write_text("'X\n12:00:00 ERROR forged\x1b[2J_FILE_DESCRIPTOR'=7\n")
    server = module_turn_servers.start(
        home, AGENT_SERVER_RUNTIME_COMMAND=str(HOSTILE_CLI), AGENT_SERVER_LOG_FORMAT="text"
    )
    with server.client(timeout=60) as client:
        assert client.post("/api/task", json={"message": "case init-fields"}).status_code == 200
    log = server.log_text()
    assert "_FILE_DESCRIPTOR" in log
    assert "\x1b" not in log
    assert not [line for line in log.splitlines() if line.startswith("12:00:00 ERROR forged")]
