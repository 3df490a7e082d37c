"""A real `agent-server serve` subprocess on a loopback ephemeral port.

Every server started here records its stderr (the JSON log) and every response
body; at teardown no registered test secret may appear in either (SPEC 8).
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import SecretRegistry, agent_environ
from tests.support.server import ServerProcess, server_environ

HEADER = "X-Trinity-Agent-Token"
_LISTENING = re.compile(r"Uvicorn running on http://127\.0\.0\.1:(\d+)")
START_TIMEOUT_S = 30.0


@dataclass
class AgentServer:
    """One running server: its env, URL, controller token, log file and recorded bodies."""

    proc: subprocess.Popen[bytes]
    env: Mapping[str, str]
    base_url: str
    token: str | None
    log_path: Path
    bodies: list[str] = field(default_factory=list)

    def request(
        self, method: str, path: str, *, token: str | None = None, **kwargs: Any
    ) -> httpx.Response:
        """Send a request with the controller token (or `token`, "" for none); record the body."""
        sent = self.token if token is None else token
        headers = dict(kwargs.pop("headers", {}))
        if sent:
            headers[HEADER] = sent
        response = httpx.request(
            method, self.base_url + path, headers=headers, timeout=30, **kwargs
        )
        self.bodies.append(response.text)
        return response

    def get(self, path: str, **kwargs: Any) -> httpx.Response:
        """GET `path`."""
        return self.request("GET", path, **kwargs)

    def post(self, path: str, **kwargs: Any) -> httpx.Response:
        """POST `path`."""
        return self.request("POST", path, **kwargs)

    def reload(self, body: Any, **kwargs: Any) -> httpx.Response:
        """POST a JSON body to reload-token."""
        return self.post("/api/credentials/reload-token", json=body, **kwargs)

    def status(self) -> dict[str, Any]:
        """The credential status (asserting 200)."""
        response = self.get("/api/credentials/status")
        assert response.status_code == 200, response.text
        result: dict[str, Any] = response.json()
        return result

    @property
    def state_dir(self) -> Path:
        """The server's AGENT_SERVER_STATE_DIR."""
        return Path(self.env["AGENT_SERVER_STATE_DIR"])

    @property
    def env_file(self) -> Path:
        """The server's `.env`."""
        return Path(self.env["AGENT_SERVER_ENV_FILE"])

    def log_text(self) -> str:
        """Everything the server wrote to stderr so far."""
        return self.log_path.read_text(errors="replace")

    def log_messages(self) -> list[dict[str, Any]]:
        """The stderr log as parsed JSON records (every line must be one)."""
        return [json.loads(line) for line in self.log_text().splitlines() if line.strip()]

    def stop(self) -> None:
        """SIGTERM, then SIGKILL if it lingers; idempotent."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=15)


def _start(env: Mapping[str, str], log_path: Path) -> AgentServer:
    full = {**env, "AGENT_SERVER_HOST": "127.0.0.1", "AGENT_SERVER_PORT": "0"}
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "agent_server", "serve"],
            env=full,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
        )
    token = env.get("TRINITY_AGENT_AUTH_TOKEN")
    server = AgentServer(proc, full, "", token, log_path)
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        match = _LISTENING.search(server.log_text())
        if match:
            server.base_url = f"http://127.0.0.1:{match.group(1)}"
            if server.get("/health").status_code == 200:
                return server
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    server.stop()
    pytest.fail(f"agent-server did not start:\n{server.log_text()}")


class ServerFactory:
    """Starts servers for one test (or module) and leak-checks them at close."""

    def __init__(self, root: Path, registry: SecretRegistry) -> None:
        self.root = root
        self.registry = registry
        self.servers: list[AgentServer] = []

    def environ(self) -> dict[str, str]:
        """A clean env for a server under `root`, with a registered controller token."""
        env = agent_environ(self.root)
        env["TRINITY_AGENT_AUTH_TOKEN"] = self.registry.new("controller")
        env["AGENT_SERVER_RUNTIME_COMMAND"] = str(Path(sys.executable))
        return env

    def start(self, env: Mapping[str, str]) -> AgentServer:
        """Start a server with exactly `env` (plus loopback host and an ephemeral port)."""
        log_path = self.root / f"server-{len(self.servers)}.log"
        server = _start(env, log_path)
        self.servers.append(server)
        return server

    def close(self) -> None:
        """Stop every server; fail when a registered secret reached a log or a body."""
        for server in self.servers:
            server.stop()
        texts = [s.log_text() for s in self.servers] + [b for s in self.servers for b in s.bodies]
        leaked = self.registry.leaks(texts)
        assert not leaked, f"test secrets leaked into logs or responses: {leaked}"


@pytest.fixture
def servers(tmp_path: Path, secret_registry: SecretRegistry) -> Iterator[ServerFactory]:
    """A factory of real servers rooted in tmp_path, leak-checked at teardown."""
    factory = ServerFactory(tmp_path, secret_registry)
    try:
        yield factory
    finally:
        factory.close()


@pytest.fixture
def server_env(servers: ServerFactory) -> dict[str, str]:
    """The env the `servers` factory would use; edit it before starting."""
    return servers.environ()


@pytest.fixture
def start_server(servers: ServerFactory) -> Callable[[Mapping[str, str]], AgentServer]:
    """Start a real server with a given env."""
    return servers.start


# --- the turn plane's servers (tests/support/server.py) and process probes ------------


class TurnServers:
    """Starts `ServerProcess`es with the fake CLI; leak-checks their logs at close."""

    def __init__(self, root: Path, registry: SecretRegistry) -> None:
        self.root = root
        self.registry = registry
        self.started: list[ServerProcess] = []

    def home(self, name: str | None = None) -> Path:
        """A fresh home directory under `root` (or the named one, reused)."""
        home = self.root / (name or f"home-{len(self.started)}-{time.monotonic_ns()}")
        home.mkdir(parents=True, exist_ok=True)
        return home

    def start(self, home: Path | None = None, **extra: str) -> ServerProcess:
        """Start `agent-server serve` over `home` (fresh when None) with `extra` env."""
        home = home or self.home()
        log_path = home.parent / f"{home.name}-server-{len(self.started)}.log"
        server = ServerProcess(server_environ(home, **extra), log_path)
        self.started.append(server)
        return server.start()

    def close(self) -> None:
        """Stop every server; fail when a registered secret reached a server log."""
        for server in self.started:
            try:
                server.stop(timeout=60)
            finally:
                server.kill()
        leaked = self.registry.leaks(server.log_text() for server in self.started)
        assert not leaked, f"test secrets leaked into server logs: {leaked}"


@pytest.fixture(scope="module")
def module_turn_servers(
    tmp_path_factory: pytest.TempPathFactory, secret_registry: SecretRegistry
) -> Iterator[TurnServers]:
    """Turn-plane servers shared by one test module (stopped and leak-checked at its end)."""
    factory = TurnServers(tmp_path_factory.mktemp("turn-servers"), secret_registry)
    try:
        yield factory
    finally:
        factory.close()


@pytest.fixture
def turn_servers(tmp_path: Path, secret_registry: SecretRegistry) -> Iterator[TurnServers]:
    """Turn-plane servers of one test (stopped and leak-checked at its end)."""
    factory = TurnServers(tmp_path, secret_registry)
    try:
        yield factory
    finally:
        factory.close()


@dataclass(frozen=True)
class ProcessMark:
    """A process seen alive: its pid and its start time (so a reused pid is not it)."""

    pid: int
    start_ticks: int
    comm: str


def _stat_fields(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    head, _, rest = raw.rpartition(b")")
    return [head.partition(b"(")[2].decode(errors="replace"), *rest.decode().split()]


class ProcessProbe:
    """Finds a turn's processes by their TRINITY_EXECUTION_ID and proves they are gone.

    The probe scans all of /proc: give each probed turn an execution id no concurrent
    test run shares (a uuid suffix), or another run's processes are found too.
    """

    @staticmethod
    def of_execution(execution_id: str) -> list[ProcessMark]:
        """Live processes whose environment carries this execution id."""
        needle = f"TRINITY_EXECUTION_ID={execution_id}\0".encode()
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                environ = (entry / "environ").read_bytes()
            except OSError:
                continue
            if needle not in environ:
                continue
            fields = _stat_fields(int(entry.name))
            if fields is not None:
                found.append(ProcessMark(int(entry.name), int(fields[20]), fields[0]))
        return found

    def wait_for(self, execution_id: str, *, comm: str, timeout: float = 20) -> list[ProcessMark]:
        """Wait until the turn has a process named `comm` (e.g. its grandchild `sleep`)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            marks = self.of_execution(execution_id)
            if len(marks) >= 2 and any(m.comm == comm for m in marks):
                return marks
            time.sleep(0.02)
        msg = f"execution {execution_id} never showed a {comm!r} process"
        raise AssertionError(msg)

    @staticmethod
    def survivor(mark: ProcessMark) -> str | None:
        """How `mark` is still there ('alive' or 'zombie'), or None when it is gone."""
        fields = _stat_fields(mark.pid)
        if fields is None or int(fields[20]) != mark.start_ticks:
            return None
        return "zombie" if fields[1] == "Z" else "alive"

    def survivors(self, marks: list[ProcessMark], *, within: float = 0.0) -> dict[int, str]:
        """The marks still alive or zombie, after waiting up to `within` seconds for them."""
        deadline = time.monotonic() + within
        while True:
            left = {m.pid: state for m in marks if (state := self.survivor(m)) is not None}
            if not left or time.monotonic() >= deadline:
                return left
            time.sleep(0.02)


