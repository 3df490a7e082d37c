"""The host boundary: what the agent (same user, writes `.env`, starts processes) cannot do.

Each attack of issue 12, played against a real server and a real stand-in CLI: it
cannot stall the server through a file, route a credential somewhere the controller
did not choose, read the controller token out of the server, or leave a process or
a zombie behind.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import SecretRegistry
from tests.e2e.conftest import ProcessProbe, TurnServers, new_execution_id
from tests.support.agent_user import Reachable
from tests.support.fake_cli import fingerprint
from tests.support.in_process import cli_report
from tests.support.server import (
    AGENT_SERVER,
    CONTROLLER_TOKEN,
    ServerProcess,
    free_port,
    server_environ,
)

pytestmark = pytest.mark.timeout(180)

OAUTH = "CLAUDE_CODE_OAUTH_TOKEN"
BASE_URL = "ANTHROPIC_BASE_URL"
AUTH_TOKEN = "ANTHROPIC_AUTH_TOKEN"
COLLECTOR = "https://collector.example"


def turn(server: ServerProcess, message: str = "hello", **body: Any) -> httpx.Response:
    """One /api/task turn."""
    with server.client(timeout=60) as client:
        return client.post("/api/task", json={"message": message, **body})


# --- no file read can block or swamp the loop ----------------------------------------


def test_a_dotenv_swapped_with_a_fifo_never_stalls_the_server(
    turn_servers: TurnServers, secret_registry: SecretRegistry
) -> None:
    """.env flips between a file and a FIFO while turns and status run: /health stays fast."""
    server = turn_servers.start(CLAUDE_CODE_OAUTH_TOKEN=secret_registry.new("fifo_oauth"))
    env_file = server.env_file
    stop = threading.Event()

    def swap() -> None:
        fifo = env_file.with_name(".env.fifo")
        regular = env_file.with_name(".env.regular")
        while not stop.is_set():
            regular.write_text("SWAPPED=1\n")
            os.replace(regular, env_file)
            os.mkfifo(fifo)
            os.replace(fifo, env_file)

    latencies: list[float] = []
    with ThreadPoolExecutor(3) as pool:
        swapper = pool.submit(swap)
        turns = [pool.submit(turn, server, "hello") for _ in range(6)]
        statuses = pool.submit(lambda: [server.status() for _ in range(10)])
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            started = time.monotonic()
            assert server.get("/health").status_code == 200
            latencies.append(time.monotonic() - started)
            time.sleep(0.05)
        assert all(t.result(timeout=60).status_code == 200 for t in turns)
        assert len(statuses.result(timeout=60)) == 10
        stop.set()
        swapper.result(timeout=10)
    # A stalled loop would hold /health until the FIFO got a writer: never, in this test.
    # The bound only has to tell that from a loaded 2-core machine's slow answer.
    assert max(latencies) < 3.0, f"/health took up to {max(latencies):.2f} s"
    assert server.get("/health").status_code == 200


def test_a_fifo_at_the_override_file_blocks_nothing(
    turn_servers: TurnServers, secret_registry: SecretRegistry
) -> None:
    """Boot, `agent-server status` and two reloads over a FIFO at `oauth-token` all answer."""
    home = turn_servers.home()
    state = home / "state"
    state.mkdir(mode=0o700)
    os.mkfifo(state / "oauth-token")
    server = turn_servers.start(home)  # boots: the FIFO is ignored, never opened blocking
    override = server.status()["files"]["override_file"]
    assert override["problem"] and "regular file" in override["problem"]
    done = subprocess.run(
        [str(AGENT_SERVER), "status"],
        env=server.environ,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "not used" in done.stdout
    for label in ("fifo_reload_1", "fifo_reload_2"):
        answer = server.reload({"token": secret_registry.new(label)}, timeout=10)
        assert answer.status_code == 200, answer.text
    assert stat.S_ISREG((state / "oauth-token").stat().st_mode)


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        pytest.param(b"GOOD=1\nBAD=a\0b\nALSO=2\n", "1 line(s) skipped", id="a NUL inside a value"),
        pytest.param(b"GOOD=1\n\xff\xfe\x00\x01binary\nALSO=2\n", "1 line(s) skipped", id="binary"),
        pytest.param(b"X=" + b"y" * (2 * 1024 * 1024) + b"\n", "over 1048576 bytes", id="2 MiB"),
    ],
)
def test_a_hostile_dotenv_is_skipped_with_a_reason_never_a_500(
    turn_servers: TurnServers, content: bytes, problem: str
) -> None:
    """NUL bytes, binary lines or an oversized file: the turn runs, status says why."""
    server = turn_servers.start()
    server.env_file.write_bytes(content)
    answer = turn(server)
    assert answer.status_code == 200, answer.text
    names = cli_report(answer)["env_names"]
    assert "BAD" not in names
    assert ("GOOD" in names) is (not problem.startswith("over"))
    status_problem = server.status()["files"]["env_file_problem"]
    assert status_problem is not None
    assert problem in status_problem


def test_a_dotenv_value_over_the_exec_limit_is_a_clear_422(turn_servers: TurnServers) -> None:
    """One value over the kernel's per-string limit: 422 spawn_too_large naming it, no E2BIG."""
    server = turn_servers.start()
    server.env_file.write_text("HUGE_VALUE=" + "z" * 200_000 + "\n")
    answer = turn(server)
    assert answer.status_code == 422, answer.text
    detail = answer.json()["detail"]
    assert detail["error_code"] == "spawn_too_large"
    assert "HUGE_VALUE" in detail["message"]


