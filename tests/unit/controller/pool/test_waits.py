"""When a waiting turn tries again, when the gateway gives way, where a new agent lands
(pure, as tables of named pools)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from agent_server.controller.pool.rungs import PoolView, first_subscription
from agent_server.controller.pool.standing import Standing
from agent_server.controller.pool.state import (
    Assignment,
    CredentialInfo,
    Failure,
    PoolSnapshot,
    Reading,
    WindowUse,
)
from agent_server.controller.pool.waits import (
    GATEWAY_COOLDOWN,
    offered_again,
    retry_at,
    switch_back_at,
)

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
MIN = timedelta(minutes=1)
A, B = CredentialInfo("a", "subscription"), CredentialInfo("b", "subscription")
KEY, GW = CredentialInfo("key", "api_key"), CredentialInfo("gw", "gateway")


def failed(info: CredentialInfo, kind: str, ago: float, reset_in: float | None = None) -> Standing:
    reset = NOW + reset_in * MIN if reset_in is not None else None
    failure = Failure(info.id, kind, NOW - ago * MIN, reset)  # type: ignore[arg-type]
    return Standing(info, {failure.kind: failure})


@pytest.mark.parametrize(
    ("pool", "expected"),
    [
        pytest.param(
            [failed(A, "rate_limit", 1, reset_in=10 * 24 * 60), failed(KEY, "rate_limit", 1)],
            NOW + 4 * MIN,
            id="the key's 5-minute window, not the subscription's reset 10 days out",
        ),
        pytest.param(
            [failed(A, "rate_limit", 1, reset_in=20), failed(GW, "auth", 1)],
            NOW + 20 * MIN,
            id="a capped subscription's reset before the gateway's 2 h",
        ),
        pytest.param(
            [failed(KEY, "billing", 1), failed(GW, "rate_limit", 2)],
            NOW + 3 * MIN,
            id="the gateway's 429 window",
        ),
        pytest.param(
            [failed(A, "auth", 1)],
            NOW + 29 * MIN,
            id="an auth failure: when it may be a last resort",
        ),
        pytest.param([Standing(A)], None, id="nothing known"),
    ],
)
def test_retry_at_counts_every_window(pool: list[Standing], expected: datetime | None) -> None:
    """The earliest instant any credential is offered again, whatever its kind."""
    assert retry_at(pool, NOW) == expected


def test_a_key_refused_for_two_reasons_waits_for_both_windows() -> None:
    """A key refused with billing and a 429 is offered again after the longer window."""
    billing = Failure("key", "billing", NOW - MIN)
    limit = Failure("key", "rate_limit", NOW - MIN)
    standing = Standing(KEY, {"billing": billing, "rate_limit": limit})
    assert offered_again(standing, NOW) == NOW - MIN + timedelta(hours=2)


def test_the_gateway_gives_way_at_the_capped_subscriptions_reset() -> None:
    """Switch-back at the subscription's known reset (20 s); the cooldown only when none
    is known."""
    capped = failed(A, "rate_limit", 1, reset_in=1 / 3)
    assert switch_back_at([capped, Standing(GW)], NOW) == NOW + timedelta(seconds=20)
    assert switch_back_at([Standing(A), Standing(GW)], NOW) == NOW + GATEWAY_COOLDOWN


def _view(readings: dict[str, float], agents: dict[str, int]) -> PoolView:
    snapshot = PoolSnapshot(
        assignments={
            f"{c}-{n}": Assignment(f"{c}-{n}", c, 1, NOW)
            for c, count in agents.items()
            for n in range(count)
        },
        readings={
            c: Reading(c, NOW - MIN, "allowed", None, WindowUse(use, NOW + 60 * MIN, "allowed"))
            for c, use in readings.items()
        },
    )
    return PoolView.of((A, B, KEY), snapshot, "new-agent")


@pytest.mark.parametrize(
    ("readings", "agents", "expected"),
    [
        pytest.param({}, {"a": 1}, "b", id="both unmeasured: the one with fewer agents"),
        pytest.param({"a": 0.2, "b": 0.25}, {"a": 1}, "b", id="one band: fewer agents"),
        pytest.param({"a": 0.2, "b": 0.9}, {"a": 3}, "a", id="more headroom wins over agents"),
        pytest.param({"a": 1.0}, {}, "b", id="a full reading ranks after an unmeasured one"),
    ],
)
def test_a_new_agent_lands_by_the_ranking(
    readings: dict[str, float], agents: dict[str, int], expected: str
) -> None:
    """Not the file's first subscription: the same ranking every turn uses."""
    assert first_subscription(_view(readings, agents), NOW) == expected
