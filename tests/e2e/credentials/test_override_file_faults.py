"""The override file under faults, through a real server (contract §3, §4 reload-token).

A SIGKILL of the server in the middle of a stream of reloads, a full disk, a
read-only disk, a symlink at the target and a umask of 000: each leaves the override
file holding one complete token at 0600 (or untouched), and the server's memory
agreeing with it after the next boot. The disk faults use a tiny real tmpfs.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import stat
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import SecretRegistry
from tests.e2e.conftest import TurnServers
from tests.support.server import ServerProcess

RELOAD = "/api/credentials/reload-token"
OVERRIDE_NAME = "oauth-token"
CRASH_ROUNDS = 12
TOKENS_PER_ROUND = 40


def fingerprint(token: str) -> str:
    """The server's fingerprint of a token: `sha256:` + 12 hex digits."""
    return "sha256:" + hashlib.sha256(token.encode()).hexdigest()[:12]


def status(server: ServerProcess) -> dict[str, Any]:
    """`GET /api/credentials/status` (asserting 200)."""
    with server.client(timeout=10) as client:
        response = client.get("/api/credentials/status")
    assert response.status_code == 200, response.text
    result: dict[str, Any] = response.json()
    return result


def reload(server: ServerProcess, token: str) -> httpx.Response:
    """POST one reload-token."""
    with server.client(timeout=10) as client:
        return client.post(RELOAD, json={"token": token})


def temp_leftovers(state_dir: Path) -> list[str]:
    """Names of `oauth-token.tmp.*` files in the state dir."""
    return sorted(p.name for p in state_dir.glob(f"{OVERRIDE_NAME}.tmp.*"))


def file_token(path: Path) -> str | None:
    """The override file's exact content, after checking it is a 0600 regular file."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    assert stat.S_ISREG(st.st_mode), f"{path} is not a regular file"
    assert stat.S_IMODE(st.st_mode) == 0o600, f"{path} has mode {stat.S_IMODE(st.st_mode):o}"
    return path.read_bytes().decode()


def fake_fp(server: ServerProcess) -> str:
    """The fingerprint of the OAuth token a fake-CLI turn really received."""
    with server.client(timeout=30) as client:
        response = client.post("/api/task", json={"message": "which credential?"})
    assert response.status_code == 200, response.text
    report: dict[str, Any] = json.loads(response.json()["response"])
    assert report["served_by"] == "CLAUDE_CODE_OAUTH_TOKEN", report
    return "sha256:" + str(report["fp"])


# --- SIGKILL during a stream of reloads --------------------------------------------


class ReloadStream(threading.Thread):
    """Sends reload-token with each token in turn until the server dies."""

    def __init__(self, server: ServerProcess, tokens: list[str]) -> None:
        super().__init__(daemon=True)
        self.server = server
        self.tokens = tokens
        self.acked: list[int] = []
        self.errors: list[str] = []
        self.progress = threading.Condition()

    def run(self) -> None:
        with self.server.client(timeout=10) as client:
            for index, token in enumerate(self.tokens):
                try:
                    response = client.post(RELOAD, json={"token": token})
                except httpx.HTTPError:
                    return  # the server was killed under this request
                if response.status_code != 200 or response.json()["persisted"] is not True:
                    self.errors.append(f"{response.status_code} {response.text}")
                    return
                with self.progress:
                    self.acked.append(index)
                    self.progress.notify_all()

    def wait_acked(self, count: int, timeout: float = 10) -> None:
        """Block until `count` reloads were answered (or the stream ended)."""
        with self.progress:
            self.progress.wait_for(
                lambda: len(self.acked) >= count or not self.is_alive(), timeout=timeout
            )


class FileWatcher(threading.Thread):
    """Reads the override file over and over, keeping every content that is not allowed.

    Like `startup.sh` reading the file while a reload runs: at no instant may it see
    anything but one complete token (an in-place rewrite shows up here as a torn read).
    """

    def __init__(self, path: Path, allowed: set[str | None]) -> None:
        super().__init__(daemon=True)
        self.path = path
        self.allowed = allowed
        self.torn: set[str | None] = set()
        self.reads = 0
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                content: str | None = self.path.read_bytes().decode(errors="replace")
            except FileNotFoundError:
                content = None
            self.reads += 1
            if content not in self.allowed:
                self.torn.add(content)


def test_sigkill_during_reloads_leaves_one_complete_token(
    turn_servers: TurnServers, secret_registry: SecretRegistry
) -> None:
    """Each round's kill leaves the last answered token or the one in flight, at 0600."""
    home = turn_servers.home("crash")
    state_dir = home / "state"
    override = state_dir / OVERRIDE_NAME
    baseline = secret_registry.new("crash_baseline")
    previous: str | None = None
    for round_no in range(CRASH_ROUNDS):
        if state_dir.exists():
            # A crash between create and rename of an earlier write: boot must sweep it.
            planted = state_dir / f"{OVERRIDE_NAME}.tmp.round{round_no}"
            planted.write_bytes(b"half-a-tok")
            planted.chmod(0o600)
        server = turn_servers.start(home, CLAUDE_CODE_OAUTH_TOKEN=baseline)
        assert temp_leftovers(state_dir) == [], f"round {round_no}: boot left temp files"
        booted = status(server)
        expected = previous if previous is not None else baseline
        assert booted["fingerprint"] == fingerprint(expected), f"round {round_no}"

        tokens = [secret_registry.new(f"crash{round_no}n{i}") for i in range(TOKENS_PER_ROUND)]
        stream = ReloadStream(server, tokens)
        watcher = FileWatcher(override, {previous, *tokens})
        watcher.start()
        stream.start()
        # Vary the moment: after 0..3 answered reloads, then 0..~25 ms into the next one.
        stream.wait_acked(round_no % 4)
        time.sleep((round_no * 7 % 13) / 500)
        server.kill()
        stream.join(15)
        watcher.stop.set()
        watcher.join(15)
        assert not stream.is_alive()
        assert watcher.reads > 0
        assert watcher.torn == set(), f"round {round_no}: a reader saw a torn override file"
        assert stream.errors == [], f"round {round_no}: {stream.errors}"
        assert len(stream.acked) < len(tokens), "the kill came after the stream: no fault"

        content = file_token(override)  # a regular 0600 file, or none yet
        if stream.acked:
            last = stream.acked[-1]
            # An answered reload was persisted; only the one in flight may be newer.
            allowed = tokens[last : last + 2]
        else:
            allowed = [t for t in (previous, tokens[0]) if t is not None]
        if content is None:
            assert previous is None and not stream.acked, f"round {round_no}: the file vanished"
        else:
            assert content in allowed, f"round {round_no}: not one complete expected token"
        previous = content

    server = turn_servers.start(home, CLAUDE_CODE_OAUTH_TOKEN=baseline)
    assert temp_leftovers(state_dir) == []
    assert previous is not None, "no round ever persisted a token"
    assert status(server)["fingerprint"] == fingerprint(previous)
    assert fake_fp(server) == fingerprint(previous)


