"""The token override file `$AGENT_SERVER_STATE_DIR/oauth-token` (contract §3).

Written like consul-template's AtomicWrite, but never create-then-chmod: the temp
file is born 0600 with O_EXCL|O_NOFOLLOW in the same directory, synced, renamed over
the target, and the directory synced. A crash at any instant leaves either the old
complete token or the new complete token. Unsafe places are refused, never followed.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
import secrets
import stat
from dataclasses import dataclass
from pathlib import Path

from pydantic import SecretStr

logger = logging.getLogger("agent_server.override_file")

_CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC
MAX_TOKEN_BYTES = 4096
_READ_LIMIT = MAX_TOKEN_BYTES + 64  # room for hand-added blanks around the token
_UNSAFE_CHARS = re.compile(r"[\s\x00-\x1f\x7f]")


class UnsafeLocation(OSError):
    """The target is a symlink, or the state dir is writable by group or others."""


@dataclass(frozen=True)
class FileInfo:
    """What status shows of the override file: never its content."""

    exists: bool
    mode: str | None = None
    size: int | None = None
    mtime: float | None = None


def write_secret_file(path: Path, value: str) -> None:
    """Write `value` to `path` crash-safely at mode 0600, whatever the umask.

    Raises OSError (UnsafeLocation for a symlinked target or an open state dir);
    on any failure the target is untouched and no temp file is left.
    """
    check_dir(path.parent)
    if path.is_symlink():
        msg = f"refusing to write through a symlink at {path}"
        raise UnsafeLocation(msg)
    tmp = path.with_name(f"{path.name}.tmp.{secrets.token_hex(8)}")
    fd = os.open(tmp, _CREATE_FLAGS, 0o600)
    try:
        try:
            os.fchmod(fd, 0o600)  # the mode at creation already is; keep it explicit
            data = value.encode()
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _fsync_dir(path.parent)


def check_dir(directory: Path) -> None:
    """Refuse a state dir that is a symlink target's stand-in or writable by others."""
    st = os.stat(directory)
    if not stat.S_ISDIR(st.st_mode):
        msg = f"{directory} is not a directory"
        raise UnsafeLocation(msg)
    if st.st_mode & 0o022:
        msg = f"state dir {directory} is writable by group or others (mode {st.st_mode & 0o777:o})"
        raise UnsafeLocation(msg)


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class OverrideFile:
    """The persisted rotated token: read at boot, rewritten by reload-token."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def prepare(self) -> None:
        """Create the state dir (0700) when missing and remove temp leftovers."""
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        for leftover in self.path.parent.glob(f"{self.path.name}.tmp.*"):
            with contextlib.suppress(OSError):
                leftover.unlink()
                logger.warning("removed a leftover temp file %s", leftover.name)

    def read(self) -> SecretStr | None:
        """The persisted token, or None when the file is missing or empty.

        Raises OSError for an unsafe location (symlink, open state dir), which the
        caller logs and ignores at boot.
        """
        try:
            check_dir(self.path.parent)
        except FileNotFoundError:
            return None  # no state dir yet: nothing was ever rotated in
        try:
            fd = os.open(self.path, _READ_FLAGS)
        except FileNotFoundError:
            return None
        except OSError as exc:
            if self.path.is_symlink():
                msg = f"refusing to follow a symlink at {self.path}"
                raise UnsafeLocation(msg) from exc
            raise
        with os.fdopen(fd, "rb") as handle:
            raw = handle.read(_READ_LIMIT + 1)
        token = raw.decode("utf-8", errors="strict").strip()
        # Never hand a spawn a truncated or mangled token: refuse what reload-token would.
        if (
            len(raw) > _READ_LIMIT
            or len(token.encode()) > MAX_TOKEN_BYTES
            or _UNSAFE_CHARS.search(token)
        ):
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
        """Existence, mode, size and mtime of the file (never its content)."""
        try:
            st = os.lstat(self.path)
        except OSError:
            return FileInfo(exists=False)
        return FileInfo(True, f"{stat.S_IMODE(st.st_mode):04o}", st.st_size, st.st_mtime)
