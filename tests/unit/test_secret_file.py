"""Secret files (contract §3, §10): JSON written in pieces, crash-safe, and every read of
a file the agent may have written non-blocking, no-follow and bounded."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent_server.secret_file import (
    NotReadable,
    compact_json,
    json_chunks,
    json_in_pieces,
    read_bounded,
    write_secret_file,
)


def _read(path: Path, limit: int) -> Any:
    return json.loads(read_bounded(path, limit))


_JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=600) | st.dictionaries(st.text(), inner),
    max_leaves=2000,
)


@settings(max_examples=60, deadline=None)
@given(_JSON)
def test_json_in_pieces_is_the_same_json(value: Any) -> None:
    """Joined, the pieces are exactly the one-shot compact JSON of the value."""
    whole = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    assert "".join(json_chunks(value)) == whole


def test_a_large_log_is_written_in_pieces_and_read_back(tmp_path: Path) -> None:
    """A record whose log is far past one piece reads back equal; no piece holds it all."""
    record = {
        "execution_id": "e-1",
        "execution_log": [{"type": "x", "n": i} for i in range(50_000)],
    }
    pieces = list(json_chunks(record))
    assert max(len(piece) for piece in pieces) < len(json.dumps(record)) // 10
    write_secret_file(tmp_path / "r.json", json_chunks(record))
    assert _read(tmp_path / "r.json", 10**7) == record


def test_a_record_of_small_pieces_is_written_in_few_writes(
    tmp_path: Path, monkeypatch: Any
) -> None:
    """A record's many small pieces are written together, not a system call each; a
    long piece goes as it is (a megabyte a write), and the file is the record's JSON."""
    writes: list[int] = []
    write = os.write

    def counted(fd: int, data: Any) -> int:
        writes.append(len(data))
        return write(fd, data)

    monkeypatch.setattr(os, "write", counted)
    record = {"execution_id": "e-1", "metadata": {f"k{i}": i for i in range(200)}}
    write_secret_file(tmp_path / "small.json", json_chunks(record))
    assert len(writes) == 1
    assert _read(tmp_path / "small.json", 10**7) == record

    writes.clear()
    big = {"a": 1, "response": "x" * (3 << 20), "b": 2}
    write_secret_file(tmp_path / "big.json", json_chunks(big))
    # `{"a":1,"response":`, the text's 3 MiB and 2 quotes a MiB at a time, `,"b":2}`
    assert writes == [18, 1 << 20, 1 << 20, 1 << 20, 2, 7]
    assert _read(tmp_path / "big.json", 10**8) == big


def test_a_value_json_cannot_hold_leaves_no_file(tmp_path: Path) -> None:
    """NaN fails the write part-way: no record, no temp file."""
    with pytest.raises(ValueError, match="JSON compliant"):
        write_secret_file(
            tmp_path / "r.json", json_chunks({"a": list(range(600)), "b": float("nan")})
        )
    assert list(tmp_path.iterdir()) == []


def test_a_read_never_goes_past_its_bound(tmp_path: Path, monkeypatch: Any) -> None:
    """The bound holds for the bytes read, not only for the size fstat saw: a file that
    grew after it (here: fstat reports it small) is refused."""
    path = tmp_path / "r.json"
    path.write_text(json.dumps({"a": "x" * 100}))
    with pytest.raises(NotReadable, match="over 50 bytes"):
        read_bounded(path, 50)
    real_fstat = os.fstat

    def fstat_before_growth(fd: int) -> Any:
        st = real_fstat(fd)
        return os.stat_result((*st[:6], 10, *st[7:10]))  # st_size = 10

    monkeypatch.setattr("agent_server.secret_file.os.fstat", fstat_before_growth)
    with pytest.raises(NotReadable, match="over 50 bytes"):
        read_bounded(path, 50)
    assert read_bounded(path, 10**6) == path.read_bytes()


@pytest.mark.parametrize(
    ("make", "reason"),
    [
        pytest.param(
            lambda p: os.mkfifo(p), "a FIFO, not a regular file", id="a FIFO never blocks"
        ),
        pytest.param(lambda p: p.mkdir(), "not a regular file", id="a directory"),
        pytest.param(
            lambda p: p.symlink_to(p.with_name("target")), "a symlink", id="a symlink is refused"
        ),
    ],
)
def test_what_is_not_a_plain_file_is_refused_before_a_byte_is_read(
    tmp_path: Path, make: Any, reason: str
) -> None:
    """Whatever the agent put at the path, the read answers at once with why."""
    (tmp_path / "target").write_text("secret")
    make(tmp_path / "x")
    with pytest.raises(NotReadable, match=reason):
        read_bounded(tmp_path / "x", 1024)


def test_a_symlink_is_followed_only_where_asked(tmp_path: Path) -> None:
    """`.env` may be a symlink (its target is checked); nothing else of the agent's may."""
    (tmp_path / "target").write_text("A=1\n")
    (tmp_path / "link").symlink_to(tmp_path / "target")
    assert read_bounded(tmp_path / "link", 1024, follow=True) == b"A=1\n"


def test_bytes_pieces_are_written_as_they_are(tmp_path: Path) -> None:
    """A header text and a body already in bytes make one file, in order."""
    write_secret_file(tmp_path / "p.json", ['{"h":1}\n', b'{"body":true}'])
    assert (tmp_path / "p.json").read_bytes() == b'{"h":1}\n{"body":true}'


EVENT = {"type": "assistant", "message": {"content": [{"type": "text", "text": "f" * 2000}]}}


@pytest.mark.parametrize(
    "value",
    [
        pytest.param(
            {"detail": {"execution_log": [EVENT] * 100, "n": 1.5}}, id="long list of events"
        ),
        pytest.param({"execution_log": ["x"] * 1000 + [EVENT, "", None, 2, True]}, id="mixed"),
        pytest.param({"a": {"b": {"c": [1, None] * 100}}}, id="deeper than its levels"),
        pytest.param({1: "key not a string", "l": ["a"] * 100}, id="a key that is no string"),
        pytest.param({"l": ("t",) * 100, "s": "é\u2028"}, id="a tuple and non-ASCII"),
    ],
)
def test_json_in_pieces_writes_what_one_call_writes(value: object) -> None:
    """The pieces join to exactly `compact_json(value)`."""
    assert json_in_pieces(value) == compact_json(value)


def test_json_in_pieces_refuses_what_one_call_refuses() -> None:
    """A non-finite number in a long list: ValueError, as `compact_json` raises."""
    with pytest.raises(ValueError, match="Out of range"):
        json_in_pieces({"l": ["x"] * 100 + [float("nan")]})
