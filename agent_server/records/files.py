"""A directory of records named by execution id, bounded by age, count and bytes.

Retained results (`results/`, contract §6.6) and pending callbacks (`pending-results/`,
§6.8) are both one file a turn, `<execution_id>.json`, written crash-safely at 0600
(`secret_file`). Everything read back is treated as the agent's (in same-uid mode it
can write here, contract §10):

- only a name that is a valid execution id plus the suffix is a record; the id's
  charset (`[A-Za-z0-9_-]`) has no `/`, `.` or NUL, so it names no other path;
- a record is opened non-blocking, without following a symlink, and must be a
  regular file within its size bound (`secret_file.open_bounded`);
- it is fresh only from its write until `ttl_s` later: an mtime more than
  `CLOCK_SKEW_S` in the future is no fresh record but a forged or broken one;
- after every write, and at every listing, expired records go, then the oldest while
  there are more than `max_count` or more than `max_bytes` in all;
- temp files of a write a crash interrupted are removed at boot (`sweep`).

The store knows the records from what it wrote, and lists the directory once every
`RELIST_S` (and on the first write) to learn what changed behind it. Every method is
blocking file work: callers run them in a thread.
"""

from __future__ import annotations

import contextlib
import os
import re
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from agent_server.secret_file import TEMP_INFIX, check_dir, open_bounded, write_secret_file
from agent_server.wire.values import EXECUTION_ID_PATTERN

RELIST_S = 60.0
"""How long the store trusts what it wrote before it lists the directory again."""
CLOCK_SKEW_S = 5.0
"""How far in the future an mtime may be (a clock step) and its record still count."""
SUFFIX = ".json"
_ID = re.compile(EXECUTION_ID_PATTERN)


@dataclass(frozen=True)
class Bounds:
    """How old, how many and how large the records of one directory may be."""

    ttl_s: float
    max_count: int
    max_bytes: int
    max_record_bytes: int
    """A file larger than this is never read (no record the server writes comes near)."""


@dataclass(frozen=True)
class Listed:
    """A fresh record found in the directory."""

    execution_id: str
    path: Path
    mtime: float
    size: int


class RecordFiles:
    """The records under one directory, within `bounds`."""

    def __init__(self, directory: Path, bounds: Bounds) -> None:
        self.directory = directory
        self.bounds = bounds
        self._lock = threading.Lock()
        self._known: dict[str, tuple[float, int]] = {}
        """Record path -> (mtime, size), oldest first."""
        self._listed_at: float | None = None

    def path(self, execution_id: str) -> Path | None:
        """The record's path, or None when `execution_id` is not an execution id."""
        return self.directory / f"{execution_id}{SUFFIX}" if _ID.fullmatch(execution_id) else None

    def write(self, execution_id: str, pieces: Iterable[str | bytes]) -> int:
        """Write the record of `execution_id` from its text `pieces`, then evict; its size.

        Raises ValueError for an id that is none, OSError when the record could not be
        written (nothing half-written stays).
        """
        path = self.path(execution_id)
        if path is None:
            msg = f"not an execution id: {execution_id!r}"
            raise ValueError(msg)
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        size = write_secret_file(path, pieces)
        now = time.time()
        with self._lock:
            if self._listed_at is None or now - self._listed_at > RELIST_S:
                self._list(now)
            else:
                self._known.pop(str(path), None)  # an overwrite is the newest again
                self._known[str(path)] = (now, size)
            self._evict_known(now)
        return size

    def open(self, execution_id: str) -> tuple[int, os.stat_result] | None:
        """An open descriptor of the fresh record of `execution_id` and its stat, or None
        (no such id, no record, expired, not a regular file, over its bound)."""
        path = self.path(execution_id)
        if path is None:
            return None
        try:
            fd, st = open_bounded(path, self.bounds.max_record_bytes)
        except OSError:
            return None
        if not self._fresh(st.st_mtime, time.time()):
            os.close(fd)
            return None
        return fd, st

    def remove(self, execution_id: str) -> None:
        """Delete the record of `execution_id`, if there is one."""
        path = self.path(execution_id)
        if path is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            with self._lock:
                self._known.pop(str(path), None)

    def listing(self) -> list[Listed]:
        """The fresh records, oldest first, after evicting what is past the bounds."""
        now = time.time()
        with self._lock:
            self._list(now)
            self._evict_known(now)
            known = list(self._known.items())
        return [
            Listed(Path(path).name.removesuffix(SUFFIX), Path(path), mtime, size)
            for path, (mtime, size) in known
        ]

    def sweep(self) -> int:
        """At boot: delete every temp file a crashed write left, then evict; how many went."""
        try:
            temps = [e.path for e in os.scandir(self.directory) if TEMP_INFIX in e.name]
        except OSError:
            temps = []
        removed = _unlink_all(temps)
        now = time.time()
        with self._lock:
            return removed + self._list(now) + self._evict_known(now)

    def _fresh(self, mtime: float, now: float) -> bool:
        return -CLOCK_SKEW_S <= now - mtime <= self.bounds.ttl_s

    def _list(self, now: float) -> int:
        """Learn the records from the directory; delete the temp files a crash left long
        ago (a write in progress is younger than an hour)."""
        try:
            check_dir(self.directory)
            entries = list(os.scandir(self.directory))
        except OSError:
            return 0
        records: list[tuple[float, int, str]] = []
        stale: list[str] = []
        for entry in entries:
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if TEMP_INFIX in entry.name:
                if now - st.st_mtime > 3600:
                    stale.append(entry.path)
            elif entry.name.endswith(SUFFIX) and _ID.fullmatch(entry.name.removesuffix(SUFFIX)):
                records.append((st.st_mtime, st.st_size, entry.path))
        self._known = {path: (mtime, size) for mtime, size, path in sorted(records)}
        self._listed_at = now
        return _unlink_all(stale)

    def _evict_known(self, now: float) -> int:
        """Delete what is not fresh, then the oldest while over the count or the bytes."""
        bounds = self.bounds
        kept, total = len(self._known), sum(size for _, size in self._known.values())
        doomed: list[str] = []
        for path, (mtime, size) in self._known.items():  # oldest first
            if self._fresh(mtime, now) and kept <= bounds.max_count and total <= bounds.max_bytes:
                continue
            doomed.append(path)
            kept, total = kept - 1, total - size
        for path in doomed:
            del self._known[path]
        return _unlink_all(doomed)


def _unlink_all(paths: list[str]) -> int:
    for path in paths:
        with contextlib.suppress(OSError):
            os.unlink(path)
    return len(paths)
