"""A real agent-server on a free loopback port, its own HOME and state dir, always killed.

    with BenchServer(workspace, standin) as server:   # spawned, healthy, one /health
        server.url, server.headers, server.rss_kib(), server.started_s

Also the direct-spawn twin of a server turn (`direct_turn`): the same stand-in, argv,
stdin, env and working directory, through a plain asyncio subprocess.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import os
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType

from bench.client import LoopbackClient

REPO = Path(__file__).resolve().parent.parent
AGENT_SERVER = REPO / ".venv" / "bin" / "agent-server"
PROBED_SERVER = (
    str(REPO / ".venv" / "bin" / "python"),
    "-c",
    "import runpy, sys; sys.path.insert(0, sys.argv[1]); "
    "runpy.run_module('bench.probed_server', run_name='__main__')",
    str(REPO),
)
"""`agent-server serve` with the timeline's probes (bench/probed_server.py)."""
AUTH_TOKEN = "bench-controller-token-0123456789"
HEALTHY_TIMEOUT_S = 15.0
_POLL_S = 0.005
_STOP_GRACE_S = 5.0


class ServerFailed(RuntimeError):
    """The server did not come up healthy (its log tail is in the message)."""


def free_port() -> int:
    """A loopback port that was free a moment ago (the kernel picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def rss_kib(pid: int) -> int:
    """The resident set size of `pid` in KiB, from /proc/PID/status (VmRSS)."""
    with open(f"/proc/{pid}/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    msg = f"no VmRSS for pid {pid}"
    raise RuntimeError(msg)


def health_ok(port: int, timeout_s: float = 1.0) -> bool:
    """True when GET /health answers 200 now (a refused connection is False)."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout_s)
    try:
        connection.request("GET", "/health")
        return connection.getresponse().status == 200
    except OSError:
        return False
    finally:
        connection.close()


class Workspace:
    """A temp root holding HOME, the state dir (0700), the workdir and the stand-in."""

    def __init__(
        self, root: Path, standin: Path, extra_env: Mapping[str, str] | None = None
    ) -> None:
        self.root = root
        self.standin = standin
        self.extra_env = dict(extra_env or {})
        """Added to every server's environment (`--server-env`), so to its spawns too."""
        self.home = root / "home"
        self.workdir = root / "work"
        for folder in (self.home, self.workdir):
            folder.mkdir(exist_ok=True)

    def new_state_dir(self) -> Path:
        """A fresh state dir, mode 0700 as the override file requires."""
        return Path(tempfile.mkdtemp(prefix="state-", dir=self.root))

    def base_env(self) -> dict[str, str]:
        """The environment every server (and so every spawn) starts from: small and fixed."""
        return {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "HOME": str(self.home),
            "LANG": "C.UTF-8",
            **self.extra_env,
        }

    def spawn_env(self) -> dict[str, str]:
        """What a server spawn receives: the baseline minus server settings, plus the id."""
        return {**self.base_env(), "TRINITY_EXECUTION_ID": uuid.uuid4().hex}

    def argv(self) -> list[str]:
        """The server's argv for a Claude Code turn with no options (contract §6)."""
        return [
            str(self.standin),
            "--print",
            "--output-format",
            "stream-json",
            "--verbose",
            "--permission-mode",
            "bypassPermissions",
            "--session-id",
            str(uuid.uuid4()),
        ]


class BenchServer:
    """One `agent-server serve` process, started healthy and always stopped."""

    def __init__(
        self,
        workspace: Workspace,
        extra_env: Mapping[str, str] | None = None,
        command: Sequence[str] = (str(AGENT_SERVER), "serve"),
    ) -> None:
        self.workspace = workspace
        self.extra_env = dict(extra_env or {})
        self.command = list(command)
        """What runs the server: the console script, or the probed harness (timeline)."""
        self.port = 0
        self.process: subprocess.Popen[bytes] | None = None
        self.started_s = float("nan")
        """Seconds from spawn to the first 200 on /health."""
        self.log_path = workspace.root / f"server-{uuid.uuid4().hex[:8]}.log"

    @property
    def url(self) -> str:
        """The base URL, e.g. `http://127.0.0.1:PORT`."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def headers(self) -> dict[str, str]:
        """The controller's auth header."""
        return {"X-Trinity-Agent-Token": AUTH_TOKEN}

    @property
    def pid(self) -> int:
        """The server's pid (the console script is the Python process itself)."""
        assert self.process is not None
        return self.process.pid

    def rss_kib(self) -> int:
        """The server's VmRSS now, in KiB."""
        return rss_kib(self.pid)

    def client(self, max_connections: int = 64) -> LoopbackClient:
        """A client of this server that sends the controller's auth header."""
        return LoopbackClient(self.port, self.headers, max_connections)

    def __enter__(self) -> BenchServer:
        attempts_left = 3  # a free port may be taken between the probe and the bind
        while True:
            attempts_left -= 1
            try:
                self._start()
            except ServerFailed:
                self.stop()
                if attempts_left == 0:
                    raise
            else:
                return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    def _start(self) -> None:
        self.port = free_port()
        env = {
            **self.workspace.base_env(),
            "AGENT_NAME": "bench",
            "AGENT_SERVER_PORT": str(self.port),
            "AGENT_SERVER_STATE_DIR": str(self.workspace.new_state_dir()),
            "AGENT_SERVER_ENV_FILE": str(self.workspace.home / ".env"),
            "AGENT_SERVER_WORKDIR": str(self.workspace.workdir),
            "AGENT_SERVER_RUNTIME_COMMAND": str(self.workspace.standin),
            "AGENT_SERVER_SHUTDOWN_GRACE_S": "1",
            "TRINITY_AGENT_AUTH_TOKEN": AUTH_TOKEN,
            **self.extra_env,
        }
        with open(self.log_path, "ab") as log:
            started = time.perf_counter()
            self.process = subprocess.Popen(
                self.command,
                env=env,
                cwd=self.workspace.root,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = started + HEALTHY_TIMEOUT_S
        while time.perf_counter() < deadline:
            if health_ok(self.port, timeout_s=2.0):
                self.started_s = time.perf_counter() - started
                return
            if self.process.poll() is not None:
                break
            time.sleep(_POLL_S)
        tail = self.log_path.read_text(errors="replace")[-2000:]
        msg = f"agent-server on port {self.port} never became healthy:\n{tail}"
        raise ServerFailed(msg)

    def stop(self) -> None:
        """SIGTERM, a bounded wait, then SIGKILL of the server's group; idempotent."""
        process = self.process
        if process is None or process.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(_STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(_STOP_GRACE_S)


async def direct_turn(workspace: Workspace, prompt: str, timeout_s: float = 60.0) -> bytes:
    """Spawn the stand-in as the server would, feed the prompt, read all output, reap it."""
    process = await asyncio.create_subprocess_exec(
        *workspace.argv(),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=workspace.spawn_env(),
        cwd=workspace.workdir,
        start_new_session=True,
    )
    try:
        stdout, _ = await asyncio.wait_for(process.communicate(prompt.encode()), timeout_s)
    finally:
        if process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            await process.wait()
    if process.returncode != 0 or b'"type":"result"' not in stdout:
        msg = f"direct stand-in turn failed: exit {process.returncode}"
        raise RuntimeError(msg)
    return stdout
