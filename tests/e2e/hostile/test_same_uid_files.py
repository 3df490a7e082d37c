"""Same-uid mode (contract §10): what the agent writes where the server reads is never trusted.

Without a spawn user the agent runs as the server's own user and can write its state
dir and its `.env`. Each attack of issue 24's items 3 to 7 is played against a real
server here: a FIFO where the chat session id was, pending callbacks built to exhaust
memory with an mtime in the future, a planted record and a planted callback name,
`.env` values that spell the protocol, temp files of a crashed write, a shutdown over
answered turns. The server must stay up, answer as it should, and lose nothing
silently.
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

import httpx
import pytest

from tests.conftest import SecretRegistry
from tests.e2e.conftest import TurnServers
from tests.support.callback_receiver import CallbackReceiver
from tests.support.server import ServerProcess

pytestmark = pytest.mark.timeout(240)

KEY = "untrusted-callback-key-0123456789"


def _rss_mib(pid: int) -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"VmHWM:\s+(\d+) kB", status).group(1)) / 1024  # type: ignore[union-attr]


def test_a_fifo_at_the_chat_session_id_never_freezes_a_chat(turn_servers: TurnServers) -> None:
    """The chat turn runs (on a new session) and /health answers meanwhile."""
    home = turn_servers.home()
    (home / "state").mkdir(mode=0o700)
    os.mkfifo(home / "state" / "chat-session-id")
    server = turn_servers.start(home)
    with server.client(timeout=30) as client:
        chat = client.post("/api/chat", json={"message": "hello"})
        assert chat.status_code == 200, chat.text
        assert client.get("/health", timeout=5).status_code == 200


def test_pending_files_built_to_exhaust_memory_are_never_parsed(
    turn_servers: TurnServers,
) -> None:
    """Two 63 MiB pending callbacks of nested `{}` with an mtime in the future: the server
    boots and serves, holds nothing near their size, and drops them."""
    home = turn_servers.home()
    pending = home / "state" / "pending-results"
    pending.mkdir(parents=True)
    (home / "state").chmod(0o700)
    future = time.time() + 24 * 3600
    for name in ("bomb-1", "bomb-2"):
        path = pending / f"{name}.json"
        with path.open("w") as out:
            out.write(json.dumps({"execution_id": name, "deadline": 1e18}) + "\n[")
            out.write("{}," * (63 * 1024 * 1024 // 3))
            out.write("{}]")
        os.utime(path, (future, future))
    with CallbackReceiver(KEY) as receiver:
        server = turn_servers.start(home, **receiver.environ())
        assert server.process is not None
        deadline = time.monotonic() + 20
        while any(pending.iterdir()) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert list(pending.iterdir()) == []
        assert server.get("/health").status_code == 200
        assert _rss_mib(server.process.pid) < 200  # 126 MiB of JSON never came near it
        assert receiver.deliveries == []


def test_a_planted_record_or_callback_name_is_not_the_servers(
    turn_servers: TurnServers,
) -> None:
    """A record whose id is another's is a 404; a pending file named to inject a query
    into the callback URL is never sent."""
    home = turn_servers.home()
    state = home / "state"
    (state / "results").mkdir(parents=True)
    (state / "pending-results").mkdir()
    state.chmod(0o700)
    forged = {"execution_id": "someone-else", "status": "success", "response": "forged"}
    (state / "results" / "victim.json").write_text(json.dumps(forged))
    (state / "pending-results" / "evil?injected=1&x=#.json").write_text(
        '{"execution_id":"evil?injected=1&x=#","deadline":1e18}\n{}'
    )
    with CallbackReceiver(KEY) as receiver:
        server = turn_servers.start(home, **receiver.environ())
        time.sleep(6)  # the startup sweep waits up to 5 s, then sends what it keeps
        assert server.get("/api/executions/victim/result").status_code == 404
        assert receiver.deliveries == []


def test_temp_files_of_a_crashed_write_are_gone_after_boot(turn_servers: TurnServers) -> None:
    """A SIGKILL mid-write leaves `*.tmp.*` files: the next boot removes them."""
    home = turn_servers.home()
    state = home / "state"
    for directory in (state / "results", state / "pending-results"):
        directory.mkdir(parents=True)
        (directory / "job.json.tmp.0123abcd").write_bytes(b"x" * 7_000_000)
    (state / "chat-session-id.tmp.89abcdef").write_text("half")
    state.chmod(0o700)
    with CallbackReceiver(KEY) as receiver:
        server = turn_servers.start(home, **receiver.environ())
        assert server.get("/health").status_code == 200
    assert list(state.rglob("*.tmp.*")) == []


def test_dotenv_values_that_spell_the_protocol_mask_nothing(
    turn_servers: TurnServers, secret_registry: SecretRegistry
) -> None:
    """`.env` credentials equal to error codes and keys: the error body keeps its code and
    keys, the override header its value, and an async turn's callback arrives whole."""
    home = turn_servers.home()
    (home / ".env").write_text(
        "A1_TOKEN=rate_limit\nA2_TOKEN=switch_credential\nA3_TOKEN=oauth_token\n"
        "A4_TOKEN=execution_id\n"
    )
    with CallbackReceiver(KEY) as receiver:
        server = turn_servers.start(
            home,
            **receiver.environ(),
            # The replayed transcript was recorded in the CLI's default permission mode.
            AGENT_SERVER_PERMISSION_MODE="default",
        )
        override = {"oauth_token": secret_registry.new("protocol_override")}
        with server.client(timeout=60) as client:
            limited = client.post(
                "/api/task",
                json={"message": "@scenario rate_limit_five_hour_oauth", "auth_override": override},
            )
            accepted = client.post(
                "/api/task",
                json={
                    "message": "@scenario rate_limit_five_hour_oauth",
                    "execution_id": "async-limited",
                    "async_result": True,
                },
            )
        assert accepted.status_code == 202
        (delivery,) = receiver.wait_for(1)
    assert limited.status_code == 429
    assert limited.headers["X-Trinity-Auth-Override"] == "oauth_token"
    detail = limited.json()["detail"]
    assert (detail["error_code"], detail["switch_credential"]) == ("rate_limit", True)
    assert "[REDACTED]" not in limited.text
    assert delivery.body["execution_id"] == "async-limited"
    assert delivery.body["detail"]["error_code"] == "rate_limit"
    assert delivery.body["terminal_reason"] == "rate_limit"


def test_a_shutdown_over_answered_turns_loses_nothing_silently(
    turn_servers: TurnServers,
) -> None:
    """16 turns with 1 MB logs answered, then SIGTERM at once: every record is on disk, or
    named in a WARNING."""
    server = turn_servers.start(AGENT_SERVER_SHUTDOWN_GRACE_S="1")
    ids = [f"exit-{index}" for index in range(16)]
    with httpx.Client(base_url=server.base_url, headers=_auth(server), timeout=60) as client:
        for execution_id in ids:
            body = {"message": "@print-bytes 1000000", "execution_id": execution_id}
            assert client.post("/api/task", json=body).status_code == 200
    server.stop()
    log = server.log_text()
    lost = {i for i in ids if re.search(rf"not retained before exit: .*\b{i}\b", log)}
    written = {p.stem for p in (server.state_dir / "results").glob("*.json")}
    assert set(ids) <= written | lost, set(ids) - written - lost


def _auth(server: ServerProcess) -> dict[str, str]:
    return {"X-Trinity-Agent-Token": server.token or ""}
