"""An answer body's end is found in its framing, however its bytes are split."""

from __future__ import annotations

import pytest

from agent_server.broker.framing import BodyFraming, FramingError

CHUNKED = b"5\r\nhello\r\n6;ext=1\r\n world\r\n0\r\ntrailer: x\r\n\r\n"


def chunked() -> BodyFraming:
    return BodyFraming(empty=False, chunked=True, length=None)


@pytest.mark.parametrize("size", [1, 2, 3, 7, len(CHUNKED)], ids=lambda n: f"{n}-byte reads")
def test_a_chunked_body_ends_after_its_last_chunk_and_trailers(size: int) -> None:
    """Every byte through the trailers' empty line is the body's; the decoded bytes are kept."""
    framing, kept, taken = chunked(), bytearray(), 0
    data = CHUNKED + b"HTTP/1.1 200 next"
    for at in range(0, len(data), size):
        taken += framing.feed(data[at : at + size], kept, 1024)
    assert framing.done
    assert taken == len(CHUNKED)
    assert bytes(kept) == b"hello world"


def test_kept_bytes_stop_at_their_limit() -> None:
    """A refusal's body is kept only up to the limit; the rest still passes."""
    framing, kept = chunked(), bytearray()
    assert framing.feed(CHUNKED, kept, 4) == len(CHUNKED)
    assert bytes(kept) == b"hell"


def test_a_length_body_ends_at_its_length() -> None:
    """Bytes past the length are not the body's."""
    framing = BodyFraming(empty=False, chunked=False, length=5)
    assert framing.feed(b"abc") == 3
    assert framing.feed(b"defgh") == 2
    assert framing.done


@pytest.mark.parametrize(
    ("case", "framing", "done"),
    [
        ("a HEAD's answer is empty", BodyFraming(empty=True, chunked=True, length=9), True),
        ("a zero length is done at once", BodyFraming(empty=False, chunked=False, length=0), True),
        (
            "no length, no chunks: until close",
            BodyFraming(empty=False, chunked=False, length=None),
            False,
        ),
    ],
)
def test_where_a_body_starts_done(case: str, framing: BodyFraming, done: bool) -> None:
    """Bodies with nothing to read are done before any byte."""
    assert framing.done is done, case


def test_a_body_framed_by_the_close_ends_with_it() -> None:
    """Everything is the body's until the connection ends."""
    framing = BodyFraming(empty=False, chunked=False, length=None)
    assert framing.feed(b"x" * 100) == 100
    framing.feed_eof()
    assert framing.done


@pytest.mark.parametrize(
    ("case", "data"),
    [
        ("a size that is not hexadecimal", b"zz\r\n"),
        ("data past its chunk's size", b"1\r\nab\r\n"),
        ("an endless size line", b"1" * 5000),
    ],
)
def test_broken_framing_is_refused(case: str, data: bytes) -> None:
    """The connection cannot be trusted past broken framing."""
    with pytest.raises(FramingError):
        chunked().feed(data)


def test_a_connection_closed_inside_a_body_cuts_it_short() -> None:
    """A chunked body without its last chunk is not whole."""
    framing = chunked()
    framing.feed(b"5\r\nhel")
    with pytest.raises(FramingError):
        framing.feed_eof()
