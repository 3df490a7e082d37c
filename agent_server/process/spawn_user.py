"""The spawn user: every turn's CLI runs as another uid than the server (contract §10).

With `AGENT_SERVER_SPAWN_USER` set, each spawn goes through util-linux `setpriv`:
that user's uid and primary group, no supplementary group, no capability left in
any set (effective, permitted, inheritable, ambient, bounding) and `no_new_privs`,
so nothing the agent runs can become anyone else again. The server keeps its own
uid, its state dir (0700) and its memory out of the agent's reach, and still
signals, reaps and sweeps every process of a turn: as root, or as a user holding
CAP_SETUID, CAP_SETGID, CAP_KILL and CAP_SETPCAP (what `setpriv` needs to clear the
bounding set).

Unset, spawns run as the server's own uid (`same_uid`): the mode of a laptop's
`make run`, with what that leaves open said at boot and in the contract.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import pwd
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from agent_server.errors import ConfigError

SPAWN_USER_VARIABLE = "AGENT_SERVER_SPAWN_USER"
SETPRIV = "setpriv"
# Capability numbers (linux/capability.h): what switching users and cleaning up needs.
REQUIRED_CAPABILITIES = {"CAP_KILL": 5, "CAP_SETGID": 6, "CAP_SETUID": 7, "CAP_SETPCAP": 8}


@dataclass(frozen=True)
class SpawnUser:
    """The user every spawn runs as, and how to get there."""

    name: str
    uid: int
    gid: int
    home: Path
    setpriv: str
    """The `setpriv` executable (an absolute path)."""
    env: str = "/usr/bin/env"
    """coreutils `env`, which enters the workdir once the spawn is this user."""

    def launcher(self, workdir: Path) -> tuple[str, ...]:
        """The argv prefix that runs a command as this user with nothing left to gain, in
        `workdir`: entered as this user, since the agent's workdir may be closed to the
        server (a chdir before the switch would be the server's)."""
        return (
            self.setpriv,
            f"--reuid={self.uid}",
            f"--regid={self.gid}",
            "--clear-groups",
            "--inh-caps=-all",
            "--ambient-caps=-all",
            "--bounding-set=-all",
            "--no-new-privs",
            "--",
            self.env,
            f"--chdir={workdir}",
            "--",
        )

    def environ(self) -> dict[str, str]:
        """What a spawn's environment says about whose it is."""
        return {"HOME": str(self.home), "USER": self.name, "LOGNAME": self.name}


_LAUNCH_FAILURES = frozenset({125, 126, 127})
"""env's and setpriv's own exits: the workdir could not be entered, the command not run."""


def launcher_failed(exit_code: int | None, stderr: str) -> bool:
    """True when the launcher itself failed (no workdir, a command the spawn user cannot
    run): the CLI never started, as when a command is missing (contract §7 row 1)."""
    return exit_code in _LAUNCH_FAILURES and stderr.startswith(("setpriv: ", "env: "))


def resolve_spawn_user(raw: str) -> SpawnUser:
    """The user `raw` names (a name, or a uid with a passwd entry); ConfigError otherwise."""
    value = raw.strip()
    try:
        entry = pwd.getpwuid(int(value)) if value.isdigit() else pwd.getpwnam(value)
    except (KeyError, OverflowError):
        msg = f"{SPAWN_USER_VARIABLE}={raw!r} is not a user of this system"
        raise ConfigError(msg) from None
    setpriv, env = shutil.which(SETPRIV), shutil.which("env")
    if setpriv is None or env is None:
        msg = f"{SPAWN_USER_VARIABLE}={raw!r} needs util-linux setpriv and env on PATH"
        raise ConfigError(msg)
    return SpawnUser(entry.pw_name, entry.pw_uid, entry.pw_gid, Path(entry.pw_dir), setpriv, env)


def check_can_switch(user: SpawnUser) -> None:
    """Refuse (ConfigError, one line) a spawn user this server cannot become, or is."""
    if user.uid == os.geteuid():
        msg = (
            f"{SPAWN_USER_VARIABLE}={user.name} is the server's own user: "
            "the agent would reach the server (set it empty, "
            f"{SPAWN_USER_VARIABLE}=, to run spawns as this user knowingly)"
        )
        raise ConfigError(msg)
    if os.geteuid() == 0:
        return
    held = effective_capabilities()
    missing = [name for name, bit in REQUIRED_CAPABILITIES.items() if not held >> bit & 1]
    if missing:
        msg = (
            f"{SPAWN_USER_VARIABLE}={user.name} needs root or {', '.join(REQUIRED_CAPABILITIES)}; "
            f"this server lacks {', '.join(missing)}"
        )
        raise ConfigError(msg)


def effective_capabilities() -> int:
    """This process's effective capability set, as a bit mask (0 where unreadable)."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("CapEff:"):
                    return int(line.split()[1], 16)
    except (OSError, ValueError):
        pass
    return 0


_libc = ctypes.CDLL(None, use_errno=True)


@contextlib.contextmanager
def file_ids_of(user: SpawnUser | None) -> Iterator[None]:
    """Open files as `user` on this thread only (Linux `setfsuid`), e.g. to read a spawned
    process's `/proc/<pid>/environ`, which the kernel shows to its own uid.

    The file-system ids are per thread, and glibc does not spread `setfsuid` to the
    others: nothing else the server does changes while this holds. None: as we are.
    """
    if user is None:
        yield
        return
    _libc.setfsgid(user.gid)
    _libc.setfsuid(user.uid)
    try:
        yield
    finally:
        _libc.setfsuid(os.geteuid())
        _libc.setfsgid(os.getegid())
