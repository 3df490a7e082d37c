"""Out of the box: `make run` serves a working agent, and a terminal gets readable logs.

Contract §8 (logs) and §9 (packaging).
"""

from __future__ import annotations

import json
import os
import pty
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.messages_api import INSTALLED_CLI
from tests.support.server import AGENT_SERVER, REPO, free_port

pytestmark = pytest.mark.timeout(120)


def _path_without_claude() -> str:
    """This PATH minus every directory that holds a `claude`, plus `make`'s own."""
    dirs = [d for d in os.environ.get("PATH", "").split(os.pathsep) if d]
    kept = [d for d in dirs if not (Path(d) / "claude").exists()]
    return os.pathsep.join(kept or ["/usr/bin", "/bin"])


def _wait_healthy(port: int, process: subprocess.Popen[bytes]) -> httpx.Response:
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        assert process.poll() is None, "the server exited before it served"
        try:
            return httpx.get(f"http://127.0.0.1:{port}/health", timeout=2)
        except httpx.TransportError:
            time.sleep(0.1)
    msg = "no /health answer within 90 s"
    raise AssertionError(msg)


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)


@pytest.fixture
def home(tmp_path: Path) -> Iterator[Path]:
    """An empty HOME for the server."""
    path = tmp_path / "home"
    path.mkdir()
    yield path


def test_make_run_serves_the_pinned_cli_when_none_is_on_path(home: Path) -> None:
    """With no `claude` on PATH, `make run` points the server at the CLI it installs."""
    if not INSTALLED_CLI.exists():
        pytest.fail(f"`make test` installs the CLI at {INSTALLED_CLI} before the suite runs")
    make = shutil.which("make")
    assert make is not None, "make is on every machine that runs `make test`"
    port = free_port()
    env = {
        "PATH": _path_without_claude(),
        "HOME": str(home),
        "AGENT_SERVER_PORT": str(port),
        "AGENT_SERVER_INSECURE_NO_AUTH": "1",
    }
    if os.geteuid() == 0:
        env["IS_SANDBOX"] = "1"  # else /health rightly says no turn can run (contract §8)
    process = subprocess.Popen(
        [make, "--no-print-directory", "run"],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        health = _wait_healthy(port, process)
        assert health.status_code == 200
        body = health.json()
        assert (body["runtime"], body["runtime_available"], body["status"]) == (
            "claude-code",
            True,
            "ok",
        )
    finally:
        _stop(process)


def test_a_terminal_gets_text_lines_and_a_pipe_gets_json(home: Path) -> None:
    """Unset AGENT_SERVER_LOG_FORMAT: text on a tty, one JSON object a line elsewhere."""
    base = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "AGENT_SERVER_INSECURE_NO_AUTH": "1",
        "AGENT_SERVER_RUNTIME_COMMAND": sys.executable,
    }
    # A terminal: stderr is a pty.
    leader, follower = pty.openpty()
    port = free_port()
    process = subprocess.Popen(
        [str(AGENT_SERVER), "serve"],
        env={**base, "AGENT_SERVER_PORT": str(port)},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=follower,
        start_new_session=True,
    )
    os.close(follower)
    try:
        _wait_healthy(port, process)
        text = os.read(leader, 65536).decode()
    finally:
        _stop(process)
        os.close(leader)
    first = text.splitlines()[0]
    assert not first.startswith("{"), first
    assert " WARNING agent_server.auth: AGENT_SERVER_INSECURE_NO_AUTH=1" in text
    # A pipe: the same server writes JSON.
    port = free_port()
    process = subprocess.Popen(
        [str(AGENT_SERVER), "serve"],
        env={**base, "AGENT_SERVER_PORT": str(port)},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        _wait_healthy(port, process)
    finally:
        _stop(process)
    assert process.stderr is not None
    with process.stderr:
        lines = process.stderr.read().decode().splitlines()
    assert lines
    assert all(isinstance(json.loads(line), dict) for line in lines)
