"""The operator/agent-managed `.env`, parsed with python-dotenv and cached by identity.

Re-read at every spawn (contract §4) but parsed only when the file's identity
(device, inode, size, mtime_ns) changes, so a spawn never sees a stale parse and an
unchanged 5,000-line file costs one `stat`. A parse of a file modified within the
last `RACY_WINDOW_NS` is not cached (a same-size rewrite in the same timestamp tick
would keep the same identity), so the cache never serves a stale parse.
"""

from __future__ import annotations

import errno
import io
import logging
import os
import stat
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType

from dotenv import dotenv_values

logger = logging.getLogger("agent_server.env_file")

_Identity = tuple[int, int, int, int]
_EMPTY: Mapping[str, str] = MappingProxyType({})
RACY_WINDOW_NS = 100_000_000
"""A file modified this close to (or after) the moment we read it may be rewritten
within the same timestamp tick, same size, same mtime_ns: such a parse is not cached."""


class DotenvFile:
    """One `.env` path; `read()` returns its current key/value mapping."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._identity: _Identity | None = None
        self._values: Mapping[str, str] = _EMPTY
        self._unreadable_logged = False

    def read(self) -> Mapping[str, str]:
        """The file's values now: `{}` when missing or unreadable (logged once).

        While the file is unchanged the same mapping object is returned, so a caller
        can tell a fresh parse from a cached one by identity.
        """
        try:
            st = os.stat(self.path)
            if not stat.S_ISREG(st.st_mode):
                # A FIFO or device would block or never end: only a regular file is read.
                msg = f"{self.path} is not a regular file"
                raise OSError(errno.EINVAL, msg)
            identity = _identity(st)
        except OSError as exc:
            return self._unreadable(exc)
        with self._lock:
            if identity == self._identity:
                return self._values
        started_ns = time.time_ns()
        try:
            # Read through one descriptor and take its identity from fstat, so the
            # cache key always describes exactly the bytes that were parsed.
            with open(self.path, "rb") as handle:
                identity = _identity(os.fstat(handle.fileno()))
                text = handle.read().decode("utf-8", errors="replace")
        except OSError as exc:
            return self._unreadable(exc)
        parsed = dotenv_values(stream=io.StringIO(text), interpolate=False)
        values = MappingProxyType({k: v for k, v in parsed.items() if v is not None})
        # Racy-git rule: trust the identity only once the mtime is safely in the past.
        trusted = started_ns - identity[3] > RACY_WINDOW_NS
        with self._lock:
            self._identity, self._values = (identity if trusted else None), values
            self._unreadable_logged = False
        return values

    def _unreadable(self, exc: OSError) -> Mapping[str, str]:
        with self._lock:
            self._identity, self._values = None, _EMPTY
            if not self._unreadable_logged:
                self._unreadable_logged = True
                logger.info(
                    "env file %s is missing or unreadable (%s); treating it as empty",
                    self.path,
                    type(exc).__name__,
                )
        return _EMPTY


def _identity(st: os.stat_result) -> _Identity:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
