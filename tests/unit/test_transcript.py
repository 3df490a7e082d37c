"""The capped transcript: a clean prefix within the budget, the result always kept."""

from __future__ import annotations

import pytest

from agent_server.execution.transcript import PARSED_BUDGET, Transcript

Line = tuple[bytes, bool]
RESULT = b'{"type":"result"}'


@pytest.mark.parametrize(
    ("max_bytes", "appended", "kept", "truncated"),
    [
        pytest.param(100, [(b"a", False), (b"bb", False)], [b"a", b"bb"], False, id="all-fit"),
        pytest.param(3, [(b"a", False), (b"bb", False)], [b"a", b"bb"], False, id="exactly-full"),
        pytest.param(
            3, [(b"a", False), (b"bbb", False), (b"c", False)], [b"a"], True, id="prefix-no-holes"
        ),
        pytest.param(
            3,
            [(b"a", False), (b"bbb", False), (RESULT, True)],
            [b"a", RESULT],
            True,
            id="result-kept-past-cap",
        ),
        pytest.param(
            3,
            [(b"a", False), (RESULT, True), (b"late", False)],
            [b"a", RESULT],
            True,
            id="result-stays-last",
        ),
        pytest.param(
            1, [(b"a", False), (RESULT, True)], [b"a", RESULT], False, id="result-over-cap-only"
        ),
        pytest.param(
            1,
            [(b"a", False), (b"old-result", True), (RESULT, True)],
            [b"a", RESULT],
            True,
            id="last-result-wins",
        ),
        pytest.param(100, [(RESULT, True)], [RESULT], False, id="result-within-budget"),
        pytest.param(0, [(b"", False), (b"a", False)], [b""], True, id="zero-budget"),
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


def test_lines_returns_a_copy() -> None:
    """Mutating the returned list does not change the transcript."""
    transcript = Transcript(10)
    transcript.append(b"a")
    transcript.lines().append(b"b")
    assert transcript.lines() == [b"a"]


def test_a_negative_budget_is_refused() -> None:
    """max_bytes must be zero or more."""
    with pytest.raises(ValueError, match="max_bytes"):
        Transcript(-1)


def test_the_parsed_object_of_a_line_is_kept_beside_it() -> None:
    """A line that is exactly its JSON keeps the parser's object; any other keeps None."""
    transcript = Transcript(100)
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
