"""`DotenvFile`: python-dotenv parsing, missing/unreadable files, and the identity cache."""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path

import pytest

from agent_server.spawn_env.dotenv_file import DotenvFile


def write(path: Path, text: str, *, age_s: float = 10.0) -> None:
    """Rewrite `path` in place (same inode) and date its mtime `age_s` seconds back."""
    with open(path, "r+" if path.exists() else "w") as handle:
        handle.truncate(0)
        handle.write(text)
    stamp = time.time_ns() - int(age_s * 1e9)
    os.utime(path, ns=(stamp, stamp))


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("A=1\n", {"A": "1"}, id="a plain assignment"),
        pytest.param("export A=1\n", {"A": "1"}, id="export K=v is accepted"),
        pytest.param("A='x y'\nB=\"z\"\n", {"A": "x y", "B": "z"}, id="quoted values"),
        pytest.param("# comment\n\nA=1 # trailing\n", {"A": "1"}, id="comments and blanks"),
        pytest.param("A=${HOME}\n", {"A": "${HOME}"}, id="no interpolation"),
        pytest.param("BARE\nA=1\n", {"A": "1"}, id="a bare name without a value is skipped"),
    ],
)
def test_parse(tmp_path: Path, text: str, expected: dict[str, str]) -> None:
    """The file is parsed like python-dotenv, without touching os.environ."""
    path = tmp_path / ".env"
    path.write_text(text)
    assert dict(DotenvFile(path).read()) == expected
    assert "A" not in os.environ or os.environ["A"] != "1"


def test_missing_file_is_empty_and_logged_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A missing `.env` reads as empty, with one log line however often it is read."""
    dotenv = DotenvFile(tmp_path / "absent.env")
    with caplog.at_level(logging.INFO, "agent_server.env_file"):
        assert [dict(dotenv.read()) for _ in range(3)] == [{}, {}, {}]
    assert len(caplog.records) == 1


def test_unreadable_file_is_empty_and_logged_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """An unreadable path (a directory: chmod 000 does not stop root) is empty, logged once."""
    (tmp_path / ".env").mkdir()
    dotenv = DotenvFile(tmp_path / ".env")
    with caplog.at_level(logging.INFO, "agent_server.env_file"):
        assert [dict(dotenv.read()) for _ in range(3)] == [{}, {}, {}]
    assert len(caplog.records) == 1
    assert str(tmp_path / ".env") in caplog.records[0].getMessage()


def test_a_fifo_at_the_path_is_empty_and_never_blocks(tmp_path: Path) -> None:
    """A named pipe at `.env` reads as empty at once (opening it would block a spawn forever)."""
    fifo = tmp_path / ".env"
    os.mkfifo(fifo)
    result: list[dict[str, str]] = []
    reader = threading.Thread(target=lambda: result.append(dict(DotenvFile(fifo).read())))
    reader.start()
    reader.join(5)
    if reader.is_alive():
        with open(fifo, "w"):  # unblock the reader before failing
            pass
        reader.join(5)
        pytest.fail("reading a FIFO .env blocked")
    assert result == [{}]


def test_a_file_that_stays_missing_is_answered_from_the_cache(tmp_path: Path) -> None:
    """A missing `.env` costs a spawn one `stat`, not a read in a worker thread each time;
    once the file appears, the cache gives way to a read."""
    path = tmp_path / ".env"
    dotenv = DotenvFile(path)
    assert dotenv.cached() is None  # nothing known yet
    empty = dotenv.read()
    assert dotenv.cached() is empty
    assert dict(empty) == {}
    write(path, "A=1\n")
    assert dotenv.cached() is None
    assert dict(dotenv.read()) == {"A": "1"}
    path.unlink()
    assert dotenv.cached() is None  # gone again: read once more, then cached
    assert dict(dotenv.read()) == {}
    assert dotenv.cached() is not None


def test_a_file_that_comes_back_after_missing_is_read(tmp_path: Path) -> None:
    """Missing then present: the values appear (the empty answer is not cached)."""
    path = tmp_path / ".env"
    dotenv = DotenvFile(path)
    assert dict(dotenv.read()) == {}
    write(path, "A=1\n")
    assert dict(dotenv.read()) == {"A": "1"}


def test_unchanged_file_is_parsed_once(tmp_path: Path) -> None:
    """Reads of an unchanged file cost a stat, not a parse."""
    path = tmp_path / ".env"
    write(path, "A=1\n")
    dotenv = DotenvFile(path)
    first = dotenv.read()
    for _ in range(5):
        assert dotenv.read() is first  # the cached parse, not a new one
    assert dict(first) == {"A": "1"}


def test_same_size_rewrite_with_new_mtime_is_reparsed(tmp_path: Path) -> None:
    """Same inode, same size, new mtime: the new values are served."""
    path = tmp_path / ".env"
    write(path, "A=1\n", age_s=20)
    dotenv = DotenvFile(path)
    assert dict(dotenv.read()) == {"A": "1"}
    first = dotenv.read()
    write(path, "A=2\n", age_s=10)
    second = dotenv.read()
    assert dict(second) == {"A": "2"}
    assert second is not first
    assert dotenv.read() is second


def test_a_fresh_file_is_not_trusted_to_the_cache(tmp_path: Path) -> None:
    """A same-size rewrite keeping the exact mtime_ns is still seen while the mtime is fresh."""
    path = tmp_path / ".env"
    write(path, "A=1\n", age_s=-5)  # an mtime not safely in the past (same tick as the read)
    stamp = os.stat(path).st_mtime_ns
    dotenv = DotenvFile(path)
    assert dict(dotenv.read()) == {"A": "1"}
    write(path, "A=2\n")
    os.utime(path, ns=(stamp, stamp))
    assert dict(dotenv.read()) == {"A": "2"}


def test_a_replaced_file_is_reparsed(tmp_path: Path) -> None:
    """An editor's rename-over (new inode, same size, same mtime) is detected."""
    path = tmp_path / ".env"
    write(path, "A=1\n")
    stamp = os.stat(path).st_mtime_ns
    dotenv = DotenvFile(path)
    dotenv.read()
    other = tmp_path / ".env.new"
    other.write_text("A=2\n")
    os.utime(other, ns=(stamp, stamp))
    os.replace(other, path)
    assert dict(dotenv.read()) == {"A": "2"}
