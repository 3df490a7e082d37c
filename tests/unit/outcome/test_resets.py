"""Reset parsing: every CLI's wording, rolling clock times, and never an invented instant.

The wordings are each runtime's (`OutcomeHints.reset_parsers`); the table reads them
all at once, in the runtimes' order, and one test pins that a runtime reads its own.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent_server.outcome import resets
from agent_server.runtimes import ADAPTERS, adapter_for
from agent_server.runtimes.base import ResetParser

# A Sunday morning, so weekday and day rolls are easy to read.
NOW = datetime(2025, 11, 30, 7, 51, 0, tzinfo=UTC)


EVERY_WORDING: tuple[ResetParser, ...] = tuple(
    parse for adapter in ADAPTERS for parse in adapter.hints.reset_parsers
)


def parse_resets_at(
    info: dict[str, Any] | None, texts: list[str], now: datetime
) -> datetime | None:
    """Every runtime's wordings at once."""
    return resets.parse_resets_at(info, texts, now, EVERY_WORDING)


@pytest.mark.parametrize(
    ("runtime", "text"),
    [
        pytest.param("claude-code", "You've hit your limit · resets 8:32am (UTC)", id="claude"),
        pytest.param("codex", "You've hit your usage limit. Try again in 2 hours.", id="codex"),
        pytest.param("gemini-cli", "Your quota will reset after 1h49m8s.", id="gemini"),
    ],
)
def test_a_runtime_reads_its_own_wording_only(runtime: str, text: str) -> None:
    """Each wording is read by its own runtime's parsers and by no other runtime's."""
    readers = {
        adapter.name
        for adapter in ADAPTERS
        if resets.parse_resets_at(None, [text], NOW, adapter.hints.reset_parsers) is not None
    }
    assert readers == {adapter_for(runtime).name}


def utc(year: int, month: int, day: int, hour: int = 0, minute: int = 0) -> datetime:
    return datetime(year, month, day, hour, minute, tzinfo=UTC)


