"""A real `agent-server serve` process on a loopback port, for end-to-end tests.

The server runs as its own process (like in a container), so tests can SIGTERM or
SIGKILL it, restart it over the same state dir, and read every log line it wrote.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType

import httpx

REPO = Path(__file__).resolve().parents[2]
AGENT_SERVER = Path(sys.executable).with_name("agent-server")
CONTROLLER_TOKEN = "test-controller-token-0123456789"
FAKE_CLAUDE = REPO / "tests" / "support" / "fake-claude"


def free_port() -> int:
    """A loopback TCP port that was free a moment ago."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


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
    }
    if os.geteuid() == 0:
        env["IS_SANDBOX"] = "1"  # Claude Code refuses bypassPermissions as root without it
    env.update(extra)
    return env


class ServerProcess:
    """`agent-server serve` as a subprocess; use as a context manager."""

    def __init__(self, environ: Mapping[str, str], log_path: Path) -> None:
        self.environ = dict(environ)
        self.port = int(self.environ.get("AGENT_SERVER_PORT") or free_port())
        self.environ["AGENT_SERVER_PORT"] = str(self.port)
        self.log_path = log_path
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def base_url(self) -> str:
        """The server's URL on loopback."""
        return f"http://127.0.0.1:{self.port}"

    def client(self, *, token: str | None = CONTROLLER_TOKEN, timeout: float = 60) -> httpx.Client:
        """An HTTP client that sends the controller token (unless `token` is None)."""
        headers = {"X-Trinity-Agent-Token": token} if token is not None else {}
        return httpx.Client(base_url=self.base_url, headers=headers, timeout=timeout)

    def start(self, timeout: float = 15) -> ServerProcess:
        """Start the server and wait until /health answers."""
        log = self.log_path.open("ab")
        self.process = subprocess.Popen(
            [str(AGENT_SERVER), "serve"],
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
