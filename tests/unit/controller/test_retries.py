"""An agent waiting for capacity has one retry: armed once, run once, superseded by hand."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest

from agent_server.controller.events import WalkEvent, WalkPhase
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
        assert first.armed == {"agent": "r1"}
        assert await second.arm_all() == 1
        await _settle(runs, 1)
        assert [r.retry_id for r in runs] == ["r1"]
        assert (await store.snapshot()).retries == {}
    finally:
        for scheduler in (first, second):
            await scheduler.close()
        for opened in (store, other):
            await opened.close()


async def test_a_new_assignment_supersedes_the_retry(store_url: str) -> None:
    """A retry scheduled under an older assignment generation does not run."""
    store = await open_store(store_url)
    await store.compare_and_set_assignment("agent", "sub-a", expected_generation=None, at=NOW)
    await store.compare_and_set_assignment("agent", "sub-b", expected_generation=1, at=NOW)
    await store.schedule_retry(_retry("r1", 1, due_in_s=0))
    runs: list[ScheduledRetry] = []
    events: list[WalkEvent] = []

    async def run(retry: ScheduledRetry) -> None:
        runs.append(retry)

    scheduler = RetryScheduler(store, run, clock=lambda: NOW, hook=events.append)
    try:
        await scheduler.arm_all()
        await _settle(runs, 0)
        assert runs == []
        assert [e.phase for e in events] == [WalkPhase.SUPERSEDED]
        assert (await store.snapshot()).retries == {}
    finally:
        await scheduler.close()
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
