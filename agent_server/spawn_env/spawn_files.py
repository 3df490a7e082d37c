"""Files the server writes for its spawns to read: a CLI's headless settings (contract §6.3).

Gemini CLI takes the settings it needs to run headless (its own retries off, an auth
type) only from a settings file, and the one it lets a variable point anywhere, its
system defaults, it reads only when root owns the file and every directory above it.
So the server writes such files only when it runs as root: in a directory of its own
under `/run/agent-server` (root's, 0755, like every directory above it), never in the
state dir, which no spawn may read, and never in a file the agent owns. Each file is
0644 (a spawn running as another user reads it), named by its content and written
once; the directory goes at shutdown. A server that is not root writes none: the
CLI then runs with its own settings, and `/health` says what that costs when it
would fail.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import stat
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from agent_server.secret_file import write_secret_file

logger = logging.getLogger("agent_server.spawn_files")

RUN_DIR = Path("/run/agent-server")


@dataclass(frozen=True)
class SpawnFile:
    """A file a CLI reads to run headless, written by the server, never by the agent.

    The spawn finds it through `variable` (its path), unless the environment already
    names one: the operator's own file wins.
    """

    variable: str
    name: str
    content: bytes


def _alive(pid: str) -> bool:
    """True when process `pid` exists (or the name holds no pid: keep what is unknown)."""
    if not pid.isdigit():
        return True
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


def _root_only(path: Path) -> bool:
    """True when root owns `path` and neither group nor others may write it."""
    info = path.lstat()
    return info.st_uid == 0 and stat.S_ISDIR(info.st_mode) and not info.st_mode & 0o022


class SpawnFiles:
    """Where the server writes spawn files: a directory of its own under `base`, made at
    the first file (`base` None: the server writes none, not being root)."""

    def __init__(self, base: Path | None) -> None:
        self.base = base
        self.directory: Path | None = None
        self._warned = False

    @classmethod
    def for_server(cls, base: Path = RUN_DIR, *, euid: int | None = None) -> SpawnFiles:
        """Files under `base` when the server runs as root; none otherwise."""
        return cls(base if (os.geteuid() if euid is None else euid) == 0 else None)

    def _open(self) -> Path | None:
        """The directory, made now when it is not yet: root's 0755 under a `base` that is
        root's alone up to `/`; the leftovers of servers no longer running are removed."""
        if self.directory is not None or self.base is None:
            return self.directory
        base, self.base = self.base, None  # one try: a failure is logged once
        try:
            base.mkdir(mode=0o755, exist_ok=True)
            if not all(_root_only(directory) for directory in (base, *base.parents)):
                logger.warning("spawn files: %s is not root's alone; writing none", base)
                return None
            for stale in base.glob("spawn-*-*"):
                if not _alive(stale.name.split("-")[1]):
                    shutil.rmtree(stale, ignore_errors=True)
            self.directory = Path(tempfile.mkdtemp(prefix=f"spawn-{os.getpid()}-", dir=base))
            self.directory.chmod(0o755)  # the spawn may run as another user
        except OSError as exc:
            logger.warning("spawn files: cannot use %s (%s); writing none", base, exc)
        return self.directory

    def env_for(self, env: Mapping[str, str], files: tuple[SpawnFile, ...]) -> dict[str, str]:
        """`env` with each file's variable naming it, unless `env` names one already."""
        placed = dict(env)
        for file in files:
            if env.get(file.variable):
                continue  # the operator's own file wins
            path = self._place(file)
            if path is not None:
                placed[file.variable] = str(path)
        return placed

    def _place(self, file: SpawnFile) -> Path | None:
        directory = self._open()
        if directory is None:
            if not self._warned:
                self._warned = True
                logger.warning(
                    "spawn files: %s is not written (the CLI trusts it only from root, in a "
                    "directory only root may write): the CLI runs with its own settings",
                    file.name,
                )
            return None
        digest = hashlib.sha256(file.content).hexdigest()[:16]
        path = directory / f"{digest}-{file.name}"
        if path.exists():
            return path
        try:
            write_secret_file(path, (file.content,), mode=0o644)  # crash-safe, no symlink
        except OSError as exc:
            logger.warning("spawn files: cannot write %s (%s)", path, exc)
            return None
        return path

    def close(self) -> None:
        """Remove the directory and its files (at shutdown)."""
        if self.directory is not None:
            shutil.rmtree(self.directory, ignore_errors=True)
