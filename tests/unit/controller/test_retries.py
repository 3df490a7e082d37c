"""An agent waiting for capacity has one retry: armed once, run once, superseded by hand."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from agent_server.controller.pool.state import ScheduledRetry
from agent_server.controller.retries import RetryScheduler
from agent_server.controller.stores.base import open_store
from tests.support.redis_server import (  # noqa: F401 - fixtures
    redis_server,
    store_url_fixture,
)

pytestmark = pytest.mark.anyio
NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _retry(retry_id: str, generation: int | None, due_in_s: float) -> ScheduledRetry:
    return ScheduledRetry(
        "agent", retry_id, NOW + timedelta(seconds=due_in_s), generation, "t", NOW
    )


async def _settle(runs: list[ScheduledRetry], count: int) -> None:
    for _ in range(500):
        if len(runs) >= count:
            break
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.1)  # and no second one comes


async def test_two_controllers_armed_twice_run_the_retry_once(store_url: str) -> None:
    """Arming again is a no-op, and of two controllers on one store exactly one runs it."""
    store, other = await open_store(store_url), await open_store(store_url)
    await store.compare_and_set_assignment("agent", "sub-a", expected_generation=None, at=NOW)
    await store.schedule_retry(_retry("r1", 1, due_in_s=0.5))
    runs: list[ScheduledRetry] = []

    async def run(retry: ScheduledRetry) -> None:
        runs.append(retry)

    first = RetryScheduler(store, run, clock=lambda: NOW)
    second = RetryScheduler(other, run, clock=lambda: NOW)
    try:
        assert await first.arm_all() == 1
        assert await first.arm_all() == 1
        assert first.armed == {"t": "r1"}
        assert await second.arm_all() == 1
        await _settle(runs, 1)
        assert [r.retry_id for r in runs] == ["r1"]
        assert (await store.snapshot()).retries == {}
    finally:
        for scheduler in (first, second):
            await scheduler.close()
        for opened in (store, other):
            await opened.close()


async def test_two_waiting_turns_of_one_agent_both_run(store_url: str) -> None:
    """Each waiting turn keeps its own retry: both run, neither replaces the other."""
    store = await open_store(store_url)
    first, second = _retry("r1", 1, 0.05), replace(_retry("r2", 1, 0.1), turn_ref="t2")
    await store.schedule_retry(first)
    await store.schedule_retry(second)
    runs: list[ScheduledRetry] = []

    async def run(retry: ScheduledRetry) -> None:
        runs.append(retry)

    scheduler = RetryScheduler(store, run, clock=lambda: NOW)
    try:
        assert await scheduler.arm_all() == 2
        await _settle(runs, 2)
        assert sorted(r.turn_ref for r in runs) == ["t", "t2"]
        assert (await store.snapshot()).retries == {}
    finally:
        await scheduler.close()
        await store.close()


async def test_a_claim_whose_controller_died_runs_again_once(store_url: str) -> None:
    """A controller claimed the retry and died: the retry stays; the next start arms it
    for the lease's end, and it runs once."""
    store = await open_store(store_url)
    clock = [NOW]
    await store.schedule_retry(_retry("r1", 1, 0))
    assert await store.claim_retry("t", "r1", at=NOW, until=NOW + timedelta(seconds=0.3))
    runs: list[ScheduledRetry] = []

    async def run(retry: ScheduledRetry) -> None:
        runs.append(retry)

    restarted = RetryScheduler(store, run, clock=lambda: clock[0])
    try:
        assert await restarted.arm_all() == 1
        await asyncio.sleep(0.1)
        assert runs == []  # the claim holds: its controller may be alive
        clock[0] = NOW + timedelta(seconds=0.3)
        await _settle(runs, 1)
        assert [r.retry_id for r in runs] == ["r1"]
        assert (await store.snapshot()).retries == {}
    finally:
        await restarted.close()
        await store.close()


async def test_a_replaced_retry_never_runs(store_url: str) -> None:
    """Arming the agent's newer retry cancels the older timer; only the newer one runs."""
    store = await open_store(store_url)
    await store.compare_and_set_assignment("agent", "sub-a", expected_generation=None, at=NOW)
    runs: list[ScheduledRetry] = []

    async def run(retry: ScheduledRetry) -> None:
        runs.append(retry)

    scheduler = RetryScheduler(store, run, clock=lambda: NOW)
    try:
        old, new = _retry("old", 1, due_in_s=0.2), _retry("new", 1, due_in_s=0.05)
        await store.schedule_retry(old)
        scheduler.arm(old)
        await store.schedule_retry(new)
        scheduler.arm(new)
        await _settle(runs, 1)
        await asyncio.sleep(0.2)
        assert [r.retry_id for r in runs] == ["new"]
    finally:
        await scheduler.close()
        await store.close()


async def test_a_run_that_raises_keeps_its_claim_and_runs_again(store_url: str) -> None:
    """The controller's callback fails: the retry stays in the store, claimed, and is run
    again once the claim's lease ends (at least once)."""
    store = await open_store(store_url)
    await store.schedule_retry(_retry("r1", 1, 0))
    runs: list[ScheduledRetry] = []

    async def run(retry: ScheduledRetry) -> None:
        runs.append(retry)
        if len(runs) == 1:
            msg = "the controller's own turn store is down"
            raise RuntimeError(msg)

    scheduler = RetryScheduler(store, run, lease=timedelta(seconds=0.2))
    try:
        await scheduler.arm_all()
        await _settle(runs, 2)
        assert [r.retry_id for r in runs] == ["r1", "r1"]
        assert (await store.snapshot()).retries == {}
    finally:
        await scheduler.close()
        await store.close()
