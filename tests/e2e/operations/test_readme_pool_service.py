"""The README's "The pool as a service" commands, run as written against a real agent.

The block after the `<!-- pool-service: … -->` marker runs through bash in a fresh HOME
that holds the agent's controller token where `make run` keeps it, with `examples/`
beside it and `.venv/bin/agent-server` running this checkout; only the ports change
(8000: a real agent-server with the fake CLI; 8080: a free port). The lines up to the
`pool serve … &` line run first; once the service answers, the rest: its `/v1/pool`
names both subscriptions and the agent, and the turn is served by a subscription.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import SecretRegistry
from tests.e2e.conftest import TurnServers
from tests.support.server import CONTROLLER_TOKEN, REPO, free_port

pytestmark = pytest.mark.timeout(120)
MARKER = "<!-- pool-service:"


def readme_block() -> list[str]:
    """The indented block right after the marker, line by line."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    after = text.split(MARKER, 1)[1].split("\n", 1)[1]
    lines: list[str] = []
    for line in after.splitlines():
        if line.startswith("    "):
            lines.append(line[4:])
        elif lines:
            break
    return lines


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    """A working directory with `examples/` and a `.venv/bin/agent-server` of this tree."""
    work = tmp_path / "checkout"
    shutil.copytree(REPO / "examples", work / "examples")
    launcher = work / ".venv" / "bin" / "agent-server"
    launcher.parent.mkdir(parents=True)
    launcher.write_text(f'#!/bin/sh\nexec {sys.executable} -m agent_server "$@"\n')
    launcher.chmod(0o755)
    return work


@pytest.fixture
def home(tmp_path: Path) -> Path:
    """A fresh HOME holding the agent's controller token where `make run` keeps it."""
    found = tmp_path / "home"
    state = found / ".local" / "state" / "agent-server"
    state.mkdir(parents=True, mode=0o700)
    (state / "agent-auth-token").write_text(CONTROLLER_TOKEN + "\n")
    return found


@pytest.fixture
def background() -> Iterator[list[subprocess.Popen[str]]]:
    """Shells whose process groups are killed at the end (the service runs in one)."""
    started: list[subprocess.Popen[str]] = []
    yield started
    for shell in started:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(shell.pid, signal.SIGKILL)
        shell.wait(10)


def test_the_readme_starts_the_service_on_one_machine(
    checkout: Path,
    home: Path,
    turn_servers: TurnServers,
    secret_registry: SecretRegistry,
    background: list[subprocess.Popen[str]],
) -> None:
    """The block's commands, as written: the service serves the sample pool and a turn."""
    agent = turn_servers.start()
    service_port = free_port()
    ports = {"8000": str(agent.port), "8080": str(service_port)}
    pool = (checkout / "examples" / "pool.toml").read_text(encoding="utf-8")
    (checkout / "examples" / "pool.toml").write_text(pool.replace(":8000", f":{agent.port}"))
    lines = [_ported(line, ports) for line in readme_block()]
    serve = next(i for i, line in enumerate(lines) if " pool serve " in line)
    assert lines[serve].rstrip().endswith("&"), lines[serve]
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "LANG": "C.UTF-8",
        "PYTHONPATH": os.environ.get("PYTHONPATH") or str(REPO),
        "YOUR_OAUTH_TOKEN": secret_registry.new("readme_sub_a"),
        "YOUR_OTHER_OAUTH_TOKEN": secret_registry.new("readme_sub_b"),
    }
    with (checkout / "service.log").open("w") as log:
        shell = subprocess.Popen(
            ["bash", "-euc", "\n".join(lines[: serve + 1])],
            cwd=checkout, env=env, stdout=log, stderr=log, text=True, start_new_session=True,
        )  # fmt: skip
    background.append(shell)
    _wait_for(f"http://127.0.0.1:{service_port}/v1/pool", checkout / "service.log")
    done = subprocess.run(
        ["bash", "-euc", "\n".join(lines[serve + 1 :]) + "\n"],
        cwd=checkout, env=env, capture_output=True, text=True, timeout=90, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    decoder = json.JSONDecoder()
    status, end = decoder.raw_decode(done.stdout)
    turn, _ = decoder.raw_decode(done.stdout[end:].lstrip())
    assert [c["credential"] for c in status["credentials"]] == ["sub-a", "sub-b"]
    assert [a["agent"] for a in status["agents"]] == ["agent-1"]
    assert turn["outcome"] == "served", turn
    assert turn["served_by"] in ("sub-a", "sub-b"), turn


def _ported(line: str, ports: dict[str, str]) -> str:
    for old, new in ports.items():
        line = line.replace(f":{old}", f":{new}")
    return line


def _wait_for(url: str, log: Path) -> None:
    """Until the service answers (401 without the bearer is an answer)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=1).status_code in (200, 401):
                return
        except httpx.HTTPError:
            time.sleep(0.1)
    pytest.fail(f"pool serve did not answer: {log.read_text(errors='replace')[-2000:]}")
