"""A credential's outcome is the API's answer: the exchange's verdict over the CLI's words."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from agent_server.broker import Exchange, TurnExchanges
from agent_server.execution.exchanges import UNANSWERED, judge, seen
from agent_server.outcome.classify import outcome_of
from agent_server.wire.names import OutcomeKind as K

NOW = datetime(2026, 12, 5, 12, 0, tzinfo=UTC)
P = "anthropic-ratelimit-unified-"


def exchanges(*answers: Exchange) -> TurnExchanges:
    record = TurnExchanges()
    for answer in answers:
        record.add(answer)
    return record


SERVED = Exchange(200)
LIMITED = Exchange(
    429,
    {
        f"{P}reset": str(int((NOW + timedelta(hours=2)).timestamp())),
        f"{P}representative-claim": "five_hour",
    },
    "rate_limit_error",
)
REFUSED_KEY = Exchange(401, {}, "authentication_error")
OVERLOADED = Exchange(529, {}, "overloaded_error")


@pytest.mark.parametrize(
    ("case", "cli_says", "api", "kind", "switch"),
    [
        (
            "a printed rate limit with no exchange blames nobody",
            K.RATE_LIMIT,
            (),
            K.EXECUTION_ERROR,
            False,
        ),
        (
            "a printed auth failure after a served request blames nobody",
            K.AUTH,
            (SERVED,),
            K.EXECUTION_ERROR,
            False,
        ),
        (
            "a printed billing failure with no exchange blames nobody",
            K.BILLING,
            (),
            K.EXECUTION_ERROR,
            False,
        ),
        ("the API's 429 is the rate limit", K.RATE_LIMIT, (LIMITED,), K.RATE_LIMIT, True),
        (
            "the API's 401 is auth whatever the CLI printed",
            K.EXECUTION_ERROR,
            (REFUSED_KEY,),
            K.AUTH,
            True,
        ),
        (
            "the API's 529 is never a switch, even printed as a rate limit",
            K.RATE_LIMIT,
            (OVERLOADED,),
            K.UPSTREAM_UNAVAILABLE,
            False,
        ),
        (
            "the last exchange decides after retries",
            K.UPSTREAM_UNAVAILABLE,
            (OVERLOADED, LIMITED),
            K.RATE_LIMIT,
            True,
        ),
        ("a kill is the CLI's own fact", K.KILLED, (LIMITED,), K.KILLED, False),
        ("max turns is the CLI's own fact", K.MAX_TURNS, (SERVED,), K.MAX_TURNS, False),
        ("a success stands", K.SUCCESS, (SERVED,), K.SUCCESS, False),
        (
            "a model rejection the CLI made before any request stands",
            K.MODEL_UNSUPPORTED,
            (),
            K.MODEL_UNSUPPORTED,
            False,
        ),
    ],
)
def test_the_api_decides_a_credentials_outcome(
    case: str, cli_says: K, api: tuple[Exchange, ...], kind: K, switch: bool
) -> None:
    """The table of contract §7 rows 5-9, from the exchange; the CLI's words only outside it."""
    judged = judge(
        outcome_of(cli_says, "the CLI's words"), seen(exchanges(*api), NOW), "Claude Code"
    )
    assert (judged.kind, judged.switch_credential) == (kind, switch), case


def test_a_rate_limit_takes_its_window_and_reset_from_the_headers() -> None:
    """Not from the CLI's text: the representative claim and the unified reset."""
    judged = judge(
        outcome_of(K.RATE_LIMIT, "resets in 2100"), seen(exchanges(LIMITED), NOW), "Claude Code"
    )
    assert judged.rate_limit_type == "five_hour"
    assert judged.resets_at == NOW + timedelta(hours=2)
    assert judged.api_error_status == 429


def test_a_refusal_nobody_gave_says_so() -> None:
    """The message says no credential is blamed."""
    judged = judge(outcome_of(K.RATE_LIMIT, "limit"), seen(exchanges(), NOW), "Claude Code")
    assert judged.message == UNANSWERED.format(label="Claude Code")


def test_what_the_broker_saw_counts_requests_and_keeps_the_last_reading() -> None:
    """A turn answered twice; its headroom is the last answer's headers'."""
    reading = Exchange(200, {f"{P}status": "allowed", f"{P}5h-utilization": "0.5"})
    summed = seen(exchanges(reading, Exchange(200)), NOW)
    assert (summed.requests, summed.answered) == (2, True)
    assert summed.reading is not None
    assert summed.reading.five_hour is not None
    assert summed.reading.five_hour.utilization == 0.5
    assert seen(exchanges(), NOW).answered is False
    assert seen(exchanges(Exchange(None)), NOW).answered is False
