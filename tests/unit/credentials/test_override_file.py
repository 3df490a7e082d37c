"""The token override file (contract §3): 0600, crash-safe, refuses unsafe places."""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import signal
import stat
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import SecretStr

from agent_server.app import create_app
from agent_server.config import Settings
from agent_server.credentials.override_file import OverrideFile
from agent_server.credentials.store import CredentialStore
from agent_server.secret_file import NotReadable, UnsafeLocation

OLD, NEW = "old-token-0123456789", "new-token-9876543210"


@pytest.fixture
def override(tmp_path: Path) -> OverrideFile:
    """An override file in a fresh 0700 state dir."""
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    return OverrideFile(state / "oauth-token")


def test_written_0600_under_umask_000(override: OverrideFile, monkeypatch: Any) -> None:
    """Neither the temp file nor the target is ever more open than 0600, whatever the umask."""
    temp_modes: list[int] = []
    real_rename = os.rename

    def spying_rename(src: Any, dst: Any) -> None:
        temp_modes.append(stat.S_IMODE(os.lstat(src).st_mode))
        real_rename(src, dst)

    monkeypatch.setattr(os, "rename", spying_rename)
    previous = os.umask(0)
    try:
        override.write_atomic(SecretStr(NEW))
    finally:
        os.umask(previous)
    assert temp_modes == [0o600]
    assert stat.S_IMODE(os.stat(override.path).st_mode) == 0o600
    assert override.path.read_text() == NEW  # the raw token, no newline


