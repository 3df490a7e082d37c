"""ChatSession (contract §6.4): the chat's one session id, kept 0600 in the state dir."""

from __future__ import annotations

import asyncio
import logging
import stat
from collections.abc import Callable
from pathlib import Path

import pytest

from agent_server.execution.chat_session import ChatSession

SESSION = "0b7e3a54-2f7c-4c1e-9a55-3f1d2c4b5a69"


@pytest.fixture
def session(tmp_path: Path) -> ChatSession:
    """A chat session whose file would live in a private state dir."""
    state_dir = tmp_path / "state"
    state_dir.mkdir(mode=0o700)
    return ChatSession(state_dir / "chat-session-id")


def test_there_is_no_session_before_the_first_chat(session: ChatSession) -> None:
    """No file: current() is None, and asking creates nothing."""
    assert session.current() is None
    assert not session.path.exists()


def test_a_remembered_id_is_current_kept_raw_at_0600(session: ChatSession) -> None:
    """remember/current round trip; the file holds exactly the id, mode 0600."""
    session.remember(SESSION)
    assert session.current() == SESSION
    assert session.path.read_text() == SESSION
    assert stat.S_IMODE(session.path.stat().st_mode) == 0o600


def test_the_id_survives_a_restart(session: ChatSession) -> None:
    """A new ChatSession over the same file (a restarted server) resumes the same id."""
    session.remember(SESSION)
    assert ChatSession(session.path).current() == SESSION


def test_a_later_id_replaces_the_earlier(session: ChatSession) -> None:
    """The kept id is the last one remembered."""
    session.remember(SESSION)
    session.remember("second-session-0002")
    assert session.current() == "second-session-0002"


def test_remembering_the_current_id_again_writes_nothing(session: ChatSession) -> None:
    """The same id again leaves the very same file (no rewrite on every chat turn)."""
    session.remember(SESSION)
    before = session.path.stat()
    session.remember(SESSION)
    after = session.path.stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)


@pytest.mark.parametrize(
    "session_id",
    [
        pytest.param("", id="empty"),
        pytest.param("-resume-me", id="a leading dash would read as a flag"),
        pytest.param("_leading-underscore", id="a leading underscore"),
        pytest.param("has space", id="a space"),
        pytest.param("../../etc/passwd", id="a path"),
        pytest.param("abc\n--model=x", id="a newline and a flag"),
        pytest.param("sess\x00ion", id="a NUL"),
        pytest.param("séance", id="a non-ASCII letter"),
        pytest.param("a" * 129, id="longer than 128 characters"),
    ],
)
def test_an_id_that_could_not_be_resumed_safely_is_refused(
    session: ChatSession, session_id: str
) -> None:
    """remember() ignores it (the kept id stays), and current() would not return it."""
    session.remember(SESSION)
    session.remember(session_id)
    assert session.current() == SESSION
    session.path.write_text(session_id)
    assert session.current() is None


def test_an_id_with_a_trailing_newline_is_refused(session: ChatSession) -> None:
    """A newline is outside the pattern at the end of an id as much as inside it."""
    session.remember(SESSION)
    session.remember("other-session-0002\n")
    assert session.current() == SESSION


@pytest.mark.parametrize(
    "session_id",
    [
        pytest.param("a", id="one character"),
        pytest.param("a" * 128, id="exactly 128 characters"),
        pytest.param("Z9_under-score", id="letters, digits, underscore and dash"),
    ],
)
def test_an_id_at_the_edges_of_the_pattern_is_kept(session: ChatSession, session_id: str) -> None:
    """The accepted shape: an alphanumeric first, then up to 127 of [A-Za-z0-9_-]."""
    session.remember(session_id)
    assert session.current() == session_id


@pytest.mark.parametrize(
    ("content", "current"),
    [
        pytest.param(f"  {SESSION}\n".encode(), SESSION, id="blanks around the id are trimmed"),
        pytest.param(b"\xff\xfe\x00", None, id="bytes that are not UTF-8 are no id"),
        pytest.param(b"", None, id="an empty file is no id"),
    ],
)
def test_a_hand_edited_file_is_read_carefully(
    session: ChatSession, content: bytes, current: str | None
) -> None:
    """current() never raises on what it finds in the file."""
    session.path.write_bytes(content)
    assert session.current() == current


def _open_dir(path: Path) -> None:
    path.parent.chmod(0o777)


def _missing_dir(path: Path) -> None:
    path.parent.rmdir()


def _symlink(path: Path) -> None:
    (path.parent.parent / "elsewhere").write_text("untouched")
    path.symlink_to(path.parent.parent / "elsewhere")


@pytest.mark.parametrize(
    "spoil",
    [
        pytest.param(_open_dir, id="a state dir writable by others"),
        pytest.param(_missing_dir, id="a state dir that is gone"),
        pytest.param(_symlink, id="a symlink where the file goes"),
    ],
)
def test_an_unwritable_place_is_logged_and_never_raises(
    session: ChatSession, caplog: pytest.LogCaptureFixture, spoil: Callable[[Path], None]
) -> None:
    """The chat turn already served: one ERROR naming the file, no exception, no file."""
    spoil(session.path)
    try:
        with caplog.at_level(logging.ERROR, logger="agent_server.chat"):
            session.remember(SESSION)
    finally:
        if session.path.parent.exists():
            session.path.parent.chmod(0o700)
    (record,) = caplog.records
    assert record.levelno == logging.ERROR
    assert str(session.path) in record.getMessage()
    if session.path.is_symlink():
        assert (session.path.parent.parent / "elsewhere").read_text() == "untouched"
    else:
        assert not session.path.exists()


def test_each_session_has_its_own_lock_that_serialises(tmp_path: Path) -> None:
    """lock is an asyncio.Lock, one per session: a second holder waits for the first."""
    first, other = ChatSession(tmp_path / "a"), ChatSession(tmp_path / "b")
    assert isinstance(first.lock, asyncio.Lock)
    assert first.lock is not other.lock
    order: list[str] = []

    async def hold(name: str, seconds: float) -> None:
        async with first.lock:
            order.append(f"{name} in")
            await asyncio.sleep(seconds)
            order.append(f"{name} out")

    async def scenario() -> None:
        await asyncio.gather(hold("one", 0.05), hold("two", 0))

    asyncio.run(scenario())
    assert order == ["one in", "one out", "two in", "two out"]
    assert not first.lock.locked()
