"""`startup.sh`: export the override file's token, then exec the server (contract §3, §9)."""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

import pytest

from tests.conftest import SecretRegistry

STARTUP = Path(__file__).resolve().parents[2] / "startup.sh"
FAKE_SERVER = """#!/usr/bin/env bash
if [ -n "${CLAUDE_CODE_OAUTH_TOKEN+x}" ]; then
    echo "token sha256:$(printf %s "$CLAUDE_CODE_OAUTH_TOKEN" | sha256sum | cut -c1-12)"
else
    echo "token unset"
fi
echo "pid $$"
echo "args $*"
"""


def run_startup(tmp_path: Path) -> tuple[dict[str, str], int]:
    """Run startup.sh with a fake server; return what it printed and the shell's PID."""
    fake = tmp_path / "fake-agent-server"
    fake.write_text(FAKE_SERVER)
    fake.chmod(0o755)
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(tmp_path),
        "AGENT_SERVER_STATE_DIR": str(tmp_path / "state"),
        "AGENT_SERVER_BIN": str(fake),
    }
    proc = subprocess.Popen(
        ["bash", str(STARTUP), "--extra"], env=env, stdout=subprocess.PIPE, text=True
    )
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0
    lines = dict(line.split(" ", 1) for line in out.splitlines())
    return lines, proc.pid


@pytest.fixture
def state_dir(tmp_path: Path) -> Path:
    """A safe (0700) state dir."""
    directory = tmp_path / "state"
    directory.mkdir(mode=0o700)
    return directory


def test_a_non_empty_file_is_exported_and_the_server_is_execd(
    tmp_path: Path, state_dir: Path, secret_registry: SecretRegistry
) -> None:
    """The file's token is exported; the server replaces the shell (same PID)."""
    token = secret_registry.new("startup")
    (state_dir / "oauth-token").write_text(token)
    printed, shell_pid = run_startup(tmp_path)
    assert printed["token"] == "sha256:" + hashlib.sha256(token.encode()).hexdigest()[:12]
    assert printed["pid"] == str(shell_pid)
    assert printed["args"] == "serve --extra"


@pytest.mark.parametrize("content", [None, ""], ids=["a missing file", "an empty file"])
def test_nothing_is_exported_without_a_token(
    tmp_path: Path, state_dir: Path, content: str | None
) -> None:
    """A missing or empty file exports nothing, and the server still starts by exec."""
    if content is not None:
        (state_dir / "oauth-token").write_text(content)
    printed, shell_pid = run_startup(tmp_path)
    assert printed["token"] == "unset"
    assert printed["pid"] == str(shell_pid)


def test_a_missing_state_dir_exports_nothing(tmp_path: Path) -> None:
    """No state dir at all (first boot): nothing exported, the server starts."""
    printed, _ = run_startup(tmp_path)
    assert printed["token"] == "unset"


def test_a_symlinked_file_is_not_followed(tmp_path: Path, state_dir: Path) -> None:
    """A symlink at the override path exports nothing, like the server refuses it."""
    (tmp_path / "planted").write_text("planted-token-123")
    (state_dir / "oauth-token").symlink_to(tmp_path / "planted")
    assert run_startup(tmp_path)[0]["token"] == "unset"


def test_an_open_state_dir_is_not_trusted(tmp_path: Path, state_dir: Path) -> None:
    """A group/world-writable state dir exports nothing, like the server ignores it."""
    (state_dir / "oauth-token").write_text("planted-token-123")
    state_dir.chmod(0o777)
    assert run_startup(tmp_path)[0]["token"] == "unset"
