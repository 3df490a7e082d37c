"""The spawn user (contract §10): whom spawns run as, and when the server refuses to start."""

from __future__ import annotations

import os
import pwd
import threading
from pathlib import Path

import pytest

from agent_server.config import Settings
from agent_server.errors import ConfigError
from agent_server.process import spawn_user
from agent_server.process.spawn_user import (
    SpawnUser,
    check_can_switch,
    file_ids_of,
    launcher_failed,
    resolve_spawn_user,
)
from tests.conftest import unavailable

NOBODY = pwd.getpwnam("nobody")


def _user(uid: int = NOBODY.pw_uid) -> SpawnUser:
    return SpawnUser("agent", uid, uid, Path("/home/agent"), "/usr/bin/setpriv", "/usr/bin/env")


def test_the_launcher_leaves_the_spawn_nothing_to_gain() -> None:
    """Its uid and group, no other group, every capability set empty, no_new_privs; the
    workdir entered as that user."""
    assert _user(1000).launcher(Path("/work")) == (
        "/usr/bin/setpriv",
        "--reuid=1000",
        "--regid=1000",
        "--clear-groups",
        "--inh-caps=-all",
        "--ambient-caps=-all",
        "--bounding-set=-all",
        "--no-new-privs",
        "--",
        "/usr/bin/env",
        "--chdir=/work",
        "--",
    )


@pytest.mark.parametrize(
    "raw",
    [
        pytest.param("nobody", id="a name"),
        pytest.param(str(NOBODY.pw_uid), id="a uid"),
        pytest.param(" nobody ", id="blanks are forgiven"),
    ],
)
def test_a_spawn_user_is_resolved_by_name_or_uid(raw: str) -> None:
    """Its uid, primary group and home come from the passwd entry."""
    user = resolve_spawn_user(raw)
    assert (user.name, user.uid, user.gid) == ("nobody", NOBODY.pw_uid, NOBODY.pw_gid)
    assert user.home == Path(NOBODY.pw_dir)
    assert Path(user.setpriv).name == "setpriv"


@pytest.mark.parametrize("raw", ["no-such-user-here", "4294967294000"])
def test_an_unknown_spawn_user_refuses_to_start(raw: str) -> None:
    """A name or uid without a passwd entry is one line naming the variable."""
    with pytest.raises(ConfigError, match=r"AGENT_SERVER_SPAWN_USER=.* is not a user"):
        resolve_spawn_user(raw)


def test_a_spawn_user_that_is_the_server_itself_refuses_to_start() -> None:
    """Separation from oneself would be a lie: refused, however privileged."""
    with pytest.raises(ConfigError, match="the server's own user"):
        check_can_switch(_user(os.geteuid()))


@pytest.mark.parametrize(
    ("capabilities", "missing"),
    [
        pytest.param(0, "CAP_KILL, CAP_SETGID, CAP_SETUID, CAP_SETPCAP", id="none"),
        pytest.param(1 << 6 | 1 << 7, "CAP_KILL, CAP_SETPCAP", id="may switch, may not signal"),
        pytest.param(1 << 5 | 1 << 6 | 1 << 7, "CAP_SETPCAP", id="no bounding-set drop"),
    ],
)
def test_a_server_that_cannot_switch_refuses_to_start(
    monkeypatch: pytest.MonkeyPatch, capabilities: int, missing: str
) -> None:
    """Not root and lacking a capability: the one line says which."""
    monkeypatch.setattr(spawn_user.os, "geteuid", lambda: 4242)
    monkeypatch.setattr(spawn_user, "effective_capabilities", lambda: capabilities)
    with pytest.raises(ConfigError, match=f"this server lacks {missing}$"):
        check_can_switch(_user(1000))


def test_a_server_with_the_four_capabilities_may_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    """CAP_KILL, CAP_SETGID, CAP_SETUID and CAP_SETPCAP are enough without root."""
    monkeypatch.setattr(spawn_user.os, "geteuid", lambda: 4242)
    monkeypatch.setattr(spawn_user, "effective_capabilities", lambda: 0b1_1110_0000)
    check_can_switch(_user(1000))


def test_effective_capabilities_are_read_from_proc() -> None:
    """Root holds CAP_SETUID; another user (here) holds none by default."""
    held = spawn_user.effective_capabilities()
    assert bool(held >> 7 & 1) is (os.geteuid() == 0)


def _fsuid(thread_id: int) -> int:
    status = Path(f"/proc/self/task/{thread_id}/status").read_text()
    return int(status.split("Uid:")[1].split()[3])


def test_file_ids_change_for_the_calling_thread_only_and_come_back() -> None:
    """setfsuid is per thread: the loop's other threads never open a file as the agent."""
    if os.geteuid() != 0:
        unavailable("setfsuid to another user needs CAP_SETUID (run as root)")
    other = threading.Event()
    release = threading.Event()
    worker = threading.Thread(target=lambda: (other.set(), release.wait(10)))
    worker.start()
    other.wait(10)
    try:
        me = threading.get_native_id()
        with file_ids_of(_user()):
            assert _fsuid(me) == NOBODY.pw_uid
            assert _fsuid(worker.native_id or 0) == 0
        assert _fsuid(me) == 0
    finally:
        release.set()
        worker.join(10)


def test_a_spawn_user_owns_the_agents_home(tmp_path: Path) -> None:
    """`~` of the workdir and `.env` is that user's home, and so is every spawn's HOME."""
    settings = Settings.from_environ(
        {"HOME": str(tmp_path), "USER": "root", "AGENT_SERVER_SPAWN_USER": "nobody"}
    )
    assert settings.spawn_user is not None
    home = Path(NOBODY.pw_dir)
    assert (settings.workdir, settings.env_file) == (home, home / ".env")
    assert settings.state_dir == tmp_path / ".local" / "state" / "agent-server"
    assert settings.baseline_env["HOME"] == str(home)
    assert (settings.baseline_env["USER"], settings.baseline_env["LOGNAME"]) == ("nobody",) * 2


@pytest.mark.parametrize(
    ("exit_code", "stderr", "failed"),
    [
        pytest.param(125, "env: cannot change directory to '/w': Permission denied\n", True,
                     id="the workdir closed to the spawn user"),
        pytest.param(127, "env: 'claude': No such file or directory\n", True, id="no CLI"),
        pytest.param(126, "env: 'claude': Permission denied\n", True, id="not executable"),
        pytest.param(127, "setpriv: failed to execute env\n", True, id="no env"),
        pytest.param(1, "env: something the CLI printed\n", False, id="the CLI's own exit"),
        pytest.param(127, "claude: oops\n", False, id="the CLI's own 127"),
    ],
)  # fmt: skip
def test_a_failed_launch_is_told_from_the_clis_own_exit(
    exit_code: int, stderr: str, failed: bool
) -> None:
    """Only the launcher's own exits and words mean the CLI never ran."""
    assert launcher_failed(exit_code, stderr) is failed