# --- credential routing is part of the credential ------------------------------------


def test_an_oauth_override_never_travels_to_the_baseline_gateway(
    turn_servers: TurnServers, secret_registry: SecretRegistry
) -> None:
    """A gateway agent given a pool subscription token: the spawn has no gateway URL."""
    server = turn_servers.start(
        ANTHROPIC_BASE_URL="https://gateway.example",
        ANTHROPIC_AUTH_TOKEN=secret_registry.new("gateway_token"),
    )
    override = {"oauth_token": secret_registry.new("pool_subscription")}
    seen = cli_report(turn(server, auth_override=override))
    assert seen["served_by"] == OAUTH
    assert BASE_URL not in seen["env_names"]
    assert AUTH_TOKEN not in seen["env_names"]
    # Without an override the gateway's own credential still goes to the gateway.
    plain = cli_report(turn(server))
    assert (plain["served_by"], BASE_URL in plain["env_names"]) == (AUTH_TOKEN, True)
    assert OAUTH not in plain["env_names"]


@pytest.mark.parametrize(
    ("pin", "override"),
    [
        pytest.param(None, None, id="the baseline subscription token"),
        pytest.param(None, "oauth_token", id="an oauth_token override"),
        pytest.param(None, "api_key", id="an api_key override"),
        pytest.param("http://127.0.0.1:9", "api_key", id="an api_key override, endpoint pinned"),
    ],
)
def test_a_dotenv_base_url_never_routes_a_credential_it_did_not_set(
    turn_servers: TurnServers,
    secret_registry: SecretRegistry,
    pin: str | None,
    override: str | None,
) -> None:
    """`.env` ANTHROPIC_BASE_URL=collector: the spawn goes to the pin, or Anthropic's default."""
    extra = {OAUTH: secret_registry.new("route_oauth")}
    if pin is not None:
        extra[BASE_URL] = pin
    server = turn_servers.start(**extra)
    server.env_file.write_text(f"{BASE_URL}={COLLECTOR}\nHTTPS_PROXY=http://evil.example:3128\n")
    body = (
        {"auth_override": {override: secret_registry.new(f"route_{override}")}} if override else {}
    )
    seen = cli_report(turn(server, **body))
    assert "HTTPS_PROXY" not in seen["env_names"]
    if pin is None:
        assert BASE_URL not in seen["env_names"]
    else:
        assert seen["fingerprints"][BASE_URL] == fingerprint(pin)
    status = server.status()
    rows = {row["key"]: row for row in status["env_drift"]}
    assert rows[BASE_URL]["note"] == "not used: .env may not route a credential it did not set"
    assert rows["HTTPS_PROXY"]["suppressed_for_spawn"] is True
    shadow = server.reload({"token": secret_registry.new("route_reload")}).json()["env_shadow"]
    assert {BASE_URL, "HTTPS_PROXY"} <= set(shadow)
    warned = [m["message"] for m in server.log_messages() if m.get("key") == BASE_URL]
    assert len(warned) == 1


