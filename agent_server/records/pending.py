"""Async turns' results waiting for delivery: `pending-results/<id>.json` (contract §6.8).

A pending file is one header line, `{"execution_id":…,"deadline":…}`, then the
callback's body exactly as it is POSTed. The header is all the server parses: the
body is sent as its bytes, a chunk at a time, so a pending file costs its delivery
no more memory than a chunk, however large (or hostile) it is. The directory is
bounded like `results/` (`files.RecordFiles`: 6 hours, 200 files, 256 MiB); a file
whose header is not its own name's id, or holds no deadline, is dropped unread.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from agent_server.records.files import Bounds, RecordFiles
from agent_server.records.retained import MAX_RECORD_BYTES, RESULT_TTL_S, RecordReader
from agent_server.secret_file import compact_json

MAX_PENDING = 200
MAX_PENDING_BYTES = 256 * 1024 * 1024
MAX_HEADER_BYTES = 1024


@dataclass(frozen=True)
class Kept:
    """A pending result a previous run (or this one) left: its id, deadline and body size."""

    execution_id: str
    deadline: float
    body_bytes: int


class PendingResults:
    """The pending callbacks under one directory of the state dir."""

    def __init__(self, directory: Path) -> None:
        self.files = RecordFiles(
            directory, Bounds(RESULT_TTL_S, MAX_PENDING, MAX_PENDING_BYTES, MAX_RECORD_BYTES)
        )

    def write(self, execution_id: str, deadline: float, body: bytes) -> None:
        """Persist the body of `execution_id`'s callback (raises OSError, changing nothing)."""
        header = compact_json({"execution_id": execution_id, "deadline": deadline})
        self.files.write(execution_id, (header + "\n", body))

    def remove(self, execution_id: str) -> None:
        """Forget a delivered (or refused) result."""
        self.files.remove(execution_id)

    def kept(self) -> list[Kept]:
        """Every sound pending result, oldest first; unsound ones are deleted."""
        found = []
        for listed in self.files.listing():
            opened = self._open(listed.execution_id)
            if opened is None:
                self.files.remove(listed.execution_id)
                continue
            fd, kept = opened
            os.close(fd)
            found.append(kept)
        return found

    def body(self, execution_id: str) -> tuple[int, Iterator[bytes]] | None:
        """The size of a pending body and its bytes a chunk at a time (blocking reads:
        iterate in a thread), or None when it is gone or unsound."""
        opened = self._open(execution_id)
        if opened is None:
            return None
        fd, kept = opened
        return kept.body_bytes, RecordReader(fd, b"", kept.body_bytes).chunks()

    def _open(self, execution_id: str) -> tuple[int, Kept] | None:
        """The file positioned at its body, and what its header says, if it is sound."""
        opened = self.files.open(execution_id)
        if opened is None:
            return None
        fd, st = opened
        head = os.pread(fd, MAX_HEADER_BYTES, 0)
        line, newline, _ = head.partition(b"\n")
        try:
            header = json.loads(line) if newline else None
        except ValueError:
            header = None
        deadline = header.get("deadline") if isinstance(header, dict) else None
        if (
            not isinstance(header, dict)
            or header.get("execution_id") != execution_id
            or not isinstance(deadline, int | float)
            or not math.isfinite(deadline)
        ):
            os.close(fd)
            return None
        os.lseek(fd, len(line) + 1, os.SEEK_SET)
        return fd, Kept(execution_id, float(deadline), st.st_size - len(line) - 1)
