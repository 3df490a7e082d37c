"""`agent-server pool serve` as a real subprocess on loopback, and pool files for it.

    pool_file = write_pool_file(tmp_path, [("sub-a", "subscription", secret)],
                                agents={"agent-1": (server.base_url, CONTROLLER_TOKEN)})
    with PoolServiceProcess(pool_file, store_url, tmp_path / "svc-1") as service:
        service.get("/v1/pool").json()     # the bearer is sent (`service.headers`)
        service.url, service.token
        service.kill()                     # SIGKILL (its process group); `stop()`: SIGTERM

Each instance runs in its own process group, with this checkout first on PYTHONPATH;
its stderr (the walk's event lines) goes to `log_path`.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import httpx

from tests.support.server import REPO, free_port

START_TIMEOUT_S = 20.0
STOP_TIMEOUT_S = 20.0


def write_pool_file(
    root: Path,
    credentials: Sequence[tuple[str, str, str]],
    *,
    agents: Mapping[str, tuple[str, str]] | None = None,
    gateway_url: str = "",
    limits: Mapping[str, float] | None = None,
) -> Path:
    """A pool file under `root` of (id, kind, secret) credentials and (url, token)
    agents, every secret in a file beside it; its path."""
    root.mkdir(parents=True, exist_ok=True)
    lines: list[str] = []
    for ident, kind, secret in credentials:
        (root / f"secret-{ident}").write_text(secret + "\n")
        lines += ["[[credential]]", f'id = "{ident}"', f'kind = "{kind}"']
        lines.append(f'secret_file = "secret-{ident}"')
        if kind == "gateway":
            lines.append(f'base_url = "{gateway_url}"')
    if limits:
        lines.append("[limits]")
        lines += [f"{key} = {value}" for key, value in limits.items()]
    for name, (url, token) in (agents or {}).items():
        (root / f"token-{name}").write_text(token + "\n")
        lines += [f"[agent.{name}]", f'url = "{url}"', f'token_file = "token-{name}"']
    path = root / "pool.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


class PoolServiceProcess:
    """One `pool serve` instance (module docstring)."""

    def __init__(
        self,
        pool_file: Path,
        store_url: str,
        root: Path,
        *,
        token: str | None = None,
        tick_s: float = 0.5,
        drain_s: float = 5.0,
        env: Mapping[str, str] | None = None,
    ) -> None:
        root.mkdir(parents=True, exist_ok=True)
        self.pool_file, self.store_url, self.root = pool_file, store_url, root
        self.token = token or f"svc-{secrets.token_hex(16)}"
        self.token_file = root / "service-token"
        self.token_file.write_text(self.token + "\n")
        self.port = free_port()
        self.log_path = root / "pool-serve.log"
        self.timings = (tick_s, drain_s)
        self.env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(root),
            "LANG": "C.UTF-8",
            "PYTHONPATH": str(REPO),
            **(env or {}),
        }
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """`http://127.0.0.1:PORT`."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def headers(self) -> dict[str, str]:
        """The operator's bearer."""
        return {"Authorization": f"Bearer {self.token}"}

    def argv(self) -> list[str]:
        """The command line of this instance."""
        tick_s, drain_s = self.timings
        return [
            sys.executable, "-m", "agent_server", "pool", "serve",
            "--pool", str(self.pool_file), "--store", self.store_url,
            "--listen", f"127.0.0.1:{self.port}", "--token-file", str(self.token_file),
            "--tick", str(tick_s), "--drain", str(drain_s),
        ]  # fmt: skip

    def start(self) -> PoolServiceProcess:
        """Start it and wait until `/v1/pool` answers 200."""
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                self.argv(),
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,
            )
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                msg = f"pool serve exited with {self.process.returncode}: {self.log_text()}"
                raise RuntimeError(msg)
            try:
                if self.get("/v1/pool", timeout=1).status_code == 200:
                    return self
            except httpx.HTTPError:
                time.sleep(0.05)
        self.kill()
        msg = f"pool serve did not answer: {self.log_text()}"
        raise RuntimeError(msg)

    def request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """One request with the bearer (unless `headers` are given)."""
        kwargs.setdefault("headers", self.headers)
        kwargs.setdefault("timeout", 120)
        return httpx.request(method, self.url + path, **kwargs)

    def get(self, path: str, **kwargs: Any) -> httpx.Response:
        """GET `path`."""
        return self.request("GET", path, **kwargs)

    def post(self, path: str, **kwargs: Any) -> httpx.Response:
        """POST `path`."""
        return self.request("POST", path, **kwargs)

    def log_text(self) -> str:
        """What the instance wrote to stderr so far."""
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def kill(self) -> None:
        """SIGKILL its process group (no shutdown at all)."""
        self._signal(signal.SIGKILL)

    def stop(self) -> int | None:
        """SIGTERM (a graceful shutdown), waited for; its exit code."""
        self._signal(signal.SIGTERM)
        return self.process.returncode if self.process is not None else None

    def _signal(self, sig: signal.Signals) -> None:
        process = self.process
        if process is None or process.poll() is not None:
            return
        os.killpg(process.pid, sig)
        try:
            process.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(STOP_TIMEOUT_S)

    def __enter__(self) -> PoolServiceProcess:
        return self.start()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.kill()