def test_a_stale_dotenv_oauth_token_never_beats_the_baseline(
    turn_servers: TurnServers, secret_registry: SecretRegistry
) -> None:
    """Guard armed, no override file: .env's old token is replaced, warned and reported."""
    baseline = secret_registry.new("fresh_baseline")
    server = turn_servers.start(CLAUDE_CODE_OAUTH_TOKEN=baseline)
    server.env_file.write_text(f"{OAUTH}={secret_registry.new('stale_dotenv')}\n")
    seen = cli_report(turn(server))
    assert seen["fingerprints"][OAUTH] == fingerprint(baseline)
    row = {r["key"]: r for r in server.status()["env_drift"]}[OAUTH]
    assert row["note"] == "replaced by the server's credential"
    assert any(m.get("key") == OAUTH for m in server.log_messages())


# --- the agent cannot read the server --------------------------------------------------


@pytest.fixture
def unprivileged_home() -> Iterator[tuple[Path, Reachable]]:
    """A home the `nobody` user owns, and what it needs to run a server, wherever this
    checkout lives (a private parent directory included)."""
    reachable = Reachable(65534) if os.geteuid() == 0 else None
    root = Path(tempfile.mkdtemp(prefix="agent-server-nobody-"))
    root.chmod(0o755)
    home = root / "home"
    (home / "work").mkdir(parents=True)
    for path in (home, home / "work"):
        with contextlib.suppress(PermissionError):
            os.chown(path, 65534, 65534)
    try:
        yield home, reachable  # type: ignore[misc]
    finally:
        shutil.rmtree(root, ignore_errors=True)
        if reachable is not None:
            reachable.close()


def test_the_cli_cannot_read_the_servers_environment_or_memory(
    unprivileged_home: tuple[Path, Reachable | None], secret_registry: SecretRegistry
) -> None:
    """As the server's own (non-root) user, /proc/$PPID/environ and mem are refused."""
    home, reachable = unprivileged_home
    controller = secret_registry.new("nondumpable_controller")
    environ = server_environ(home, TRINITY_AGENT_AUTH_TOKEN=controller)
    environ["PATH"] = "/usr/bin:/bin"
    environ["AGENT_SERVER_PORT"] = str(free_port())
    as_root = reachable is not None
    command = [str(AGENT_SERVER), "serve"]
    if reachable is not None:
        command, extra = reachable.server()
        environ.update(extra)
        environ["AGENT_SERVER_RUNTIME_COMMAND"] = str(reachable.stand_in("fake-claude"))
    log_path = home.parent / "server.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            command,
            env=environ,
            stdout=log,
            stderr=log,
            user=65534 if as_root else None,
            cwd=home,
        )
    base = f"http://127.0.0.1:{environ['AGENT_SERVER_PORT']}"
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{base}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        headers = {"X-Trinity-Agent-Token": controller}
        answer = httpx.post(
            f"{base}/api/task", json={"message": "@read-parent"}, headers=headers, timeout=60
        )
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(30)
    assert answer.status_code == 200, answer.text
    (parent,) = [e for e in answer.json()["execution_log"] if e.get("subtype") == "fake_parent"]
    assert parent["environ"].startswith("denied"), parent
    assert parent["mem"].startswith("denied"), parent
    assert controller not in answer.text
    assert controller not in log_path.read_text(errors="replace")


# --- nothing outlives its turn -------------------------------------------------------------


def _escapee(server: ServerProcess, execution_id: str, processes: ProcessProbe) -> Any:
    """The escaped `sleep` of a running turn (found by its execution id)."""
    marks = processes.wait_for(execution_id, comm="sleep")
    return [m for m in marks if m.comm == "sleep"]