def test_a_crash_between_write_and_rename_leaves_the_old_token(override: OverrideFile) -> None:
    """SIGKILL at the rename: the old complete token stays; the next boot removes the temp file."""
    override.write_atomic(SecretStr(OLD))
    child = textwrap.dedent(
        """
        import os, signal, sys
        from pathlib import Path
        from pydantic import SecretStr
        from agent_server.credentials.override_file import OverrideFile
        os.rename = lambda *a, **k: os.kill(os.getpid(), signal.SIGKILL)
        OverrideFile(Path(sys.argv[1])).write_atomic(SecretStr(os.environ["NEW_TOKEN"]))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", child, str(override.path)],
        env={**os.environ, "NEW_TOKEN": NEW},
        timeout=60,
        check=False,
    )
    assert done.returncode == -signal.SIGKILL
    leftovers = list(override.path.parent.glob("oauth-token.tmp.*"))
    assert [p.read_text() for p in leftovers] == [NEW]
    assert override.path.read_text() == OLD
    override.prepare()
    assert list(override.path.parent.glob("oauth-token.tmp.*")) == []
    assert override.read() == SecretStr(OLD)


def test_a_symlink_at_the_target_is_refused(override: OverrideFile, tmp_path: Path) -> None:
    """Writing and reading through a symlink are refused; its target is untouched."""
    victim = tmp_path / "victim"
    victim.write_text("victim-content")
    override.path.symlink_to(victim)
    with pytest.raises(UnsafeLocation):
        override.write_atomic(SecretStr(NEW))
    with pytest.raises(NotReadable, match="a symlink, never followed"):
        override.read()
    assert victim.read_text() == "victim-content"
    assert override.path.is_symlink()
    assert list(override.path.parent.glob("oauth-token.tmp.*")) == []


@pytest.mark.parametrize("mode", [0o770, 0o707, 0o777], ids=["group", "others", "both"])
def test_an_open_state_dir_is_refused(override: OverrideFile, mode: int) -> None:
    """A state dir writable by group or others: no write, no read, file untouched."""
    override.write_atomic(SecretStr(OLD))
    override.path.parent.chmod(mode)
    with pytest.raises(UnsafeLocation):
        override.write_atomic(SecretStr(NEW))
    with pytest.raises(UnsafeLocation):
        override.read()
    assert override.path.read_text() == OLD


@pytest.mark.parametrize("unsafe", ["symlink", "open_dir"])
def test_boot_ignores_an_unsafe_file_with_an_error_line(
    override: OverrideFile, tmp_path: Path, caplog: pytest.LogCaptureFixture, unsafe: str
) -> None:
    """At boot an unsafe override file is logged at ERROR and its token is not used."""
    if unsafe == "symlink":
        (tmp_path / "planted").write_text(NEW)
        override.path.symlink_to(tmp_path / "planted")
    else:
        override.path.write_text(NEW)
        override.path.parent.chmod(0o777)
    with caplog.at_level(logging.ERROR, "agent_server.credentials"):
        store = CredentialStore.boot(True, {}, override)
    assert store.current.active_token is None
    assert [r.levelno for r in caplog.records] == [logging.ERROR]


def test_read_strips_and_treats_empty_as_absent(override: OverrideFile) -> None:
    """An empty or whitespace file is no token; a trailing newline is tolerated."""
    assert override.read() is None
    override.path.write_text(" \n")
    assert override.read() is None
    override.path.write_text(OLD + "\n")
    assert override.read() == SecretStr(OLD)


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        pytest.param("a" * 4097, "single token", id="over 4096 bytes"),
        pytest.param("a" * 4096 + " " * 100 + "tail", "over 4160 bytes", id="a long file"),
        pytest.param("two words", "single token", id="inner whitespace"),
        pytest.param("ctrl\x01char", "single token", id="a control character"),
    ],
)
def test_read_refuses_what_reload_would_refuse(
    override: OverrideFile, content: str, reason: str
) -> None:
    """A hand-edited file is never truncated or passed on mangled: read raises, boot ignores it."""
    override.path.write_text(content)
    with pytest.raises(OSError, match=reason):
        override.read()
    assert CredentialStore.boot(True, {}, override).current.active_token is None


def test_read_without_a_state_dir_is_no_token(tmp_path: Path) -> None:
    """No state dir yet (first boot, or a read-only status look) means no token, not an error."""
    assert OverrideFile(tmp_path / "absent" / "oauth-token").read() is None


def test_boot_without_prepare_keeps_temp_files(
    override: OverrideFile, caplog: pytest.LogCaptureFixture
) -> None:
    """A read-only boot (`agent-server status`) never deletes a live writer's temp file."""
    override.write_atomic(SecretStr(OLD))
    leftover = override.path.with_name("oauth-token.tmp.live")
    leftover.write_text(NEW)
    with caplog.at_level(logging.WARNING):
        store = CredentialStore.boot(True, {}, override, prepare=False)
    assert store.current.active_token == SecretStr(OLD)
    assert leftover.exists()
    assert caplog.records == []


def test_info_shows_metadata_never_content(override: OverrideFile) -> None:
    """`info()` reports existence, mode and size."""
    assert not override.info().exists
    override.write_atomic(SecretStr(OLD))
    info = override.info()
    assert (info.exists, info.mode, info.size) == (True, "0600", len(OLD))


# --- persist_failed through the API -------------------------------------------------


@pytest.fixture
def tiny_tmpfs(tmp_path: Path) -> Iterator[Path | None]:
    """A 4 KiB tmpfs when we may mount one (root), else None (the test injects the OSError)."""
    mnt = tmp_path / "tmpfs"
    mnt.mkdir()
    if os.geteuid() != 0:
        yield None
        return
    try:
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=4k,mode=0700", "tmpfs", str(mnt)],
            check=True,
            capture_output=True,
            timeout=30,
        )
    except (OSError, subprocess.SubprocessError):
        yield None
        return
    try:
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], check=False, capture_output=True, timeout=30)


def _fill(directory: Path) -> None:
    """Write until the filesystem says ENOSPC (even creating the filler may say it)."""
    with (
        pytest.raises(OSError, match="No space left") as caught,
        open(directory / "filler", "wb") as handle,
    ):
        while True:
            handle.write(b"\0" * 1024)
            handle.flush()
    assert caught.value.errno == errno.ENOSPC


