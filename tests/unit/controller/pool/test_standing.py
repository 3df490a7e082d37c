"""How a credential stands: the walk's predicates as tables of named cases."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from agent_server.controller.pool.standing import (
    Standing,
    failed_recently,
    fullness,
    headroom_key,
    readmitted,
    refused_recently,
    throttled,
)
from agent_server.controller.pool.state import CredentialInfo, Failure, Reading, WindowUse
from agent_server.controller.pool.waits import retry_at

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
MIN = timedelta(minutes=1)
SUB = CredentialInfo("sub-a", "subscription")
KEY = CredentialInfo("key", "api_key")


def ago(minutes: float) -> datetime:
    return NOW - minutes * MIN


def ahead(minutes: float) -> datetime:
    return NOW + minutes * MIN


def limited(at: datetime, resets_at: datetime | None = None) -> Failure:
    return Failure("sub-a", "rate_limit", at, resets_at)


def refused(kind: str, at: datetime) -> Failure:
    return Failure("sub-a", kind, at)  # type: ignore[arg-type]


def reading(
    at: datetime,
    status: str = "allowed",
    five: float | None = None,
    seven: float | None = None,
    resets_at: datetime | None = None,
    window_status: str | None = None,
) -> Reading:
    return Reading(
        "sub-a",
        at,
        status,
        resets_at,
        WindowUse(five, resets_at, window_status or status) if five is not None else None,
        WindowUse(seven, ahead(5000), "allowed") if seven is not None else None,
    )


def standing(
    *failures: Failure, last: Reading | None = None, info: CredentialInfo = SUB
) -> Standing:
    return Standing(info, {f.kind: f for f in failures}, last)


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        pytest.param(standing(), False, id="never failed: not skipped"),
        pytest.param(standing(refused("auth", ago(10))), True, id="auth 10 min ago: skipped"),
        pytest.param(
            standing(refused("billing", ago(119))), True, id="billing 119 min ago: skipped"
        ),
        pytest.param(standing(refused("auth", ago(120))), False, id="the skip window is 2 h"),
        pytest.param(
            standing(limited(ago(10), ahead(50))), True, id="a rate limit whose window is ahead"
        ),
        pytest.param(
            standing(limited(ago(10), ago(1))), False, id="its window reset since: readmitted"
        ),
        pytest.param(
            standing(limited(ago(10), ago(20))),
            True,
            id="a reset before the failure explains nothing: still skipped",
        ),
        pytest.param(standing(limited(ago(10))), True, id="a rate limit with no reset known"),
        pytest.param(
            standing(refused("auth", ago(10)), last=reading(ago(5))),
            False,
            id="a fresh serving reading after the failure readmits",
        ),
        pytest.param(
            standing(refused("auth", ago(10)), last=reading(ago(12))),
            True,
            id="a reading from before the failure readmits nothing",
        ),
        pytest.param(
            standing(refused("auth", ago(30)), last=reading(ago(20))),
            True,
            id="a serving reading older than 15 min readmits nothing",
        ),
        pytest.param(
            standing(limited(ago(30)), last=reading(ago(40), "rejected", 1.0, resets_at=ago(5))),
            False,
            id="the blocked window read before the failure has reset: readmitted",
        ),
        pytest.param(
            standing(limited(ago(30)), last=reading(ago(20), "rejected", 1.0, resets_at=ago(5))),
            True,
            id="a blocked window read after the failure is not its window",
        ),
        pytest.param(
            standing(refused("auth", ago(10)), last=reading(ago(5), "rejected")),
            True,
            id="a fresh rejecting reading readmits nothing",
        ),
    ],
)
def test_failed_recently(case: Standing, expected: bool) -> None:
    """The skip question: a failure in 2 h, not readmitted on evidence since."""
    assert failed_recently(case, NOW) is expected


def test_never_failing_is_readmitted() -> None:
    """Readmission is only asked of a credential that failed."""
    assert readmitted(standing(), NOW) is True


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        pytest.param(standing(), False, id="nothing known: not throttled"),
        pytest.param(
            standing(last=reading(ago(2), "rejected", 1.0, resets_at=ahead(30))),
            True,
            id="a fresh rejecting reading",
        ),
        pytest.param(
            standing(last=reading(ago(20), "rejected", 1.0, resets_at=ahead(30))),
            False,
            id="a rejecting reading older than 15 min is not enough alone",
        ),
        pytest.param(
            standing(last=reading(ago(2), "allowed", 0.5, window_status="rejected")),
            True,
            id="a rejected window inside an allowed reading",
        ),
        pytest.param(standing(limited(ago(5), ahead(30))), True, id="a rate limit, reset ahead"),
        pytest.param(standing(limited(ago(50), ago(5))), False, id="a rate limit, reset passed"),
        pytest.param(standing(limited(ago(50))), True, id="a rate limit with no reset, in 2 h"),
        pytest.param(standing(limited(ago(130))), False, id="a rate limit with no reset, 2 h on"),
        pytest.param(
            standing(limited(ago(10), ahead(30)), last=reading(ago(2))),
            False,
            id="a fresh serving reading after the rate limit",
        ),
        pytest.param(
            standing(limited(ago(1), ahead(30)), last=reading(ago(2))),
            True,
            id="a rate limit after the fresh reading wins",
        ),
        pytest.param(standing(refused("auth", ago(5))), False, id="auth is not throttling"),
    ],
)
def test_throttled(case: Standing, expected: bool) -> None:
    """The display (and pre-dispatch) question: the window is full now."""
    assert throttled(case, NOW) is expected


@pytest.mark.parametrize(
    ("last", "expected"),
    [
        pytest.param(None, None, id="no reading: unmeasured"),
        pytest.param(reading(ago(1)), None, id="a reading with no window measures nothing"),
        pytest.param(reading(ago(1), five=0.91, seven=0.35), 0.91, id="the fuller window counts"),
        pytest.param(reading(ago(1), five=0.2, seven=0.6), 0.6, id="the week may be fuller"),
        pytest.param(
            reading(ago(60), five=0.95, seven=0.1, resets_at=ago(1)),
            0.1,
            id="a window past its reset counts empty",
        ),
        pytest.param(reading(ago(301), five=0.1), None, id="a reading over 5 h old is unusable"),
        pytest.param(reading(ahead(1), five=0.1), None, id="a reading from the future is unusable"),
    ],
)
def test_fullness(last: Reading | None, expected: float | None) -> None:
    """Ranking reads the fuller of the two windows from a usable reading."""
    assert fullness(last, NOW) == expected


def test_headroom_ranks_bands_then_agents_then_name() -> None:
    """Measured with room, then unmeasured, then full (at or over 100%); 10-point bands,
    then fewest agents, then the id."""

    def ranked(name: str, five: float | None, agents: int) -> Standing:
        last = reading(ago(1), five=five) if five is not None else None
        return Standing(CredentialInfo(name, "subscription"), {}, last, agents)

    pool = [
        ranked("unmeasured", None, 0),
        ranked("b-91", 0.91, 0),
        ranked("a-15-busy", 0.15, 3),
        ranked("c-12-idle", 0.12, 1),
        ranked("b-19-idle", 0.19, 1),
        ranked("full", 1.0, 0),
    ]
    order = [s.info.id for s in sorted(pool, key=lambda s: headroom_key(s, NOW))]
    assert order == ["b-19-idle", "c-12-idle", "a-15-busy", "b-91", "unmeasured", "full"]


def test_headroom_ranks_fewer_turns_in_flight_after_fewer_agents() -> None:
    """In one band with as many agents, the credential with fewer turns in flight ranks
    first, whatever its id; fewer agents still outrank fewer turns."""

    def ranked(name: str, agents: int, in_flight: int) -> Standing:
        last = reading(ago(1), five=0.42)
        return Standing(CredentialInfo(name, "subscription"), {}, last, agents, in_flight)

    pool = [ranked("a-busy", 1, 3), ranked("b-quiet", 1, 0), ranked("c-lone", 0, 5)]
    order = [s.info.id for s in sorted(pool, key=lambda s: headroom_key(s, NOW))]
    assert order == ["c-lone", "b-quiet", "a-busy"]


@pytest.mark.parametrize(
    ("failure", "expected"),
    [
        pytest.param(refused("auth", ago(119)), True, id="auth: refused for 2 h"),
        pytest.param(refused("billing", ago(121)), False, id="billing: offered again after 2 h"),
        pytest.param(limited(ago(4)), True, id="a 429: refused for 5 min"),
        pytest.param(limited(ago(5)), False, id="a 429: offered again after 5 min"),
        pytest.param(limited(ago(1), ahead(0.5)), True, id="a 429 with its reset: until then"),
        pytest.param(
            limited(ago(1), ago(0.5)), False, id="a 429 with its reset: offered again after it"
        ),
    ],
)
def test_the_key_refusal_windows(failure: Failure, expected: bool) -> None:
    """The platform key waits 2 h after auth or billing; after a 429 until the reset the
    API said (a per-minute limit's seconds), else 5 min."""
    assert refused_recently(standing(failure, info=KEY), NOW) is expected


def test_the_earliest_retry_is_the_first_known_one_ahead() -> None:
    """Across credentials: instants ahead only, the earliest first; an auth failure's is
    when it may be a last resort (`pool.waits.retry_at`)."""
    pool = [
        standing(limited(ago(10), ahead(90))),
        standing(limited(ago(10), ahead(40))),
        standing(limited(ago(100), ago(5))),
        standing(last=reading(ago(1), "rejected", 1.0, resets_at=ahead(200))),
    ]
    assert retry_at(pool, NOW) == ahead(40)
    assert retry_at([*pool, standing(refused("auth", ago(1)))], NOW) == ahead(29)
