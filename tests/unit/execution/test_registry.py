"""The execution registry: ids, the parallel cap, terminate, drain."""

from __future__ import annotations

import asyncio

import pytest

from agent_server.errors import Busy, ExecutionInProgress, NotFound
from agent_server.execution.registry import BUSY_RETRY_AFTER_S, RECENT_LIMIT, Registry

pytestmark = pytest.mark.timeout(60)


def test_a_running_id_is_refused_and_a_finished_one_may_be_reissued() -> None:
    """409 execution_in_progress while running; after finish the id is free again."""
    registry = Registry(max_parallel=4)
    first = registry.start("walk", "oauth_token", 7)
    with pytest.raises(ExecutionInProgress) as refused:
        registry.start("walk", "api_key", 8)
    assert (refused.value.status, refused.value.error_code) == (409, "execution_in_progress")
    registry.finish(first)
    assert first.done.is_set()
    assert registry.recently_completed() == ["walk"]
    second = registry.start("walk", "api_key", 8)
    assert second is not first
    assert registry.recently_completed() == []
    assert [e.execution_id for e in registry.running()] == ["walk"]


def test_finishing_a_stale_execution_never_forgets_the_running_one() -> None:
    """Only the very execution object that is registered is removed by its finish."""
    registry = Registry(max_parallel=4)
    old = registry.start("same", "baseline", 1)
    registry.finish(old)
    new = registry.start("same", "baseline", 1)
    registry.finish(old)
    assert registry.running() == [new]


def test_over_the_cap_is_busy_409_with_retry_after_never_429() -> None:
    """The controller reads 429 as a rate limit: a full server says 409 busy."""
    registry = Registry(max_parallel=2)
    a = registry.start("a", "baseline", 1)
    registry.start("b", "baseline", 1)
    with pytest.raises(Busy) as busy:
        registry.start("c", "baseline", 1)
    assert (busy.value.status, busy.value.error_code) == (409, "busy")
    assert busy.value.headers == {"Retry-After": str(BUSY_RETRY_AFTER_S)}
    registry.finish(a)
    registry.start("c", "baseline", 1)
    assert len(registry) == 2


def test_running_lists_oldest_first_with_route_and_generation() -> None:
    """The running list carries what GET /api/executions/running shows."""
    registry = Registry(max_parallel=4)
    registry.start("one", "provider", 11)
    registry.start("two", "baseline", 12)
    listed = [(e.execution_id, e.auth_route, e.generation) for e in registry.running()]
    assert listed == [("one", "provider", 11), ("two", "baseline", 12)]
    assert all(e.started_at.endswith("+00:00") for e in registry.running())


def test_recently_completed_is_bounded_and_newest_last() -> None:
    """Only the last RECENT_LIMIT ids are remembered."""
    registry = Registry(max_parallel=1)
    for index in range(RECENT_LIMIT + 5):
        registry.finish(registry.start(f"id-{index}", "baseline", 1))
    recent = registry.recently_completed()
    assert len(recent) == RECENT_LIMIT
    assert recent[0] == "id-5"
    assert recent[-1] == f"id-{RECENT_LIMIT + 4}"


def test_terminate_answers_terminated_already_finished_or_not_found() -> None:
    """Terminate sets the cancel event and marks the turn as terminated by the route."""
    registry = Registry(max_parallel=4)
    execution = registry.start("t", "baseline", 1)
    assert registry.terminate("t") == "terminated"
    assert execution.cancel.is_set()
    assert execution.terminated
    registry.finish(execution)
    assert registry.terminate("t") == "already_finished"
    with pytest.raises(NotFound):
        registry.terminate("never")


def test_drain_waits_for_a_turn_within_the_grace() -> None:
    """A turn that finishes within the grace is not cancelled."""

    async def scenario() -> None:
        registry = Registry(max_parallel=4)
        execution = registry.start("quick", "baseline", 1)
        asyncio.get_running_loop().call_later(0.1, registry.finish, execution)
        await registry.drain(5)
        assert not execution.cancel.is_set()
        assert not execution.shut_down
        with pytest.raises(Busy):
            registry.start("late", "baseline", 1)

    asyncio.run(scenario())


def test_drain_kills_a_turn_past_the_grace() -> None:
    """After the grace the turn is cancelled (as a shutdown kill, not a terminate)."""

    async def scenario() -> None:
        registry = Registry(max_parallel=4)
        execution = registry.start("slow", "baseline", 1)

        async def turn() -> None:
            await execution.cancel.wait()
            registry.finish(execution)

        task = asyncio.create_task(turn())
        loop = asyncio.get_running_loop()
        started = loop.time()
        await registry.drain(0.2)
        assert 0.2 <= loop.time() - started < 2
        assert execution.shut_down
        assert not execution.terminated
        await task

    asyncio.run(scenario())


def test_drain_with_nothing_running_returns_at_once() -> None:
    """No turn, no wait; the registry stops accepting all the same."""

    async def scenario() -> None:
        registry = Registry(max_parallel=4)
        await asyncio.wait_for(registry.drain(30), 1)
        assert not registry.accepting

    asyncio.run(scenario())
