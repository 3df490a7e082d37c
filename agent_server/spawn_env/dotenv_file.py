"""The operator/agent-managed `.env`, read safely, parsed by python-dotenv, cached by identity.

Re-read for every spawn (contract §4.2) but parsed only when the file's identity
(device, inode, size, mtime_ns) changes, so a spawn never sees a stale parse and an
unchanged file costs one `stat` (`cached`), and so does a file that stays missing. A
parse of a file modified within the last `RACY_WINDOW_NS` is not cached (a same-size
rewrite in the same timestamp tick would keep the same identity).

The agent writes this file, so every read is hostile input (contract §10):

- it is opened with `O_NONBLOCK` (a FIFO swapped in cannot block the open) and
  `fstat` must then say a regular file of at most `MAX_DOTENV_BYTES`; the `.env` may
  be a symlink, and its target is what is checked;
- a line holding a NUL byte or bytes that are not UTF-8 is skipped, never passed on;
- anything else wrong makes the file count as empty, with one WARNING and a
  `problem` the status report shows;
- with a spawn user, the file is looked at with that user's file-system ids: the
  agent's file, read as the agent could read it.
"""

from __future__ import annotations

import io
import logging
import os
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType

from dotenv import dotenv_values

from agent_server.process.spawn_user import SpawnUser, file_ids_of
from agent_server.secret_file import read_bounded_and_stat

logger = logging.getLogger("agent_server.env_file")

MAX_DOTENV_BYTES = 1024 * 1024
_Identity = tuple[int, int, int, int]
_EMPTY: Mapping[str, str] = MappingProxyType({})
_MISSING: _Identity = (-1, -1, -1, -1)
"""The identity of no file at the path: a `.env` that stays missing is not read again."""
RACY_WINDOW_NS = 100_000_000
"""A file modified this close to (or after) the moment we read it may be rewritten
within the same timestamp tick, same size, same mtime_ns: such a parse is not cached."""


class DotenvFile:
    """One `.env` path; `read()` returns its current key/value mapping."""

    def __init__(self, path: Path, read_as: SpawnUser | None = None) -> None:
        self.path = path
        self.read_as = read_as
        """The spawn user, whose file-system ids every look at the file is made with: the
        server reads the agent's `.env` as the agent could, never a file only the server
        may read (a `.env` symlinked to the server's own token is refused)."""
        self._lock = threading.Lock()
        self._identity: _Identity | None = None
        self._values: Mapping[str, str] = _EMPTY
        self._problem: str | None = None
        self._reported: str | None = None

    @property
    def problem(self) -> str | None:
        """Why the last read took the file as empty or skipped lines, or None."""
        return self._problem

    def cached(self) -> Mapping[str, str] | None:
        """The values of the last parse if the file is unchanged since (or still
        missing), else None.

        One `stat`, which never blocks (not even on a FIFO): cheap enough for the
        event loop, so only a real parse needs a worker thread.
        """
        try:
            with file_ids_of(self.read_as):
                identity = _identity(os.stat(self.path))
        except FileNotFoundError:
            identity = _MISSING
        except OSError:
            return None
        with self._lock:
            return self._values if identity == self._identity else None

    def read(self) -> Mapping[str, str]:
        """The file's values now: `{}` when missing, unreadable or unsafe (logged once).

        While the file is unchanged the same mapping object is returned, so a caller
        can tell a fresh parse from a cached one by identity. Never blocks on the
        file's type; run it off the event loop, since a parse of up to 1 MiB takes
        a while.
        """
        cached = self.cached()
        if cached is not None:
            return cached
        started_ns = time.time_ns()
        try:
            with file_ids_of(self.read_as):  # a symlinked `.env`: its target is checked
                raw, st = read_bounded_and_stat(self.path, MAX_DOTENV_BYTES, follow=True)
        except FileNotFoundError:
            return self._settle(_MISSING, _EMPTY, None, quiet=True)
        except OSError as exc:
            reason = exc.strerror or str(exc) or type(exc).__name__
            return self._settle(None, _EMPTY, f"not read: {reason}")
        identity = _identity(st)
        text, skipped = _clean_lines(raw)
        parsed = dotenv_values(stream=io.StringIO(text), interpolate=False)
        values = MappingProxyType({k: v for k, v in parsed.items() if v is not None})
        problem = None
        if skipped:
            shown = ", ".join(str(n) for n in skipped[:10]) + (", …" if len(skipped) > 10 else "")
            problem = f"{len(skipped)} line(s) skipped: a NUL byte or not UTF-8 (line {shown})"
        # Racy-git rule: trust the identity only once the mtime is safely in the past.
        trusted = started_ns - identity[3] > RACY_WINDOW_NS
        return self._settle(identity if trusted else None, values, problem)

    def _settle(
        self,
        identity: _Identity | None,
        values: Mapping[str, str],
        problem: str | None,
        *,
        quiet: bool = False,
    ) -> Mapping[str, str]:
        with self._lock:
            self._identity, self._values, self._problem = identity, values, problem
            report = problem or ("missing" if quiet else None)
            if report is not None and report != self._reported:
                # Once per distinct problem: a file that stays broken is not news.
                log = logger.info if quiet else logger.warning
                log("env file %s: %s; treating %s", self.path, report, _what(quiet, values))
            self._reported = report
        return values


def _what(quiet: bool, values: Mapping[str, str]) -> str:
    return "it as empty" if quiet or not values else "the rest as usual"


def _clean_lines(raw: bytes) -> tuple[str, list[int]]:
    """The file's text without the lines that hold a NUL or invalid UTF-8 (1-based numbers)."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    if text is not None and "\0" not in text:
        return text, []
    kept: list[str] = []
    skipped: list[int] = []
    for number, line in enumerate(raw.split(b"\n"), start=1):
        try:
            decoded = line.decode("utf-8")
        except UnicodeDecodeError:
            skipped.append(number)
            continue
        if "\0" in decoded:
            skipped.append(number)
            continue
        kept.append(decoded)
    return "\n".join(kept), skipped


def _identity(st: os.stat_result) -> _Identity:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
