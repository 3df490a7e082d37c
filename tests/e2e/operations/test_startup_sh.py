"""`startup.sh`: drop from root to the server's user, export the override file's token,
then exec the server (contract §3, §9, §10)."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent_server.wire.values import MAX_TOKEN_BYTES, MIN_TOKEN_CHARS
from tests.conftest import SecretRegistry
from tests.support.agent_user import SERVER_CAPABILITIES, spawn_test_user
from tests.support.fake_cli import fingerprint

STARTUP = Path(__file__).resolve().parents[3] / "startup.sh"
FAKE_SERVER = """#!/usr/bin/env bash
if [ -n "${CLAUDE_CODE_OAUTH_TOKEN+x}" ]; then
    echo "token sha256:$(printf %s "$CLAUDE_CODE_OAUTH_TOKEN" | sha256sum | cut -c1-12)"
else
    echo "token unset"
fi
echo "pid $$"
echo "args $*"
echo "home $HOME"
echo "cwd $PWD"
grep -E '^(Uid|Gid|Groups|Cap(Inh|Prm|Eff|Bnd|Amb)|NoNewPrivs):' /proc/self/status \\
    | sed -E 's/:[[:space:]]*/ /'
"""


def start(directory: Path, script: Path = STARTUP, **extra: str) -> subprocess.Popen[str]:
    """Start `script` with a fake server in `directory` (and `extra` in its environment).
    By default no user of this machine is the server's (a root run stays root, as on a
    machine without the image's user)."""
    fake = directory / "fake-agent-server"
    fake.write_text(FAKE_SERVER)
    fake.chmod(0o755)
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(directory),
        "AGENT_SERVER_STATE_DIR": str(directory / "state"),
        "AGENT_SERVER_BIN": str(fake),
        "AGENT_SERVER_USER": "agent-server-no-such-user",
        **extra,
    }
    return subprocess.Popen(
        ["bash", str(script), "--extra"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def run_startup(
    directory: Path, script: Path = STARTUP, **extra: str
) -> tuple[dict[str, str], int]:
    """Run `script` to its end; return what the fake server printed and the shell's PID."""
    proc = start(directory, script, **extra)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
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
    assert printed["token"] == "sha256:" + fingerprint(token)
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


def test_blanks_around_the_token_are_trimmed(
    tmp_path: Path, state_dir: Path, secret_registry: SecretRegistry
) -> None:
    """As the server reads the file: the token without the blanks a hand added."""
    token = secret_registry.new("startup_trimmed")
    (state_dir / "oauth-token").write_text(f"  {token}\n\n")
    printed, _ = run_startup(tmp_path)
    assert printed["token"] == "sha256:" + fingerprint(token)


@pytest.mark.parametrize(
    "content",
    [
        b"hello",
        "sk-ant-oat01-\u2026".encode(),
        b"sk-ant-oat01-aaaaaaaaaa bbbbbbbbbbbbbbbbbbbb",
        b"sk-ant-oat01-aaaaaaaaaa\0bbbbbbbbbbbbbbbbbbbb",
        b"sk-ant-oat01-" + b"a" * 5000,
    ],
    ids=["a word", "the placeholder", "a blank inside", "a NUL inside", "too long"],
)
def test_what_the_server_would_refuse_is_not_exported(
    tmp_path: Path, state_dir: Path, content: bytes
) -> None:
    """A file that holds no token the server would take (contract §3) exports nothing, so
    it cannot become the baseline's token either; the operator's token stays."""
    (state_dir / "oauth-token").write_bytes(content)
    printed, _ = run_startup(tmp_path)
    assert printed["token"] == "unset"
    kept = "operator-token-0123456789"
    printed, _ = run_startup(tmp_path, CLAUDE_CODE_OAUTH_TOKEN=kept)
    assert printed["token"] == "sha256:" + fingerprint(kept)


def test_its_token_rule_is_the_servers() -> None:
    """The shell spells the server's bounds (wire/values.py), which no test of cases would
    notice drifting apart at the edges."""
    script = STARTUP.read_text()
    assert f"^[!-~]{{{MIN_TOKEN_CHARS},{MAX_TOKEN_BYTES}}}$" in script
    assert f"(( size <= {MAX_TOKEN_BYTES} + 64 ))" in script


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


# --- as root: the drop to the server's user -------------------------------------------


@pytest.fixture
def server_user() -> pwd.struct_passwd:
    """A user to play the image's agent-server (the spawn-user tier's; root only)."""
    return spawn_test_user()


@pytest.fixture
def reachable(server_user: pwd.struct_passwd) -> Iterator[Path]:
    """A directory the server's user may enter, with a copy of startup.sh, and a state dir
    of that user's (0700) holding a token."""
    directory = Path(tempfile.mkdtemp(prefix="agent-server-startup-"))
    try:
        directory.chmod(0o755)
        shutil.copy(STARTUP, directory / "startup.sh")
        (directory / "startup.sh").chmod(0o755)
        (directory / "state").mkdir(mode=0o700)
        os.chown(directory / "state", server_user.pw_uid, server_user.pw_gid)
        yield directory
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def test_as_root_it_becomes_the_servers_user_keeping_only_four_capabilities(
    server_user: pwd.struct_passwd, reachable: Path, secret_registry: SecretRegistry
) -> None:
    """Its uid and group, no other group, CAP_KILL/SETGID/SETUID/SETPCAP in every set it
    keeps (the ambient one carries them through the exec), no_new_privs, its home, `/` as
    working directory; the token is read as that user, and the server keeps the PID."""
    token = secret_registry.new("startup_dropped")
    (reachable / "state" / "oauth-token").write_text(token)
    os.chown(reachable / "state" / "oauth-token", server_user.pw_uid, server_user.pw_gid)
    (reachable / "state" / "oauth-token").chmod(0o600)
    printed, shell_pid = run_startup(
        reachable,
        reachable / "startup.sh",
        AGENT_SERVER_USER=server_user.pw_name,
        AGENT_SERVER_SPAWN_USER="developer",
    )
    assert printed["Uid"].split() == [str(server_user.pw_uid)] * 4
    assert printed["Gid"].split() == [str(server_user.pw_gid)] * 4
    assert printed["Groups"].split() == []
    for capability_set in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
        assert printed[capability_set] == SERVER_CAPABILITIES, capability_set
    assert printed["NoNewPrivs"] == "1"
    assert (printed["home"], printed["cwd"]) == (server_user.pw_dir, "/")
    assert printed["token"] == "sha256:" + fingerprint(token)
    assert printed["pid"] == str(shell_pid)
    assert printed["args"] == "serve --extra"


def test_as_root_it_refuses_same_uid_mode(server_user: pwd.struct_passwd, reachable: Path) -> None:
    """An empty AGENT_SERVER_SPAWN_USER would run every turn as the server's user: one
    line, exit 2, no server."""
    proc = start(
        reachable,
        reachable / "startup.sh",
        AGENT_SERVER_USER=server_user.pw_name,
        AGENT_SERVER_SPAWN_USER=" ",
    )
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 2
    assert out == ""
    assert len(err.splitlines()) == 1
    assert "--user 1000" in err
