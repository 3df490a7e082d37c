"""LineSplitter: stdout chunks in, bounded lines out, however the CLI's writes are cut."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from agent_server.process.pipes import LineSplitter

MAX = 8


def _expected(data: bytes) -> list[bytes]:
    """Every line (the last one unterminated too), minus those over MAX bytes."""
    lines = data.split(b"\n")
    if lines[-1] == b"":
        lines.pop()
    return [line for line in lines if len(line) <= MAX]


@settings(max_examples=300)
@given(
    st.lists(st.sampled_from([b"a", b"bb", b"ccccccc", b"\n"]), max_size=120).map(b"".join),
    st.lists(st.integers(0, 200), max_size=12),
)
def test_lines_do_not_depend_on_how_the_output_is_cut(data: bytes, cuts: list[int]) -> None:
    """Any cutting of the same bytes gives the same lines; a line over the limit is
    dropped whole, never cut down."""
    lines: list[bytes] = []
    splitter = LineSplitter(lines.append, MAX)
    bounds = [0, *sorted(c for c in cuts if c <= len(data)), len(data)]
    for start, end in itertools.pairwise(bounds):
        splitter.feed(data[start:end])
    splitter.close()
    assert lines == _expected(data)