# --- disk faults on a real tmpfs -----------------------------------------------------


def run_mount(*args: str) -> None:
    """Run mount(8); skip where mounting is impossible only outside CI and not as root."""
    result = subprocess.run(["mount", *args], capture_output=True, text=True, check=False)
    if result.returncode == 0:
        return
    reason = f"mount {' '.join(args)} failed: {result.stderr.strip()}"
    if os.geteuid() != 0 and not os.environ.get("CI"):
        pytest.skip(reason)
    pytest.fail(reason)


@pytest.fixture
def tmpfs_home(turn_servers: TurnServers) -> Iterator[Path]:
    """A server home whose state dir is a 16 KiB tmpfs at 0700 (unmounted at teardown)."""
    home = turn_servers.home("tmpfs")
    state_dir = home / "state"
    state_dir.mkdir(mode=0o700)
    run_mount("-t", "tmpfs", "-o", "size=16k,mode=0700", "tmpfs", str(state_dir))
    try:
        yield home
    finally:
        # The servers are still up here (turn_servers closes after this fixture): lazy.
        subprocess.run(["umount", "-l", str(state_dir)], capture_output=True, check=False)


def fill(directory: Path) -> None:
    """Write a filler file until the filesystem answers ENOSPC."""
    chunk = b"\0" * 4096
    with (directory / "filler").open("wb", buffering=0) as handle:
        while True:
            try:
                handle.write(chunk)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC, exc
                return


@pytest.mark.parametrize("fault", ["disk-full", "read-only"])
def test_a_disk_fault_answers_persist_failed_and_changes_nothing(
    turn_servers: TurnServers, tmpfs_home: Path, secret_registry: SecretRegistry, fault: str
) -> None:
    """ENOSPC and EROFS: 500 persist_failed; generation, fingerprint, file and spawns unchanged."""
    state_dir = tmpfs_home / "state"
    override = state_dir / OVERRIDE_NAME
    server = turn_servers.start(tmpfs_home, CLAUDE_CODE_OAUTH_TOKEN=secret_registry.new("disk_b"))
    first = secret_registry.new("disk_first")
    assert reload(server, first).status_code == 200
    before = status(server)
    st_before = os.stat(override)

    if fault == "disk-full":
        fill(state_dir)
    else:
        run_mount("-o", "remount,ro", str(state_dir))
    refused = reload(server, secret_registry.new("disk_refused"))

    assert refused.status_code == 500, refused.text
    detail = refused.json()["detail"]
    assert detail["error_code"] == "persist_failed"
    assert isinstance(detail["message"], str)
    after = status(server)
    assert (after["generation"], after["fingerprint"]) == (
        before["generation"],
        before["fingerprint"],
    )
    assert after["fingerprint"] == fingerprint(first)
    assert file_token(override) == first
    assert os.stat(override).st_mtime_ns == st_before.st_mtime_ns
    assert os.stat(override).st_ino == st_before.st_ino
    assert temp_leftovers(state_dir) == []
    assert fake_fp(server) == fingerprint(first), "a spawn saw the refused token"

    # The fault was the disk: once it is gone, the same server persists again.
    if fault == "disk-full":
        (state_dir / "filler").unlink()
    else:
        run_mount("-o", "remount,rw", str(state_dir))
    again = secret_registry.new("disk_again")
    assert reload(server, again).status_code == 200
    assert file_token(override) == again


