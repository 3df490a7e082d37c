"""Secret files in the state dir, written crash-safely at mode 0600 (contract §3).

Like consul-template's AtomicWrite, but never create-then-chmod: the temp file is
born 0600 with O_EXCL|O_NOFOLLOW in the same directory, synced, renamed over the
target, and the directory synced. A crash at any instant leaves either the old
complete file or the new one. Unsafe places are refused, never followed. The token
override file, the generated controller token and the chat session id use it, and
the retained and pending results, which `read_json_file` reads back.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import stat
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

_CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_CHUNK_CHARS = 1 << 20
"""A value is encoded and written this many characters at a time."""
_PIECE_CHARS = 64 * 1024
"""`json_chunks` serialises a list in batches of items of about this many characters."""


class UnsafeLocation(OSError):
    """The target is a symlink, or the state dir is writable by group or others."""


def write_secret_file(path: Path, value: str | Iterable[str]) -> int:
    """Write `value` (a text, or its pieces) to `path` crash-safely at mode 0600,
    whatever the umask; return the bytes written.

    Raises OSError (UnsafeLocation for a symlinked target or an open state dir) or
    what making the pieces raised; on any failure the target is untouched and no temp
    file is left.
    """
    check_dir(path.parent)
    if path.is_symlink():
        msg = f"refusing to write through a symlink at {path}"
        raise UnsafeLocation(msg)
    tmp = path.with_name(f"{path.name}.tmp.{secrets.token_hex(8)}")
    fd = os.open(tmp, _CREATE_FLAGS, 0o600)
    written = 0
    try:
        try:
            os.fchmod(fd, 0o600)  # the mode at creation already is; keep it explicit
            for piece in (value,) if isinstance(value, str) else _batched(value):
                for start in range(0, len(piece), _CHUNK_CHARS):  # never a whole copy
                    view = memoryview(piece[start : start + _CHUNK_CHARS].encode())
                    written += len(view)
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
    return written


def _batched(pieces: Iterable[str]) -> Iterator[str]:
    """`pieces` joined into texts of about `_PIECE_CHARS`: a write each, not one a piece
    (a JSON value's pieces are often a few bytes). A piece that long is never copied."""
    batch: list[str] = []
    size = 0
    for piece in pieces:
        if len(piece) >= _PIECE_CHARS:
            if batch:
                yield "".join(batch)
                batch, size = [], 0
            yield piece
            continue
        batch.append(piece)
        size += len(piece)
        if size >= _PIECE_CHARS:
            yield "".join(batch)
            batch, size = [], 0
    if batch:
        yield "".join(batch)


def write_json_file(path: Path, value: Any) -> int:
    """`write_secret_file` of `value` as compact JSON, made and written in pieces."""
    return write_secret_file(path, json_chunks(value))


def json_chunks(value: Any) -> Iterator[str]:
    """`value` as compact JSON (no NaN), in pieces: a dict's values one at a time, a
    list's items in batches of about `_PIECE_CHARS`, so a large log is never one
    whole text (an item larger than that is one piece)."""
    if isinstance(value, dict):
        yield "{"
        for index, (key, item) in enumerate(value.items()):
            yield ("," if index else "") + compact_json(str(key)) + ":"
            yield from json_chunks(item)
        yield "}"
    elif isinstance(value, list):
        yield "["
        start, batch = 0, 1
        while start < len(value):
            piece = compact_json(value[start : start + batch])[1:-1]
            yield ("," if start else "") + piece
            start += batch
            batch = batch * 2 if len(piece) < _PIECE_CHARS else max(1, batch // 2)
        yield "]"
    else:
        yield compact_json(value)


def compact_json(value: Any) -> str:
    """`value` as the server writes JSON: compact, UTF-8 as it is, never NaN (ValueError)."""
    return json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))


def check_dir(directory: Path) -> None:
    """Refuse a state dir that is not a directory, or that group or others may write."""
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


def read_json_file(path: Path, max_bytes: int) -> dict[str, Any] | None:
    """The JSON object in `path`, or None: missing, a symlink, not a regular file (a FIFO
    never blocks), over `max_bytes`, or not a JSON object."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as handle:
        st = os.fstat(handle.fileno())
        if not stat.S_ISREG(st.st_mode) or st.st_size > max_bytes:
            return None
        data = handle.read(max_bytes + 1)  # bounded: the file may have grown since fstat
        if len(data) > max_bytes:
            return None
        try:
            value = json.loads(data)
        except ValueError:
            return None
    return value if isinstance(value, dict) else None