@pytest.mark.parametrize(
    ("info", "texts", "expected"),
    [
        pytest.param(
            {"resetsAt": 1764496260}, ["resets 3pm"], utc(2025, 11, 30, 9, 51),
            id="resetsAt wins over the text",
        ),
        pytest.param(
            {"resetsAt": 1764496260000}, [], utc(2025, 11, 30, 9, 51),
            id="resetsAt in milliseconds",
        ),
        pytest.param(
            {"resetsAt": "1764496260"}, [], utc(2025, 11, 30, 9, 51),
            id="resetsAt as a digit string",
        ),
        pytest.param(
            {"resetsAt": 1764000000}, ["resets 8:32am (UTC)"], None,
            id="a stale resetsAt is None, and the text is not rolled forward instead",
        ),
        pytest.param(
            {"resetsAt": None}, ["resets 8:32am (UTC)"], utc(2025, 11, 30, 8, 32),
            id="a null resetsAt falls back to the text",
        ),
        pytest.param(
            {"resetsAt": True}, [], None, id="a boolean resetsAt is no epoch",
        ),
        pytest.param(
            None, ["You've hit your 5-hour limit · resets 8:32am (UTC)"],
            utc(2025, 11, 30, 8, 32),
            id="a clock time later today",
        ),
        pytest.param(
            None, ["resets 7:00am (UTC)"], utc(2025, 12, 1, 7, 0),
            id="a clock time already past rolls to tomorrow",
        ),
        pytest.param(
            None, ["resets 3pm"], utc(2025, 11, 30, 15, 0),
            id="an hour with no minutes and no zone is UTC",
        ),
        pytest.param(
            None, ["resets 12am"], utc(2025, 12, 1, 0, 0), id="12am is midnight",
        ),
        pytest.param(
            None, ["resets 12:30pm"], utc(2025, 11, 30, 12, 30), id="12:30pm is half past noon",
        ),
        pytest.param(
            None, ["resets 9:32am (Europe/Berlin)"], utc(2025, 11, 30, 8, 32),
            id="a clock time in Berlin that is still ahead",
        ),
        pytest.param(
            None, ["resets 8:00am (Europe/Berlin)"], utc(2025, 12, 1, 7, 0),
            id="a Berlin clock time already past rolls to tomorrow",
        ),
        pytest.param(
            None, ["resets 8:00am (America/New_York)"], utc(2025, 11, 30, 13, 0),
            id="a New York clock time",
        ),
        pytest.param(
            None, ["resets 8:00am (Mars/Olympus_Mons)"], None,
            id="an unknown zone is not guessed",
        ),
        pytest.param(
            None, ["resets Dec 3, 7:32am (UTC)"], utc(2025, 12, 3, 7, 32),
            id="a month and day ahead",
        ),
        pytest.param(
            None, ["resets Nov 29, 7:32am (UTC)"], utc(2026, 11, 29, 7, 32),
            id="a month and day already past rolls to next year",
        ),
        pytest.param(
            None, ["resets Feb 29, 1am"], utc(2028, 2, 29, 1, 0),
            id="a leap day rolls to the next leap year",
        ),
        pytest.param(
            None, ["resets Feb 30, 1am"], None, id="an impossible date is None",
        ),
        pytest.param(
            None, ["resets Mon 12:00am"], utc(2025, 12, 1, 0, 0),
            id="a weekday ahead",
        ),
        pytest.param(
            None, ["resets Sun 7:00am"], utc(2025, 12, 7, 7, 0),
            id="today's weekday already past rolls a week",
        ),
        pytest.param(
            None, ["resets Sunday 9am (UTC)"], utc(2025, 11, 30, 9, 0),
            id="today's weekday still ahead",
        ),
        pytest.param(
            None, ["Claude AI usage limit reached|1764496260"], utc(2025, 11, 30, 9, 51),
            id="the legacy epoch suffix",
        ),
        pytest.param(
            None, ["limit reached|1764496260"], utc(2025, 11, 30, 9, 51),
            id="the bare epoch suffix",
        ),
        pytest.param(
            None, ["usage limit reached|1700000000"], None, id="a stale epoch suffix is None",
        ),
        pytest.param(
            None, ["You will regain access on 2025-12-03 at 07:32 UTC."], utc(2025, 12, 3, 7, 32),
            id="regain access on a date",
        ),
        pytest.param(
            None, ["You will regain access on 2025-11-01 at 07:32 UTC."], None,
            id="regain access on a past date is stale",
        ),
        pytest.param(
            None, ["You will regain access on 2025-13-40 at 07:32 UTC."], None,
            id="regain access on an impossible date",
        ),
        pytest.param(
            None,
            ["You've hit your usage limit. Upgrade to Pro (https://openai.com/chatgpt/pricing) "
             "or try again at 3:29 PM."],
            utc(2025, 11, 30, 15, 29),
            id="Codex try again at a clock time",
        ),
        pytest.param(
            None, ["or try again at 6:10 AM."], utc(2025, 12, 1, 6, 10),
            id="Codex clock time already past rolls to tomorrow",
        ),
        pytest.param(
            None, ["or try again at Dec 3rd, 2025 3:29 PM."], utc(2025, 12, 3, 15, 29),
            id="Codex date with a year",
        ),
        pytest.param(
            None, ["or try again at Oct 3rd, 2025 3:29 PM."], None,
            id="Codex past date with a year is stale",
        ),
        pytest.param(
            None, ["or try again in 2 days 3 hours 4 minutes."],
            NOW + timedelta(days=2, hours=3, minutes=4),
            id="Codex relative duration",
        ),
        pytest.param(
            None,
            ["You have exhausted your capacity on this model. "
             "Your quota will reset after 1h49m8s."],
            NOW + timedelta(hours=1, minutes=49, seconds=8),
            id="Gemini reset after a compact duration",
        ),
        pytest.param(
            None, ["Your quota will reset after 45s."], NOW + timedelta(seconds=45),
            id="Gemini seconds only",
        ),
        pytest.param(
            None,
            ["[API Error: You exceeded your current quota, please check your plan and billing "
             "details.\n* Quota exceeded for metric: x, limit: 10\nPlease retry in 43.2s.\n"
             "Suggested retry after 43s.]"],
            NOW + timedelta(seconds=43.2),
            id="the Gemini API's retry delay",
        ),
        pytest.param(
            None, ["Suggested retry after 3600s."], NOW + timedelta(hours=1),
            id="the Gemini CLI's own suggestion",
        ),
        pytest.param(
            None, ["Please retry in 750ms."], NOW + timedelta(milliseconds=750),
            id="a retry delay in milliseconds",
        ),
        pytest.param(
            None, ["nothing here", "resets 8:32am"], utc(2025, 11, 30, 8, 32),
            id="the first text that names a reset wins",
        ),
        pytest.param(None, ["resets soon"], None, id="no time at all is None"),
        pytest.param(None, ["resets in 5 hours"], None, id="a bare number is no clock"),
        pytest.param(None, ["resets 25:00"], None, id="an impossible hour is None"),
        pytest.param(None, ["resets 13pm"], None, id="13pm is None"),
        pytest.param(None, [], None, id="nothing is None"),
    ],
)  # fmt: skip
def test_parse_resets_at(
    info: dict[str, Any] | None, texts: list[str], expected: datetime | None
) -> None:
    """Each wording resolves to its next instant, or None, never invented."""
    assert parse_resets_at(info, texts, NOW) == expected


