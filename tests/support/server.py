"""A real `agent-server serve` process on a loopback port, for end-to-end tests.

The server runs as its own process (like in a container), so tests can SIGTERM or
SIGKILL it, restart it over the same state dir, and read every log line it wrote.
Every response body a test receives through `client()` or `request()` is appended
to `<log>.bodies`, beside the log: the leak sweep reads both.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

import httpx

from agent_server.client_limits import ClientLimits
from tests.support.real_clis import broker_default

REPO = Path(__file__).resolve().parents[2]
AGENT_SERVER = Path(sys.executable).with_name("agent-server")
CONTROLLER_TOKEN = "test-controller-token-0123456789"
FAKE_CLAUDE = REPO / "tests" / "support" / "fake-claude"
FAKE_CODEX = REPO / "tests" / "support" / "fake-codex"
FAKE_GEMINI = REPO / "tests" / "support" / "fake-gemini"
HOSTILE_CLI = REPO / "tests" / "support" / "hostile-cli"
LIMITED_SERVER = REPO / "tests" / "support" / "limited_server.py"


def free_port() -> int:
    """A loopback TCP port that was free a moment ago."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def read_bodies(path: Path) -> list[str]:
    """The response bodies a `ServerProcess` recorded in `path` (one JSON string a line)."""
    try:
        return [json.loads(line) for line in path.read_text().splitlines()]
    except FileNotFoundError:
        return []


def server_environ(home: Path, **extra: str) -> dict[str, str]:
    """A minimal environment for a server whose HOME, state dir and .env live in `home`."""
    home.mkdir(parents=True, exist_ok=True)
    (home / "work").mkdir(exist_ok=True)
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "LANG": "C.UTF-8",
        "AGENT_NAME": "test-agent",
        "AGENT_SERVER_STATE_DIR": str(home / "state"),
        "AGENT_SERVER_ENV_FILE": str(home / ".env"),
        "AGENT_SERVER_WORKDIR": str(home / "work"),
        "AGENT_SERVER_RUNTIME_COMMAND": str(FAKE_CLAUDE),
        "TRINITY_AGENT_AUTH_TOKEN": CONTROLLER_TOKEN,
        # This tree's code, not the one the venv was installed from (a worktree's
        # venv is often another checkout's); no spawn inherits PYTHON* names.
        "PYTHONPATH": str(REPO),
    }
    if os.geteuid() == 0:
        env["IS_SANDBOX"] = "1"  # Claude Code refuses bypassPermissions as root without it
    if os.environ.get("PYTHONPATH"):
        # A worktree's tests put their tree first: the server they start must run it too.
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    env.update(extra)
    return env


class ServerProcess:
    """`agent-server serve` as a subprocess; use as a context manager.

    `limits` serves with other slow-client limits (through `limited_server.py`).
    """

    def __init__(
        self, environ: Mapping[str, str], log_path: Path, limits: ClientLimits | None = None
    ) -> None:
        self.environ = dict(environ)
        command = self.environ.get("AGENT_SERVER_RUNTIME_COMMAND")
        self.environ.setdefault("AGENT_SERVER_BROKER", broker_default(command))
        self.limits = limits
        self.port = int(self.environ.get("AGENT_SERVER_PORT") or free_port())
        self.environ["AGENT_SERVER_PORT"] = str(self.port)
        self.log_path = log_path
        self.bodies_path = log_path.with_name(log_path.name + ".bodies")
        self.token = self.environ.get("TRINITY_AGENT_AUTH_TOKEN")
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def base_url(self) -> str:
        """The server's URL on loopback."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def state_dir(self) -> Path:
        """The server's AGENT_SERVER_STATE_DIR."""
        return Path(self.environ["AGENT_SERVER_STATE_DIR"])

    @property
    def env_file(self) -> Path:
        """The server's `.env`."""
        return Path(self.environ["AGENT_SERVER_ENV_FILE"])

    def client(
        self, *, token: str | None = None, timeout: float = 60, **kwargs: Any
    ) -> httpx.Client:
        """An HTTP client that sends the controller token (`token=""` sends none)."""
        sent = self.token if token is None else token
        headers = {"X-Trinity-Agent-Token": sent} if sent else {}
        return httpx.Client(
            base_url=self.base_url,
            headers=headers,
            timeout=timeout,
            event_hooks={"response": [self._record]},
            **kwargs,
        )

    def request(
        self, method: str, path: str, *, token: str | None = None, **kwargs: Any
    ) -> httpx.Response:
        """One request with the controller token (`token=""` sends none)."""
        with self.client(token=token, timeout=30) as client:
            return client.request(method, path, **kwargs)

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

    def bodies(self) -> list[str]:
        """Every response body received from this server so far."""
        return read_bodies(self.bodies_path)

    def log_messages(self) -> list[dict[str, Any]]:
        """The log as parsed JSON records (every line must be one)."""
        return [json.loads(line) for line in self.log_text().splitlines() if line.strip()]

    def _record(self, response: httpx.Response) -> None:
        response.read()
        with self.bodies_path.open("a") as out:
            out.write(json.dumps(response.text) + "\n")

    def start(self, timeout: float = 15) -> ServerProcess:
        """Start the server and wait until /health answers."""
        log = self.log_path.open("ab")
        self.process = subprocess.Popen(
            self._argv(),
            env=self.environ,
            stdout=log,
            stderr=log,
            stdin=subprocess.DEVNULL,
        )
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                msg = f"agent-server exited with {self.process.returncode}: {self.log_text()}"
                raise RuntimeError(msg)
            try:
                if httpx.get(f"{self.base_url}/health", timeout=1).status_code == 200:
                    return self
            except httpx.HTTPError:
                time.sleep(0.05)
        self.kill()
        msg = f"agent-server did not become healthy: {self.log_text()}"
        raise RuntimeError(msg)

    def _argv(self) -> list[str]:
        if self.limits is None:
            return [str(AGENT_SERVER), "serve"]
        limits = self.limits
        numbers = (
            limits.header_timeout_s,
            limits.body_timeout_s,
            limits.max_connections,
            limits.send_timeout_s,
        )
        return [sys.executable, str(LIMITED_SERVER), *map(str, numbers)]

    def stop(self, timeout: float = 30) -> int:
        """SIGTERM the server and wait for it to exit; return its exit code."""
        if self.process is None or self.process.poll() is not None:
            return self.process.returncode if self.process else 0
        self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise

    def kill(self) -> None:
        """SIGKILL the server (a crash) and reap it."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)

    def log_text(self) -> str:
        """Everything the server logged so far."""
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def __enter__(self) -> ServerProcess:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            self.stop()
        finally:
            self.kill()
