"""The newcomer's path: a fresh clone, `make run`, and the README's commands as written.

The clone lives under a private directory (0700, as a `mktemp -d` folder or a home is),
with a fresh HOME: `make run` must create its venv and install the pinned CLI there,
serve, and print where the agent works. The commands of the README's "Try it" block
(marked `<!-- newcomer … -->`) then run through bash exactly as written, only the
port changed from 8000 to a free one; a restart must leave them working (the
generated controller token stays). The turn is served by the loopback Messages API
stand-in, as a subscription would serve it.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import SecretRegistry
from tests.support.messages_api import QUIET_CLI, MessagesApiStandIn
from tests.support.server import REPO, free_port

pytestmark = pytest.mark.timeout(600)

MARKER = "<!-- newcomer:"


def readme_commands() -> list[str]:
    """The indented block right after the newcomer marker of the README, line by line."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    after = text.split(MARKER, 1)[1].split("\n", 1)[1]
    lines: list[str] = []
    for line in after.splitlines():
        if line.startswith("    "):
            lines.append(line[4:])
        elif lines:
            break
    return lines


def _cache_dir(command: list[str]) -> str | None:
    found = shutil.which(command[0])
    if found is None:
        return None
    done = subprocess.run([found, *command[1:]], capture_output=True, text=True, check=False)
    return done.stdout.strip() or None


@pytest.fixture
def clone() -> Iterator[Path]:
    """A fresh clone of this repository's HEAD, under a directory only its owner enters."""
    private = Path(tempfile.mkdtemp(prefix="agent-server-newcomer-"))
    assert private.stat().st_mode & 0o077 == 0
    target = private / "agent-server"
    subprocess.run(
        ["git", "clone", "--quiet", "--no-hardlinks", str(REPO), str(target)],
        check=True,
        timeout=120,
    )
    try:
        yield target
    finally:
        shutil.rmtree(private, ignore_errors=True)


class MakeRun:
    """`make run` in the clone, in its own process group, its output kept."""

    def __init__(self, clone: Path, env: dict[str, str], port: int) -> None:
        self.clone = clone
        self.env = env
        self.port = port
        self.log = clone.parent / f"make-run-{time.monotonic_ns()}.log"
        with self.log.open("wb") as out:
            self.process = subprocess.Popen(
                ["make", "run"],
                cwd=clone,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def wait_serving(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.process.poll() is None, self.output()
            try:
                if httpx.get(f"http://127.0.0.1:{self.port}/health", timeout=2).is_success:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        msg = f"make run never served:\n{self.output()}"
        raise AssertionError(msg)

    def stop(self) -> None:
        os.killpg(self.process.pid, signal.SIGTERM)
        self.process.wait(60)

    def output(self) -> str:
        return self.log.read_text(errors="replace")


def _run_readme(env: dict[str, str], port: int) -> list[str]:
    """The README's newcomer commands through bash, as written but for the port: each
    command's output."""
    outputs = []
    script = "\n".join(readme_commands()).replace("localhost:8000", f"localhost:{port}")
    prelude = ""
    for line in script.splitlines():
        if line.startswith("T="):
            prelude = line  # every later command uses T, as in the README
            continue
        done = subprocess.run(
            ["bash", "-c", f"set -euo pipefail\n{prelude}\n{line}"],
            env=env,
            capture_output=True,
            text=True,
            timeout=180,
            check=False,
        )
        assert done.returncode == 0, (line, done.stderr)
        outputs.append(done.stdout)
    return outputs


def test_a_fresh_clone_follows_the_readme(
    clone: Path, secret_registry: SecretRegistry, tmp_path: Path
) -> None:
    """make run serves from a private clone and says where the agent works; the README's
    commands answer as it says; after a restart they still do; make help lists targets."""
    home = tmp_path / "home"
    home.mkdir()
    port = free_port()
    oauth = secret_registry.add("newcomer oauth", "sk-ant-oat01-newcomer-" + "n" * 40)
    with MessagesApiStandIn() as api:
        env = {
            "PATH": os.environ["PATH"],
            "HOME": str(home),
            "LANG": "C.UTF-8",
            "AGENT_SERVER_PORT": str(port),
            "ANTHROPIC_BASE_URL": api.base_url,
            "CLAUDE_CODE_OAUTH_TOKEN": oauth,
            **QUIET_CLI,
        }
        if os.geteuid() == 0:
            env["IS_SANDBOX"] = "1"  # as the README says for root
        for name in ("SSL_CERT_FILE", "NODE_EXTRA_CA_CERTS", "PIP_CERT", "PIP_INDEX_URL"):
            if name in os.environ:
                env[name] = os.environ[name]
        # The downloads a fresh machine makes, from this machine's caches.
        for name, command in (
            ("PIP_CACHE_DIR", ["pip", "cache", "dir"]),
            ("npm_config_cache", ["npm", "config", "get", "cache"]),
        ):
            found = _cache_dir(command)
            if found:
                env[name] = found
        server = MakeRun(clone, env, port)
        try:
            server.wait_serving(timeout=480)
            health, status, answer = (json.loads(out) for out in _run_readme(env, port))
            token = (home / ".local/state/agent-server/agent-auth-token").read_text()
            server.stop()
            restarted = MakeRun(clone, env, port)
            try:
                restarted.wait_serving(timeout=120)
                after = json.loads(_run_readme(env, port)[1])
            finally:
                restarted.stop()
        finally:
            if server.process.poll() is None:
                server.stop()
    workspace = clone / ".cache" / "workspace"
    assert f"the agent works in {workspace}, with full permissions there" in server.output()
    assert health["status"] == "ok", health
    assert status["effective_auth"]["variable"] == "CLAUDE_CODE_OAUTH_TOKEN"
    assert answer["status"] == "success", answer
    assert answer["response"].startswith("served-by kind=bearer")
    assert (home / ".local/state/agent-server/agent-auth-token").read_text() == token
    assert after["agent_name"] == status["agent_name"]  # the same T still opens the API
    helped = subprocess.run(
        ["make", "help"], cwd=clone, env=env, capture_output=True, text=True, check=True
    )
    for target in ("run", "test", "bench", "conformance", "image", "help"):
        assert f"make {target} " in helped.stdout