def test_a_symlink_at_boot_is_ignored_and_never_written_through(
    turn_servers: TurnServers, secret_registry: SecretRegistry
) -> None:
    """Boot ignores it with an ERROR line; reload answers persist_failed; the target is intact."""
    home = turn_servers.home("symlink-boot")
    state_dir = home / "state"
    state_dir.mkdir(mode=0o700)
    outside = home / "outside-token"
    outside_token = secret_registry.new("outside")
    outside.write_text(outside_token)
    outside.chmod(0o644)
    (state_dir / OVERRIDE_NAME).symlink_to(outside)
    baseline = secret_registry.new("symlink_baseline")

    server = turn_servers.start(home, CLAUDE_CODE_OAUTH_TOKEN=baseline)
    before = status(server)
    assert before["fingerprint"] == fingerprint(baseline), "boot followed the symlink"
    errors = [
        record["message"]
        for line in server.log_text().splitlines()
        if line.startswith("{") and (record := json.loads(line))["level"] == "ERROR"
    ]
    assert any("ignoring the token override file" in message for message in errors), errors
    assert_symlink_refused(server, state_dir, outside, outside_token, before, secret_registry)


def test_a_symlink_swapped_in_while_serving_is_never_written_through(
    turn_servers: TurnServers, secret_registry: SecretRegistry
) -> None:
    """A file replaced by a symlink after a good reload: the next reload refuses it."""
    home = turn_servers.home("symlink-live")
    state_dir = home / "state"
    server = turn_servers.start(home, CLAUDE_CODE_OAUTH_TOKEN=secret_registry.new("live_base"))
    first = secret_registry.new("live_first")
    assert reload(server, first).status_code == 200
    outside = home / "outside-token"
    outside_token = secret_registry.new("live_outside")
    outside.write_text(outside_token)
    override = state_dir / OVERRIDE_NAME
    override.unlink()
    override.symlink_to(outside)
    before = status(server)
    assert before["fingerprint"] == fingerprint(first)
    assert_symlink_refused(server, state_dir, outside, outside_token, before, secret_registry)


def assert_symlink_refused(
    server: ServerProcess,
    state_dir: Path,
    outside: Path,
    outside_token: str,
    before: dict[str, Any],
    secret_registry: SecretRegistry,
) -> None:
    """A reload answers 500 persist_failed, and the link, its target and memory are unchanged."""
    link = state_dir / OVERRIDE_NAME
    target_stat = os.stat(outside)
    refused = reload(server, secret_registry.new("through_link"))
    assert refused.status_code == 500, refused.text
    assert refused.json()["detail"]["error_code"] == "persist_failed"
    assert link.is_symlink() and os.readlink(link) == str(outside)
    assert outside.read_text() == outside_token
    after_stat = os.stat(outside)
    assert (after_stat.st_ino, after_stat.st_mtime_ns, stat.S_IMODE(after_stat.st_mode)) == (
        target_stat.st_ino,
        target_stat.st_mtime_ns,
        stat.S_IMODE(target_stat.st_mode),
    )
    after = status(server)
    assert (after["generation"], after["fingerprint"]) == (
        before["generation"],
        before["fingerprint"],
    )
    assert temp_leftovers(state_dir) == []


def process_umask(pid: int) -> int:
    """A live process's umask, from /proc."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Umask:"):
            return int(line.split()[1], 8)
    msg = f"no Umask line for pid {pid}"
    raise AssertionError(msg)


def test_a_server_under_umask_000_still_writes_0600(
    turn_servers: TurnServers, secret_registry: SecretRegistry
) -> None:
    """The server inherits umask 000; its state dir is 0700 and the override file 0600."""
    home = turn_servers.home("umask")
    old = os.umask(0)
    try:
        server = turn_servers.start(home, CLAUDE_CODE_OAUTH_TOKEN=secret_registry.new("um_base"))
    finally:
        os.umask(old)
    assert server.process is not None
    assert process_umask(server.process.pid) == 0
    token = secret_registry.new("umask_token")
    response = reload(server, token)
    assert response.status_code == 200, response.text
    state_dir = home / "state"
    assert stat.S_IMODE(os.stat(state_dir).st_mode) == 0o700
    assert file_token(state_dir / OVERRIDE_NAME) == token  # checks 0600
    assert temp_leftovers(state_dir) == []