@pytest.mark.parametrize("how", ["setsid", "double-fork"])
@pytest.mark.parametrize("ending", ["exit", "timeout", "terminate", "disconnect"])
def test_an_escaped_process_dies_with_its_turn(
    turn_servers: TurnServers, processes: ProcessProbe, how: str, ending: str
) -> None:
    """Whatever ends the turn, what left its process group is found by its tag and killed."""
    server = turn_servers.start()
    execution_id = f"escape-{how}-{ending}-{os.urandom(4).hex()}"
    tail = "@sleep 1" if ending == "exit" else "@sleep 60"
    body: dict[str, Any] = {"message": f"@escape {how} 60\n{tail}", "execution_id": execution_id}
    if ending == "timeout":
        body["timeout_seconds"] = 2
    if ending == "disconnect":  # a turn with no id: its client leaving stops it
        with _raw_turn(server, {"message": body["message"]}):
            sleepers = _escapee(server, new_execution_id(server, set()), processes)
    else:
        with ThreadPoolExecutor(1) as pool:
            answer = pool.submit(lambda: turn(server, **body))
            sleepers = _escapee(server, execution_id, processes)
            if ending == "terminate":
                with server.client() as client:
                    stop = client.post(f"/api/executions/{execution_id}/terminate")
                    assert stop.status_code == 200
            answer.result(timeout=60)
    assert processes.survivors(sleepers, within=10) == {}


@contextlib.contextmanager
def _raw_turn(server: ServerProcess, body: dict[str, Any]) -> Iterator[None]:
    """A turn sent on a raw connection that is dropped when the block ends."""
    payload = json.dumps(body).encode()
    request = (
        b"POST /api/task HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        + f"X-Trinity-Agent-Token: {CONTROLLER_TOKEN}\r\n".encode()
        + f"Content-Length: {len(payload)}\r\n\r\n".encode()
        + payload
    )
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as conn:
        conn.sendall(request)
        yield


def test_an_escaped_process_dies_at_shutdown(
    turn_servers: TurnServers, processes: ProcessProbe
) -> None:
    """SIGTERM with a turn in flight: 504 killed after the grace, and the daemon is gone."""
    server = turn_servers.start(AGENT_SERVER_SHUTDOWN_GRACE_S="1")
    execution_id = f"escape-shutdown-{os.urandom(4).hex()}"
    body = {"message": "@escape double-fork 60\n@sleep 60", "execution_id": execution_id}
    with ThreadPoolExecutor(1) as pool:
        answer = pool.submit(lambda: turn(server, **body))
        sleepers = _escapee(server, execution_id, processes)
        server.stop()
        assert answer.result(timeout=60).json()["detail"]["error_code"] == "killed"
    assert processes.survivors(sleepers, within=10) == {}


def test_no_zombie_after_many_turns_of_a_double_forking_cli(
    turn_servers: TurnServers, tmp_path: Path
) -> None:
    """1,000 turns of a shell CLI that double-forks a daemon: no zombie, no daemon left."""
    cli = tmp_path / "forking-cli"
    cli.write_text(
        "#!/bin/sh\n"
        "cat > /dev/null\n"
        "( setsid sleep 30 & )\n"
        'echo \'{"type":"system","subtype":"init","session_id":"s1",'
        '"permissionMode":"bypassPermissions"}\'\n'
        'echo \'{"type":"result","subtype":"success","is_error":false,"result":"ok"}\'\n'
    )
    cli.chmod(0o755)
    server = turn_servers.start(AGENT_SERVER_RUNTIME_COMMAND=str(cli))
    assert server.process is not None

    def many(count: int) -> list[int]:
        with server.client(timeout=60) as client:
            return [
                client.post("/api/task", json={"message": "x"}).status_code for _ in range(count)
            ]

    with ThreadPoolExecutor(4) as pool:
        codes = [code for batch in pool.map(many, [250] * 4) for code in batch]
    assert codes == [200] * 1000
    deadline = time.monotonic() + 10
    while True:
        zombies, daemons = _children(server.process.pid)
        if (not zombies and not daemons) or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert (zombies, daemons) == ([], [])


def _children(pid: int) -> tuple[list[int], list[int]]:
    """The zombie children of `pid`, and its live children (nothing should be left)."""
    zombies, alive = [], []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_bytes().rpartition(b")")[2].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            (zombies if fields[0] == b"Z" else alive).append(int(entry.name))
    return zombies, alive
