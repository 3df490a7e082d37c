"""A real `agent-server serve` subprocess on a loopback ephemeral port.

Every server started here records its stderr (the JSON log) and every response
body; at teardown no registered test secret may appear in either (contract §8).
"""

from __future__ import annotations

import pwd
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from agent_server.client_limits import ClientLimits
from tests.conftest import SecretRegistry, agent_environ
from tests.support import trinity
from tests.support.agent_user import Reachable, spawn_test_user
from tests.support.server import ServerProcess, server_environ


def stop_all(servers: list[ServerProcess]) -> None:
    """SIGTERM every server, SIGKILL what lingers."""
    for server in servers:
        try:
            server.stop(timeout=60)
        finally:
            server.kill()


def assert_no_leaks(registry: SecretRegistry, servers: list[ServerProcess]) -> None:
    """No registered test secret in any of these servers' logs or response bodies."""
    texts = [s.log_text() for s in servers] + [b for s in servers for b in s.bodies()]
    leaked = registry.leaks(texts)
    assert not leaked, f"test secrets leaked into logs or responses: {leaked}"


class ServerFactory:
    """Starts servers for one test (or module) and leak-checks them at close."""

    def __init__(self, root: Path, registry: SecretRegistry) -> None:
        self.root = root
        self.registry = registry
        self.servers: list[ServerProcess] = []

    def environ(self) -> dict[str, str]:
        """A clean env for a server under `root`, with a registered controller token."""
        env = agent_environ(self.root)
        env["TRINITY_AGENT_AUTH_TOKEN"] = self.registry.new("controller")
        env["AGENT_SERVER_RUNTIME_COMMAND"] = str(Path(sys.executable))
        return env

    def start(self, env: Mapping[str, str]) -> ServerProcess:
        """Start a server with exactly `env` (plus a free loopback port)."""
        log_path = self.root / f"server-{len(self.servers)}.log"
        server = ServerProcess(env, log_path)
        self.servers.append(server)
        return server.start()

    def close(self) -> None:
        """Stop every server; fail when a registered secret reached a log or a body."""
        stop_all(self.servers)
        assert_no_leaks(self.registry, self.servers)


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
def start_server(servers: ServerFactory) -> Callable[[Mapping[str, str]], ServerProcess]:
    """Start a real server with a given env."""
    return servers.start


# --- the agent as another user (tests/support/agent_user.py) ---------------------------


@pytest.fixture(scope="module")
def spawn_user() -> pwd.struct_passwd:
    """The test spawn user (created when missing; root only, as CI runs)."""
    return spawn_test_user()


@pytest.fixture(scope="module")
def reachable(spawn_user: pwd.struct_passwd) -> Iterator[Reachable]:
    """What the spawn user must run, where it may go; removed at the module's end."""
    copies = Reachable(spawn_user.pw_uid)
    try:
        yield copies
    finally:
        copies.close()


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

    def start(
        self, home: Path | None = None, *, limits: ClientLimits | None = None, **extra: str
    ) -> ServerProcess:
        """Start `agent-server serve` over `home` (fresh when None) with `extra` env.

        `limits` replaces the slow-client limits (tests/support/limited_server.py).
        """
        home = home or self.home()
        log_path = home.parent / f"{home.name}-server-{len(self.started)}.log"
        server = ServerProcess(server_environ(home, **extra), log_path, limits)
        self.started.append(server)
        return server.start()

    def close(self) -> None:
        """Stop every server; fail when a registered secret reached a log or a body."""
        stop_all(self.started)
        assert_no_leaks(self.registry, self.started)


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


def new_execution_id(server: ServerProcess, before: set[str], timeout: float = 20) -> str:
    """The id of a turn that appeared in the running list since `before` (for a turn
    sent without one: the server generated it)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        listed = {
            e["execution_id"] for e in server.get("/api/executions/running").json()["executions"]
        }
        if listed - before:
            (new,) = listed - before
            return new
        time.sleep(0.02)
    msg = "no new turn appeared in the running list"
    raise AssertionError(msg)


def wait_listed(
    server: ServerProcess, *ids: str, state: str | None = None, timeout: float = 20
) -> dict[str, Any]:
    """Wait until every id in `ids` is in `/api/executions/running` (in `state`, when
    given); return that listing."""
    deadline = time.monotonic() + timeout
    while True:
        response = server.get("/api/executions/running")
        assert response.status_code == 200, response.text
        listing: dict[str, Any] = response.json()
        states = {e["execution_id"]: e.get("state") for e in listing["executions"]}
        if all(i in states and (state is None or states[i] == state) for i in ids):
            return listing
        assert time.monotonic() < deadline, f"{ids} never listed as {state or 'any'}: {listing}"
        time.sleep(0.02)


@pytest.fixture
def processes() -> ProcessProbe:
    """Find a turn's processes by execution id and check none survives it."""
    return ProcessProbe()


# --- the controller's reading of a failed turn (contract's opening and §7) ----------------

CONTAINER_FAULT_MESSAGE = "Claude Code is not available in this container"


@pytest.fixture(name="controller_reason")
def controller_reason_fixture() -> Callable[[int, str], str | None]:
    """The controller's status and text mapping, to play it over live answers."""
    return trinity.switch_reason
