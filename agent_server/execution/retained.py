"""Retained results: every turn's terminal answer, kept on disk by execution id (contract §6.6).

A controller that lost a turn's answer (its connection dropped, it restarted) asks
`GET /api/executions/{id}/result` instead of re-running the turn. Each record is a
0600 file written crash-safely (`secret_file`), so a crash leaves the old record or
the new one, and it survives a restart. A retry that reuses the id overwrites: the
last terminal answer stands.

Bounded, with eviction after every write: records older than `RESULT_TTL_S` go,
then the oldest while there are more than `MAX_RESULTS` or more than
`MAX_RESULTS_BYTES` in all (an envelope's own log is bounded by `envelope.bound_log`).
Every method is blocking file work: callers run them in a thread. Retention never
fails a turn: a failed write is logged and counted by the caller.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from agent_server.execution.registry import RECENT_LIMIT
from agent_server.models import EXECUTION_ID_PATTERN
from agent_server.secret_file import check_dir, read_json_file, write_json_file

logger = logging.getLogger("agent_server.retained")

RESULT_TTL_S = 6 * 3600
MAX_RESULTS = RECENT_LIMIT
"""As many as the running list's `recently_completed_ids`."""
MAX_RESULTS_BYTES = 256 * 1024 * 1024
MAX_RECORD_BYTES = 64 * 1024 * 1024
"""A file larger than this is not read back (no record we write comes near it)."""
STALE_TEMP_S = 3600
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
        write_json_file(path, record)
        self.evict(now)

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
        """Delete expired records, then the oldest past the cap; return how many went."""
        now = time.time() if now is None else now
        try:
            check_dir(self.directory)
            entries = list(os.scandir(self.directory))
        except OSError:
            return 0
        records: list[tuple[float, int, str]] = []
        doomed: list[str] = []
        for entry in entries:
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if ".tmp." in entry.name:  # a write a crash interrupted
                if now - st.st_mtime > STALE_TEMP_S:
                    doomed.append(entry.path)
            elif entry.name.endswith(_SUFFIX):
                if now - st.st_mtime > self.ttl_s:
                    doomed.append(entry.path)
                else:
                    records.append((st.st_mtime, st.st_size, entry.path))
        records.sort()
        kept, total = len(records), sum(size for _, size, _ in records)
        for _, size, path in records:  # oldest first
            if kept <= self.max_results and total <= self.max_bytes:
                break
            doomed.append(path)
            kept, total = kept - 1, total - size
        for path in doomed:
            with contextlib.suppress(OSError):
                os.unlink(path)
        return len(doomed)

    def _path(self, execution_id: str) -> Path | None:
        # The id's charset has no `/`, `.` or NUL: the path cannot leave the directory.
        if not _ID.fullmatch(execution_id):
            return None
        return self.directory / f"{execution_id}{_SUFFIX}"