def test_result_is_aware_utc() -> None:
    """A zone-named reset comes back as an aware UTC datetime."""
    found = parse_resets_at(None, ["resets 9am (Asia/Tokyo)"], NOW)
    assert found is not None
    assert found.tzinfo is UTC
    assert found == utc(2025, 12, 1, 0, 0)


def test_a_naive_now_is_taken_as_utc() -> None:
    """A naive `now` does not raise; it is read as UTC."""
    assert parse_resets_at(None, ["resets 8:32am"], NOW.replace(tzinfo=None)) == utc(
        2025, 11, 30, 8, 32
    )


def test_clock_time_across_a_dst_change() -> None:
    """A Berlin clock time on the night clocks go back is still the next occurrence."""
    now = utc(2025, 10, 25, 23, 0)  # 01:00 CEST on the 26th, clocks go back at 03:00
    assert parse_resets_at(None, ["resets 8:00am (Europe/Berlin)"], now) == utc(2025, 10, 26, 7, 0)


reset_words = st.sampled_from(
    [
        "resets ", "reset after ", "try again at ", "try again in ", "limit reached|",
        "Please retry in ", "Suggested retry after ", "43.2s", "750ms",
        "regain access on ", "Dec 3, ", "Mon ", "am", "pm", " (UTC)", " (Europe/Berlin)",
        " (Nope/Zone)", "12:00", "8:32", "1h49m8s", "2 days ", "-", "|", "2025-02-30 at 07:32 UTC",
        "99999999999999999", "0", "Feb 29, ",
    ]
)  # fmt: skip
texts = st.lists(
    st.one_of(st.text(max_size=60), st.lists(reset_words, max_size=8).map("".join)),
    max_size=4,
)
values = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=30),
    st.lists(st.integers(), max_size=2),
)
infos = st.one_of(
    st.none(),
    st.dictionaries(st.sampled_from(["resetsAt", "status", "rateLimitType"]), values),
    st.dictionaries(st.text(max_size=10), values, max_size=3),
)
nows = st.one_of(
    st.datetimes(timezones=st.timezones()),
    st.datetimes(),
    st.datetimes(
        min_value=datetime(2020, 1, 1), max_value=datetime(2035, 1, 1), timezones=st.just(UTC)
    ),
)


@settings(max_examples=400, deadline=None)
@given(info=infos, texts=texts, now=nows)
def test_never_raises_and_never_before_now(
    info: dict[str, Any] | None, texts: list[str], now: datetime
) -> None:
    """For any input: no exception, and any instant is aware UTC and not before `now`."""
    found = parse_resets_at(info, texts, now)
    if found is not None:
        aware_now = now if now.tzinfo is not None else now.replace(tzinfo=UTC)
        assert found.tzinfo is UTC
        assert found >= aware_now
