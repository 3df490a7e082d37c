"""Retained results: every turn's terminal answer, kept on disk by execution id (contract §6.6).

A controller that lost a turn's answer (its connection dropped, it restarted) asks
`GET /api/executions/{id}/result` instead of re-running the turn. Each record is a
0600 file written crash-safely (`secret_file`), so a crash leaves the old record or
the new one, and it survives a restart. A retry that reuses the id overwrites: the
last terminal answer stands.

Bounded, with eviction after every write: records older than `RESULT_TTL_S` go,
then the oldest while there are more than `MAX_RESULTS` or more than
`MAX_RESULTS_BYTES` in all (an envelope's own log is bounded by `envelope.bound_log`).
The store knows its records from what it wrote, and lists the directory once every
`RELIST_S` (and on the first write) to learn what changed behind it: listing up to 200
files after every write cost a turn more CPU than writing its record. Every method is
blocking file work: callers run them in one thread. Retention never fails a turn: a
failed write is logged and counted by the caller.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from agent_server.models import EXECUTION_ID_PATTERN
from agent_server.secret_file import check_dir, read_json_file, write_json_file

logger = logging.getLogger("agent_server.retained")

RESULT_TTL_S = 6 * 3600
MAX_RESULTS = 200
"""As many as the running list's `recently_completed_ids` (`Registry` reads it here)."""
MAX_RESULTS_BYTES = 256 * 1024 * 1024
MAX_RECORD_BYTES = 64 * 1024 * 1024
"""A file larger than this is not read back (no record we write comes near it)."""
STALE_TEMP_S = 3600
RELIST_S = 60.0
"""How long the store trusts what it wrote before it lists the directory again."""
_ID = re.compile(EXECUTION_ID_PATTERN)
_SUFFIX = ".json"


class RetainedResults:
    """The records under one directory of the state dir."""

    def __init__(
        self,
        directory: Path,
        *,
        ttl_s: float = RESULT_TTL_S,
        max_results: int = MAX_RESULTS,
        max_bytes: int = MAX_RESULTS_BYTES,
    ) -> None:
        self.directory = directory
        self.ttl_s = ttl_s
        self.max_results = max_results
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._known: dict[str, tuple[float, int]] = {}
        """Record path -> (mtime, size), oldest first."""
        self._listed_at: float | None = None

    def keep(self, execution_id: str, envelope: dict[str, Any]) -> None:
        """Write the record of a terminal answer (already redacted), then evict.

        Raises OSError when the record could not be written; nothing half-written stays.
        """
        path = self._path(execution_id)
        if path is None:
            msg = f"not an execution id: {execution_id!r}"
            raise ValueError(msg)
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        now = time.time()
        record = {**envelope, "retained_at": datetime.fromtimestamp(now, UTC).isoformat()}
        size = write_json_file(path, record)
        with self._lock:
            if self._listed_at is None or now - self._listed_at > RELIST_S:
                self._list(now)
            else:
                self._known.pop(str(path), None)  # an overwrite is the newest again
                self._known[str(path)] = (now, size)
            self._evict_known(now)

    def get(self, execution_id: str) -> dict[str, Any] | None:
        """The record of `execution_id`, or None when unknown, expired or unreadable."""
        path = self._path(execution_id)
        if path is None:
            return None
        try:
            age = time.time() - path.stat().st_mtime
        except OSError:
            return None
        return read_json_file(path, MAX_RECORD_BYTES) if age <= self.ttl_s else None

    def evict(self, now: float | None = None) -> int:
        """List the directory, then delete expired records and the oldest past the cap;
        return how many went."""
        now = time.time() if now is None else now
        with self._lock:
            return self._list(now) + self._evict_known(now)

    def _list(self, now: float) -> int:
        """Learn the records from the directory; delete the temp files a crash left."""
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
            if ".tmp." in entry.name:  # a write a crash interrupted
                if now - st.st_mtime > STALE_TEMP_S:
                    stale.append(entry.path)
            elif entry.name.endswith(_SUFFIX):
                records.append((st.st_mtime, st.st_size, entry.path))
        self._known = {path: (mtime, size) for mtime, size, path in sorted(records)}
        self._listed_at = now
        return _unlink_all(stale)

    def _evict_known(self, now: float) -> int:
        """Delete the expired records, then the oldest while over the count or the bytes."""
        kept, total = len(self._known), sum(size for _, size in self._known.values())
        doomed: list[str] = []
        for path, (mtime, size) in self._known.items():  # oldest first
            fresh = now - mtime <= self.ttl_s
            if fresh and kept <= self.max_results and total <= self.max_bytes:
                break
            doomed.append(path)
            kept, total = kept - 1, total - size
        for path in doomed:
            del self._known[path]
        return _unlink_all(doomed)

    def _path(self, execution_id: str) -> Path | None:
        # The id's charset has no `/`, `.` or NUL: the path cannot leave the directory.
        if not _ID.fullmatch(execution_id):
            return None
        return self.directory / f"{execution_id}{_SUFFIX}"


def _unlink_all(paths: list[str]) -> int:
    for path in paths:
        with contextlib.suppress(OSError):
            os.unlink(path)
    return len(paths)