def _inject(monkeypatch: Any, code: int) -> None:
    """Make creating or writing the override temp file fail with errno `code`."""
    real_open, real_write = os.open, os.write

    def is_temp(fd: int) -> bool:
        return ".tmp." in os.readlink(f"/proc/self/fd/{fd}")

    def failing_open(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        if code == errno.EROFS and flags & os.O_CREAT and ".tmp." in str(path):
            raise OSError(code, os.strerror(code))
        return real_open(path, flags, *args, **kwargs)

    def failing_write(fd: int, data: Any) -> int:
        if code == errno.ENOSPC and is_temp(fd):
            raise OSError(code, os.strerror(code))
        return real_write(fd, data)

    monkeypatch.setattr(os, "open", failing_open)
    monkeypatch.setattr(os, "write", failing_write)


@pytest.mark.parametrize("failure", [errno.ENOSPC, errno.EROFS], ids=["disk full", "read-only"])
def test_a_failed_write_answers_persist_failed_and_changes_nothing(
    environ: dict[str, str],
    tiny_tmpfs: Path | None,
    monkeypatch: Any,
    failure: int,
) -> None:
    """Disk full or read-only: 500 persist_failed; generation, fingerprint and file unchanged."""
    if tiny_tmpfs is not None:
        environ["AGENT_SERVER_STATE_DIR"] = str(tiny_tmpfs)
    environ["TRINITY_AGENT_AUTH_TOKEN"] = "controller-token-xyz"
    settings = Settings.from_environ(environ)
    breakers: dict[int, Callable[[Path], None]] = {
        errno.ENOSPC: _fill,
        errno.EROFS: lambda d: _remount_ro(d),
    }
    app = create_app(settings)

    async def scenario() -> tuple[dict[str, Any], httpx.Response, dict[str, Any]]:
        async with _client(app) as client:
            first = await client.post("/api/credentials/reload-token", json={"token": OLD})
            assert first.status_code == 200
            before = (await client.get("/api/credentials/status")).json()
            if tiny_tmpfs is not None:
                breakers[failure](tiny_tmpfs)
            else:
                _inject(monkeypatch, failure)
            failed = await client.post(
                "/api/credentials/reload-token", json={"token": NEW, "remove_api_key": True}
            )
            monkeypatch.undo()
            after = (await client.get("/api/credentials/status")).json()
            return before, failed, after

    before, failed, after = asyncio.run(scenario())
    assert failed.status_code == 500
    assert failed.json()["detail"]["error_code"] == "persist_failed"
    assert NEW not in failed.text
    assert (after["generation"], after["fingerprint"]) == (
        before["generation"],
        before["fingerprint"],
    )
    assert after["guard_armed"] is False
    assert settings.override_file.read_text() == OLD
    assert list(settings.state_dir.glob("oauth-token.tmp.*")) == []


def _client(app: Any) -> httpx.AsyncClient:
    """An in-process client of `app` that sends the test controller token."""
    return httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app),
        base_url="http://agent.test",
        headers={"X-Trinity-Agent-Token": "controller-token-xyz"},
    )


def _remount_ro(directory: Path) -> None:
    subprocess.run(
        ["mount", "-o", "remount,ro", str(directory)], check=True, capture_output=True, timeout=30
    )


def test_an_open_state_dir_answers_persist_failed(environ: dict[str, str]) -> None:
    """A group-writable state dir: the server starts, a reload is refused, nothing changes."""
    environ["TRINITY_AGENT_AUTH_TOKEN"] = "controller-token-xyz"
    settings = Settings.from_environ(environ)
    settings.state_dir.mkdir(mode=0o700)
    settings.override_file.write_text(OLD)
    settings.state_dir.chmod(0o775)
    app = create_app(settings)

    async def scenario() -> tuple[Any, httpx.Response, Any]:
        async with _client(app) as client:
            before = (await client.get("/api/credentials/status")).json()
            failed = await client.post("/api/credentials/reload-token", json={"token": NEW})
            after = (await client.get("/api/credentials/status")).json()
            return before, failed, after

    before, failed, after = asyncio.run(scenario())
    assert before["fingerprint"] is None  # the unsafe file was ignored at boot
    assert failed.status_code == 500
    assert failed.json()["detail"]["error_code"] == "persist_failed"
    assert after == before
    assert settings.override_file.read_text() == OLD
