"""The capped transcript: a clean prefix within the budget, the result always kept."""

from __future__ import annotations

import pytest

from agent_server.execution.transcript import (
    LINE_COST_BYTES,
    MAX_LOG_LINES,
    PARSED_BUDGET,
    Transcript,
)

Line = tuple[bytes, bool]
RESULT = b'{"type":"result"}'
C = LINE_COST_BYTES
"""What every line costs beside its bytes."""


@pytest.mark.parametrize(
    ("max_bytes", "appended", "kept", "truncated"),
    [
        pytest.param(1000, [(b"a", False), (b"bb", False)], [b"a", b"bb"], False, id="all-fit"),
        pytest.param(
            3 + 2 * C, [(b"a", False), (b"bb", False)], [b"a", b"bb"], False, id="exactly-full"
        ),
        pytest.param(
            3 + 2 * C,
            [(b"a", False), (b"bbb", False), (b"c", False)],
            [b"a"],
            True,
            id="prefix-no-holes",
        ),
        pytest.param(
            3 + 2 * C,
            [(b"a", False), (b"bbb", False), (RESULT, True)],
            [b"a", RESULT],
            True,
            id="result-kept-past-cap",
        ),
        pytest.param(
            3 + 2 * C,
            [(b"a", False), (RESULT, True), (b"late", False)],
            [b"a", RESULT],
            True,
            id="result-stays-last",
        ),
        pytest.param(
            1 + C, [(b"a", False), (RESULT, True)], [b"a", RESULT], False, id="result-over-cap-only"
        ),
        pytest.param(
            1 + C,
            [(b"a", False), (b"old-result", True), (RESULT, True)],
            [b"a", RESULT],
            True,
            id="last-result-wins",
        ),
        pytest.param(1000, [(RESULT, True)], [RESULT], False, id="result-within-budget"),
        pytest.param(C, [(b"", False), (b"a", False)], [b""], True, id="one-empty-line"),
        pytest.param(C - 1, [(b"", False)], [], True, id="an-empty-line-is-not-free"),
    ],
)
def test_transcript_keeps(
    max_bytes: int, appended: list[Line], kept: list[bytes], truncated: bool
) -> None:
    """The kept lines, and whether anything was dropped, for each sequence."""
    transcript = Transcript(max_bytes)
    for line, is_result in appended:
        transcript.append(line, is_result=is_result)
    assert transcript.lines() == kept
    assert transcript.truncated is truncated
    assert transcript.size == sum(len(line) for line in kept)


def test_memory_stays_bounded_whatever_is_printed() -> None:
    """Size never exceeds the budget plus one result line."""
    transcript = Transcript(1000)
    for _ in range(100_000):
        transcript.append(b"x" * 100)
        transcript.append(RESULT, is_result=True)
    assert transcript.size <= 1000 + len(RESULT)
    assert transcript.lines()[-1] == RESULT


def test_empty_lines_cost_their_bookkeeping() -> None:
    """A million empty lines keep no more than the budget allows, a line's cost each."""
    transcript = Transcript(64 * 1024)
    for _ in range(1_000_000):
        transcript.append(b"")
    assert len(transcript.lines()) == 64 * 1024 // LINE_COST_BYTES
    assert transcript.truncated


def test_the_line_budget_holds_whatever_the_byte_budget() -> None:
    """Past MAX_LOG_LINES lines nothing more is kept, however large the byte budget."""
    transcript = Transcript(1 << 40)
    for _ in range(MAX_LOG_LINES + 10):
        transcript.append(b"x")
    assert len(transcript.lines()) == MAX_LOG_LINES
    assert transcript.truncated


def test_a_line_cut_before_it_arrived_marks_the_transcript_truncated() -> None:
    """`cut`: the runner dropped a line over its limit; the log says something is missing."""
    transcript = Transcript(1000)
    transcript.append(b"a")
    transcript.cut()
    assert (transcript.lines(), transcript.truncated) == ([b"a"], True)


def test_lines_returns_a_copy() -> None:
    """Mutating the returned list does not change the transcript."""
    transcript = Transcript(1000)
    transcript.append(b"a")
    transcript.lines().append(b"b")
    assert transcript.lines() == [b"a"]


def test_a_negative_budget_is_refused() -> None:
    """max_bytes must be zero or more."""
    with pytest.raises(ValueError, match="max_bytes"):
        Transcript(-1)


def test_the_parsed_object_of_a_line_is_kept_beside_it() -> None:
    """A line that is exactly its JSON keeps the parser's object; any other keeps None."""
    transcript = Transcript(1000)
    transcript.append(b'{"a":1}', parsed={"a": 1})
    transcript.append(b' {"b":2}', parsed={"b": 2})  # whitespace: a reader may parse it apart
    transcript.append(RESULT, is_result=True, parsed={"type": "result"})
    assert transcript.entries() == [
        (b'{"a":1}', {"a": 1}),
        (b' {"b":2}', None),
        (RESULT, {"type": "result"}),
    ]
    assert transcript.lines() == [b'{"a":1}', b' {"b":2}', RESULT]


def test_parsed_objects_are_kept_only_for_the_first_lines_and_the_result() -> None:
    """Past PARSED_BUDGET bytes a line keeps no object (the answer parses it), the result does."""
    line = b'{"k":"' + b"x" * 1000 + b'"}'
    transcript = Transcript(1 << 20)
    count = PARSED_BUDGET // len(line) + 3
    for _ in range(count):
        transcript.append(line, parsed={"k": "x" * 1000})
    transcript.append(RESULT, is_result=True, parsed={"type": "result"})
    kept = [parsed is not None for _, parsed in transcript.entries()]
    assert kept == [True] * (PARSED_BUDGET // len(line)) + [False] * 3 + [True]


def test_a_blank_line_is_kept_unread_and_junk_past_the_budget_dropped_unread() -> None:
    """`skims`: blank lines need no redaction or parse; past the budget, neither does a
    line that cannot be an event. A line that may be one is left to the reader."""
    transcript = Transcript(2 * LINE_COST_BYTES + 2)
    assert transcript.skims(b"")
    assert transcript.skims(b"  ")
    assert not transcript.skims(b"x")  # within the budget: read and kept as usual
    transcript.append(b"xyz")  # closes the budget
    assert transcript.skims(b"junk")
    assert not transcript.skims(b' {"type":"result"}')
    assert transcript.lines() == [b"", b"  "]
    assert transcript.truncated
