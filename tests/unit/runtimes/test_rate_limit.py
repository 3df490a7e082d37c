"""A turn's rate-limit reading: `rate_limit_info` read field by field, hostile input dropped."""

from __future__ import annotations

import json
from typing import Any

import pytest

from agent_server.runtimes.claude_code import ClaudeStreamParser
from agent_server.runtimes.rate_limit import read_rate_limit
from agent_server.wire.turns import RateLimitReading, RateLimitWindow
from tests.support.transcripts import REFERENCE_FIXTURES, load_scenario

RESET = 1796171393
RESET_ISO = "2026-12-02T00:29:53Z"
WEEK = 1796423393
WEEK_ISO = "2026-12-04T22:29:53Z"
SEEN_ON_2_1_328 = {
    "status": "allowed_warning",
    "resetsAt": RESET,
    "rateLimitType": "five_hour",
    "utilization": 0.91,
    "overageDisabledReason": "org_level_disabled",
    "isUsingOverage": False,
    "surpassedThreshold": 0.9,
    "unifiedWindows": {
        "five_hour": {
            "utilization": 0.91,
            "resetsAt": RESET,
            "status": "allowed_warning",
            "surpassedThreshold": 0.9,
        },
        "seven_day": {"utilization": 0.35, "resetsAt": WEEK, "status": "allowed"},
    },
}


@pytest.mark.parametrize(
    ("info", "expected"),
    [
        pytest.param(
            SEEN_ON_2_1_328,
            RateLimitReading(
                status="allowed_warning",
                rate_limit_type="five_hour",
                resets_at=RESET_ISO,
                utilization=0.91,
                surpassed_threshold=0.9,
                is_using_overage=False,
                overage_disabled_reason="org_level_disabled",
                five_hour=RateLimitWindow(
                    utilization=0.91, resets_at=RESET_ISO, status="allowed_warning"
                ),
                seven_day=RateLimitWindow(utilization=0.35, resets_at=WEEK_ISO, status="allowed"),
            ),
            id="the reading the real CLI reports on a success is kept whole",
        ),
        pytest.param(
            {"status": "rejected", "resetsAt": RESET, "rateLimitType": "seven_day"},
            RateLimitReading(status="rejected", rate_limit_type="seven_day", resets_at=RESET_ISO),
            id="a rejection without windows keeps its status, window and reset",
        ),
        pytest.param(
            {"status": "throttled_somehow", "rateLimitType": "per_minute"},
            RateLimitReading(status="other", rate_limit_type="other"),
            id="an unknown status or window reads other",
        ),
        pytest.param(
            {"status": "allowed", "resetsAt": "1796171393", "utilization": "0.5"},
            RateLimitReading(status="allowed"),
            id="numbers written as strings are not numbers",
        ),
        pytest.param(
            {"status": "allowed", "resetsAt": 12, "utilization": -0.1},
            RateLimitReading(status="allowed"),
            id="an epoch before 2001 and a negative use are dropped",
        ),
        pytest.param(
            {"status": "allowed", "resetsAt": 1e15, "utilization": 1e300},
            RateLimitReading(status="allowed"),
            id="an epoch past the year 5138 and an absurd use are dropped",
        ),
        pytest.param(
            {"status": "allowed", "isUsingOverage": 1, "utilization": True},
            RateLimitReading(status="allowed"),
            id="a bool must be a bool and a number must not be one",
        ),
        pytest.param(
            {"status": "allowed", "overageDisabledReason": "a reason with spaces; rm -rf /"},
            RateLimitReading(status="allowed"),
            id="a reason that is no identifier is dropped",
        ),
        pytest.param(
            {"status": "allowed", "unifiedWindows": {"five_hour": "full", "seven_day": []}},
            RateLimitReading(status="allowed"),
            id="windows that are not objects are dropped",
        ),
        pytest.param(
            {"status": "allowed", "unifiedWindows": {"five_hour": {"oops": 1}}},
            RateLimitReading(status="allowed"),
            id="a window with nothing known in it is dropped",
        ),
        pytest.param(
            {"secret": "sk-ant-oat01-x", "nested": {"deep": [1, 2]}},
            None,
            id="an info with no known key is no reading",
        ),
        pytest.param("rejected", None, id="an info that is not an object is no reading"),
        pytest.param(None, None, id="no info is no reading"),
        pytest.param(
            {"status": "allowed", "resetsAt": RESET + 0.2},
            RateLimitReading(status="allowed", resets_at="2026-12-02T00:29:54Z"),
            id="a fractional reset is rounded up, never early",
        ),
    ],
)
def test_read_rate_limit(info: Any, expected: RateLimitReading | None) -> None:
    """Each known key is read with its type and range; anything else is dropped."""
    assert read_rate_limit(info) == expected


def _event(info: Any) -> bytes:
    return json.dumps({"type": "rate_limit_event", "rate_limit_info": info}).encode()


def test_the_parser_keeps_the_last_reading_of_any_status() -> None:
    """An allowed reading is the turn's headroom, and it never classifies the turn."""
    parser = ClaudeStreamParser()
    parser.feed(_event({"status": "allowed", "utilization": 0.2}))
    parser.feed(_event(SEEN_ON_2_1_328))
    assert parser.stream.rate_limit is not None
    assert parser.stream.rate_limit.utilization == 0.91
    assert parser.stream.rate_limit_info is None


def test_a_garbage_event_after_a_reading_does_not_erase_it() -> None:
    """A later event with nothing usable leaves the last good reading in place."""
    parser = ClaudeStreamParser()
    parser.feed(_event(SEEN_ON_2_1_328))
    parser.feed(_event({"nonsense": True}))
    parser.feed(_event("rejected"))
    assert parser.stream.rate_limit == read_rate_limit(SEEN_ON_2_1_328)


def test_the_recorded_wall_is_both_a_rejection_and_a_reading() -> None:
    """The five-hour wall's rejected event classifies the turn and is its reading too."""
    wall = "rate_limit_five_hour_oauth"
    stream, _ = load_scenario(REFERENCE_FIXTURES, wall, ClaudeStreamParser())
    reading = stream.rate_limit
    assert reading is not None
    assert reading.status == "rejected"
    assert reading.rate_limit_type == "five_hour"
    assert reading.five_hour is not None
    assert reading.five_hour.utilization == 1
    assert stream.rate_limit_info is not None
