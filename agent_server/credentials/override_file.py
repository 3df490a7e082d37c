"""The token override file `$AGENT_SERVER_STATE_DIR/oauth-token` (contract §3).

It is written by `secret_file.write_secret_file` (0600, crash-safe, never through a
symlink) and read back at boot, refusing what reload-token would refuse. The agent
may run as the same user and plant anything at the path: the read
(`secret_file.read_bounded`) refuses a symlink, never blocks on a FIFO and takes a
regular file of at most a token's size (contract §10).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from pydantic import SecretStr

from agent_server.secret_file import check_dir, read_bounded, write_secret_file
from agent_server.wire.values import MAX_TOKEN_BYTES, token_problem

logger = logging.getLogger("agent_server.override_file")

_READ_LIMIT = MAX_TOKEN_BYTES + 64  # room for hand-added blanks around the token


@dataclass(frozen=True)
class FileInfo:
    """What status shows of the override file: never its content."""

    exists: bool
    mode: str | None = None
    size: int | None = None
    mtime: float | None = None
    problem: str | None = None
    """Why the file is not used (a FIFO, a symlink, too large, not one token), or None."""


class OverrideFile:
    """The persisted rotated token: read at boot, rewritten by reload-token."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def prepare(self) -> None:
        """Create the state dir (0700) when missing and remove the temp files a crashed
        write left in it (of this file, the generated controller token, the chat session
        id: `results/` and `pending-results/` sweep their own)."""
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        for leftover in self.path.parent.glob("*.tmp.*"):
            with contextlib.suppress(OSError):
                leftover.unlink()
                logger.warning("removed a leftover temp file %s", leftover.name)

    def read(self) -> SecretStr | None:
        """The persisted token, or None when the file is missing or empty.

        Raises OSError for an unsafe location (a symlink, a FIFO, an open state dir) or
        anything reload-token would not accept, which the caller logs and ignores at boot.
        """
        try:
            check_dir(self.path.parent)
        except FileNotFoundError:
            return None  # no state dir yet: nothing was ever rotated in
        try:
            raw = read_bounded(self.path, _READ_LIMIT)
        except FileNotFoundError:
            return None
        token = raw.decode("utf-8", errors="strict").strip()
        # Never hand a spawn a truncated or mangled token: refuse what reload-token would.
        if token and token_problem(token) is not None:
            msg = f"{self.path} does not hold a single token of at most {MAX_TOKEN_BYTES} bytes"
            raise OSError(errno.EINVAL, msg)
        return SecretStr(token) if token else None

    def write_atomic(self, token: SecretStr) -> None:
        """Persist `token` crash-safely at 0600 (raises OSError, changing nothing)."""
        write_secret_file(self.path, token.get_secret_value())

    def holds(self, token: SecretStr) -> bool:
        """True when the file already holds exactly `token` (never raises)."""
        try:
            current = self.read()
        except (OSError, UnicodeDecodeError):
            return False
        return current is not None and current.get_secret_value() == token.get_secret_value()

    def info(self) -> FileInfo:
        """Existence, mode, size, mtime and any problem of the file (never its content)."""
        try:
            st = os.lstat(self.path)
        except OSError:
            return FileInfo(exists=False)
        problem = None
        try:
            self.read()
        except (OSError, UnicodeDecodeError) as exc:
            problem = (exc.strerror if isinstance(exc, OSError) else None) or str(exc)
        mode = f"{stat.S_IMODE(st.st_mode):04o}"
        return FileInfo(True, mode, st.st_size, st.st_mtime, problem)
