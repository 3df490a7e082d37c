"""Retained results: every turn's terminal answer, kept on disk by execution id (contract §6.6).

A controller that lost a turn's answer (its connection dropped, it restarted) asks
`GET /api/executions/{id}/result` instead of re-running the turn. Each record is the
turn's envelope as compact JSON, its `execution_id` first, in a bounded directory of
records (`files.RecordFiles`: 0600, crash-safe, 6 hours, 200 records, 256 MiB). A
retry that reuses the id overwrites: the last terminal answer stands.

A record is read back as a stream of its bytes, a chunk at a time, never whole: it
was redacted when written, and it is served only when it begins with the id it is
named by, so a file planted under another turn's name is no record of it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from agent_server.records.files import Bounds, RecordFiles
from agent_server.secret_file import compact_json, json_chunks

RESULT_TTL_S = 6 * 3600
MAX_RESULTS = 200
"""As many as the running list's `recently_completed_ids` (`Registry` reads it here)."""
MAX_RESULTS_BYTES = 256 * 1024 * 1024
MAX_RECORD_BYTES = 64 * 1024 * 1024
"""A file larger than this is not read back (no record we write comes near it)."""
CHUNK_BYTES = 64 * 1024
"""A record is read and served this much at a time."""


class RetainedResults:
    """The retained records under one directory of the state dir."""

    def __init__(
        self,
        directory: Path,
        *,
        ttl_s: float = RESULT_TTL_S,
        max_results: int = MAX_RESULTS,
        max_bytes: int = MAX_RESULTS_BYTES,
    ) -> None:
        self.files = RecordFiles(directory, Bounds(ttl_s, max_results, max_bytes, MAX_RECORD_BYTES))

    def keep(self, envelope: dict[str, Any]) -> None:
        """Write the record of a terminal answer (already redacted, `execution_id` first),
        then evict. Raises OSError (nothing half-written stays) or ValueError."""
        self.files.write(envelope["execution_id"], json_chunks(envelope))

    def reader(self, execution_id: str) -> RecordReader | None:
        """The record of `execution_id` to stream, or None when unknown, expired,
        unreadable, or not that turn's."""
        opened = self.files.open(execution_id)
        if opened is None:
            return None
        fd, st = opened
        first = os.read(fd, CHUNK_BYTES)
        # `json_chunks` writes the id first, exactly so: a record that does not begin with
        # its own name's id was not written for it.
        if not first.startswith(_prefix(execution_id)):
            os.close(fd)
            return None
        return RecordReader(fd, first, st.st_size)

    def get(self, execution_id: str) -> dict[str, Any] | None:
        """The record of `execution_id` parsed (tests and tools: the route streams it)."""
        reader = self.reader(execution_id)
        if reader is None:
            return None
        value = json.loads(b"".join(reader.chunks()))
        return value if isinstance(value, dict) else None


def _prefix(execution_id: str) -> bytes:
    return ('{"execution_id":' + compact_json(execution_id) + ",").encode()


class RecordReader:
    """One record's bytes from where `fd` stands (`first` read already), streamed a chunk
    at a time up to `size`, its size at opening (a pending body's too)."""

    def __init__(self, fd: int, first: bytes, size: int) -> None:
        self._fd = fd
        self._first = first
        self.size = size

    def chunks(self) -> Iterator[bytes]:
        """The record's bytes (blocking reads: iterate in a thread); closes the file."""
        try:
            left = self.size - len(self._first)
            if self._first:
                yield self._first
            while left > 0:
                chunk = os.read(self._fd, min(CHUNK_BYTES, left))
                if not chunk:
                    return  # shrank meanwhile: what is served is cut, the JSON too
                left -= len(chunk)
                yield chunk
        finally:
            self.close()

    def close(self) -> None:
        """Release the file (idempotent)."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
