"""Secret files in the state dir, written crash-safely at mode 0600 (contract §3).

Like consul-template's AtomicWrite, but never create-then-chmod: the temp file is
born 0600 with O_EXCL|O_NOFOLLOW in the same directory, synced, renamed over the
target, and the directory synced. A crash at any instant leaves either the old
complete file or the new one. Unsafe places are refused, never followed. The token
override file, the generated controller token and the chat session id use it, and
the retained and pending results (and, at 0644, the files a spawn reads).

Reading back goes through `open_bounded`: whatever the agent put at a path (a FIFO,
a symlink, a huge file) is refused before a byte is read, never waited on.
"""

from __future__ import annotations

import contextlib
import errno
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
TEMP_INFIX = ".tmp."
"""In the name of every temp file a write makes (`<name>.tmp.<random>`): what a crash left
and a boot sweeps."""


class UnsafeLocation(OSError):
    """The target is a symlink, or the state dir is writable by group or others."""


def write_secret_file(path: Path, value: str | Iterable[str | bytes], *, mode: int = 0o600) -> int:
    """Write `value` (a text, or its pieces: texts, or bytes written as they are) to `path`
    crash-safely at `mode` (0600), whatever the umask; return the bytes written.

    Raises OSError (UnsafeLocation for a symlinked target or an open state dir) or
    what making the pieces raised; on any failure the target is untouched and no temp
    file is left.
    """
    check_dir(path.parent)
    if path.is_symlink():
        msg = f"refusing to write through a symlink at {path}"
        raise UnsafeLocation(msg)
    tmp = path.with_name(f"{path.name}{TEMP_INFIX}{secrets.token_hex(8)}")
    fd = os.open(tmp, _CREATE_FLAGS, 0o600)
    written = 0
    try:
        try:
            os.fchmod(fd, mode)  # whatever the umask (born 0600, never wider)
            for piece in (value,) if isinstance(value, str) else _batched(value):
                if isinstance(piece, bytes):
                    written += _write_all(fd, memoryview(piece))
                    continue
                for start in range(0, len(piece), _CHUNK_CHARS):  # never a whole copy
                    written += _write_all(
                        fd, memoryview(piece[start : start + _CHUNK_CHARS].encode())
                    )
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


def _write_all(fd: int, view: memoryview) -> int:
    size = len(view)
    while view:
        view = view[os.write(fd, view) :]
    return size


def _batched(pieces: Iterable[str | bytes]) -> Iterator[str | bytes]:
    """`pieces` joined into texts of about `_PIECE_CHARS`: a write each, not one a piece
    (a JSON value's pieces are often a few bytes). A piece that long, and bytes, are
    never copied."""
    batch: list[str] = []
    size = 0
    for piece in pieces:
        if isinstance(piece, bytes) or len(piece) >= _PIECE_CHARS:
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


class NotReadable(OSError):
    """A file the server will not read: not a regular file (a FIFO, a device), a symlink
    where none is followed, or over its bound. Its message says which (no path: the
    caller names the file)."""


_READ_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC


def open_bounded(path: Path, max_bytes: int, *, follow: bool = False) -> tuple[int, os.stat_result]:
    """An open descriptor of the regular file at `path` of at most `max_bytes`, and its
    stat: the one way the server opens a file the agent may have written (contract §10).

    `O_NONBLOCK` keeps a FIFO from blocking the open, `O_NOFOLLOW` (unless `follow`)
    refuses a symlink, and `fstat` on the descriptor decides, so nothing swapped in
    between a check and the open slips through. Raises FileNotFoundError, NotReadable,
    or another OSError; the caller closes the descriptor.
    """
    flags = _READ_FLAGS if follow else _READ_FLAGS | os.O_NOFOLLOW
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        if not follow and exc.errno == errno.ELOOP:
            raise NotReadable(errno.ELOOP, "a symlink, never followed") from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            kind = "a FIFO" if stat.S_ISFIFO(st.st_mode) else "something else"
            raise NotReadable(errno.EINVAL, f"{kind}, not a regular file: never read")
        if st.st_size > max_bytes:
            raise NotReadable(errno.EFBIG, f"over {max_bytes} bytes")
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd, st


def read_bounded(path: Path, max_bytes: int, *, follow: bool = False) -> bytes:
    """The bytes of the regular file at `path`, at most `max_bytes` (`open_bounded`), never
    more however the file grows meanwhile (NotReadable then)."""
    return read_bounded_and_stat(path, max_bytes, follow=follow)[0]


def read_bounded_and_stat(
    path: Path, max_bytes: int, *, follow: bool = False
) -> tuple[bytes, os.stat_result]:
    """`read_bounded`, and the stat of the file those bytes were read from."""
    fd, st = open_bounded(path, max_bytes, follow=follow)
    with os.fdopen(fd, "rb") as handle:
        data = handle.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise NotReadable(errno.EFBIG, f"over {max_bytes} bytes")
    return data, st


_PIECE_LEVELS = 3
"""How deep `json_in_pieces` looks for long lists: an answer's `detail.execution_log`."""
_LONG_LIST = 64
_SHORT_TEXT = 1024
_BATCH = 256


def json_in_pieces(value: Any, level: int = 0) -> str:
    """`compact_json(value)`, a long list's items a call each (short strings a batch).

    One call of the C encoder holds the GIL throughout: an 8 MiB answer made on a
    worker thread would hold the event loop 100 ms and more. In pieces, the loop gets
    its turn between two of them.
    """
    if level < _PIECE_LEVELS:
        if isinstance(value, dict) and all(isinstance(key, str) for key in value):
            items = (f"{compact_json(k)}:{json_in_pieces(v, level + 1)}" for k, v in value.items())
            return "{" + ",".join(items) + "}"
        if isinstance(value, list) and len(value) > _LONG_LIST:
            return "[" + ",".join(_list_pieces(value)) + "]"
    return compact_json(value)


def _list_pieces(items: list[Any]) -> Iterator[str]:
    """Each item's JSON; a run of short scalars (a flood's lines) a batch at a time."""
    run: list[Any] = []
    for item in items:
        short = not isinstance(item, dict | list | tuple) and len(str(item)) < _SHORT_TEXT
        if short and len(run) < _BATCH:
            run.append(item)
            continue
        if run:
            yield compact_json(run)[1:-1]
            run = []
        if short:
            run.append(item)
        else:
            yield compact_json(item)
    if run:
        yield compact_json(run)[1:-1]
