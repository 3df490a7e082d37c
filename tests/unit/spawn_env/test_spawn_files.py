"""Spawn files: a CLI's headless settings, written where the CLI trusts them (contract §6.3)."""

from __future__ import annotations

import logging
import os
import secrets
import shutil
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent_server.runtimes.base import SpawnFile
from agent_server.spawn_env.spawn_files import SpawnFiles

VARIABLE = "GEMINI_CLI_SYSTEM_DEFAULTS_PATH"
FILE = SpawnFile(VARIABLE, "gemini-system-defaults.json", b'{"general": {"maxAttempts": 1}}')


@pytest.fixture
def run_base() -> Iterator[Path]:
    """A base directory under /run, root's alone up to `/` (the tests that need one run as
    root, as CI does)."""
    if os.geteuid() != 0:
        pytest.skip("only root can write a file Gemini CLI trusts; CI runs as root")
    base = Path("/run") / f"agent-server-test-{secrets.token_hex(6)}"
    yield base
    shutil.rmtree(base, ignore_errors=True)


def test_a_server_that_is_not_root_writes_none(caplog: pytest.LogCaptureFixture) -> None:
    """The CLI would refuse a file not root's: the spawn keeps its env; one WARNING says so."""
    files = SpawnFiles.for_server(euid=1000)
    env = {"HOME": "/h"}
    with caplog.at_level(logging.WARNING, logger="agent_server.spawn_files"):
        assert files.env_for(env, (FILE,)) == env
        assert files.env_for(env, (FILE,)) == env
    assert [r.getMessage() for r in caplog.records].count(caplog.records[0].getMessage()) == 1
    assert "gemini-system-defaults.json is not written" in caplog.records[0].getMessage()


def test_a_base_others_may_write_above_is_refused(tmp_path: Path) -> None:
    """A directory under /tmp (writable by all) would be skipped by the CLI: none written."""
    files = SpawnFiles(tmp_path / "spawn")
    assert files.env_for({}, (FILE,)) == {}
    assert not any((tmp_path / "spawn").iterdir())


def test_a_root_server_writes_the_file_the_spawn_reads(run_base: Path) -> None:
    """0644 in a 0755 directory of root's under the base; the variable names it; the same
    content is written once."""
    files = SpawnFiles(run_base)
    env = files.env_for({"HOME": "/h"}, (FILE,))
    path = Path(env[VARIABLE])
    assert path.read_bytes() == FILE.content
    assert path.parent.parent == run_base
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o755
    assert (path.stat().st_uid, path.parent.stat().st_uid) == (0, 0)
    assert files.env_for({}, (FILE,))[VARIABLE] == str(path)
    assert len(list(path.parent.iterdir())) == 1
    files.close()
    assert not path.parent.exists()


def test_the_operators_own_file_wins(run_base: Path) -> None:
    """A spawn env that names a file already keeps it; nothing is written."""
    files = SpawnFiles(run_base)
    assert files.env_for({VARIABLE: "/etc/mine.json"}, (FILE,)) == {VARIABLE: "/etc/mine.json"}
    assert files.directory is None


def test_the_leftovers_of_a_server_gone_are_swept(run_base: Path) -> None:
    """A directory whose server no longer runs goes when the next one opens; a live one's
    stays."""
    gone = subprocess.Popen(["true"])
    gone.wait()
    run_base.mkdir(mode=0o755)
    stale = run_base / f"spawn-{gone.pid}-abc"
    alive = run_base / f"spawn-{os.getpid()}-def"
    stale.mkdir()
    alive.mkdir()
    files = SpawnFiles(run_base)
    files.env_for({}, (FILE,))
    assert not stale.exists()
    assert alive.exists()
    files.close()