@pytest.fixture
def processes() -> ProcessProbe:
    """Find a turn's processes by execution id and check none survives it."""
    return ProcessProbe()


# --- the controller's reading of a failed turn (SPEC preamble and §7) ----------------

CONTAINER_FAULT_MESSAGE = "Claude Code is not available in this container"
PERMISSION_BYPASS_PREFIX = "Permission bypass failed"
CONTROLLER_AUTH_WORDS = (
    "401",
    "403",
    "oauth",
    "unauthorized",
    "authentication",
    "credentials",
    "forbidden",
)


def controller_reason(status: int, message: str) -> str | None:
    """What the controller reads a failed turn as: `rate_limit`, `auth`, or None (no switch).

    429 is a rate limit; 503/401/403/402 are auth except the two container-fault
    messages it knows; any other status is auth only when the message has an auth word.
    """
    if status < 400:
        return None
    if status == 429:
        return "rate_limit"
    container_fault = message == CONTAINER_FAULT_MESSAGE or message.startswith(
        PERMISSION_BYPASS_PREFIX
    )
    if status in (503, 401, 403, 402):
        return None if container_fault else "auth"
    lowered = message.lower()
    return "auth" if any(word in lowered for word in CONTROLLER_AUTH_WORDS) else None


@pytest.fixture(name="controller_reason")
def controller_reason_fixture() -> Callable[[int, str], str | None]:
    """The controller's status and text mapping, to play it over live answers."""
    return controller_reason
