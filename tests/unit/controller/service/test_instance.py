"""What an instance runs by itself: the waiting turns' retries, the switch-back, the
shutdown's hand-over; each once across two instances on one store."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest

from agent_server.controller import Failure, PoolStore, ScheduledRetry
from agent_server.controller.service.turns import TurnRequest
from tests.support.mock_agent import MockAgent, Verdict
from tests.unit.controller.service.conftest import GATEWAY, NOW, A, B, serving

pytestmark = pytest.mark.anyio
REQUEST = TurnRequest(message="go on", timeout_s=300).model_dump_json(by_alias=True)


async def _seed_retry(store: PoolStore, turn: str = "t-9") -> ScheduledRetry:
    retry = ScheduledRetry("a1", "r1", NOW, None, turn, NOW - timedelta(hours=1), request=REQUEST)
    await store.schedule_retry(retry)
    return retry


async def _until(check: Any, timeout_s: float = 5.0) -> None:
    for _ in range(int(timeout_s / 0.01)):
        if await check():
            return
        await asyncio.sleep(0.01)
    msg = "not reached in time"
    raise AssertionError(msg)


async def test_a_waiting_turn_keeps_its_request_beside_its_retry(store_url: str) -> None:
    """Every credential refuses: the retry in the store carries the turn's request."""
    later = NOW + timedelta(hours=1)
    walled = Verdict("rate_limit", later)
    agent = MockAgent({A: walled, B: walled, GATEWAY: Verdict("rate_limit")})
    async with serving(store_url, {"a1": agent.client()}) as served:
        answer = await served.http.post(
            "/v1/agents/a1/turns", json={"message": "the prompt", "execution_id": "t-3"}
        )
        retry = (await served.store.snapshot()).retries["t-3"]
    assert answer.json()["outcome"] == "waiting_for_capacity"
    assert retry.request is not None
    assert TurnRequest.model_validate_json(retry.request).message == "the prompt"


async def test_a_due_retry_runs_once_across_two_instances(store_url: str) -> None:
    """Both instances arm the retry another wrote; one claims and runs it (rerun: the
    kept request, the turn's id); it leaves the store; the counter says which."""
    agents = [MockAgent({}), MockAgent({})]
    async with (
        serving(store_url, {"a1": agents[0].client()}) as one,
        serving(store_url, {"a1": agents[1].client()}) as two,
    ):
        retry = await _seed_retry(one.store)
        # Both armed before either runs (no await between): a due retry armed by one
        # instance may otherwise be run and gone before the other reads the store.
        one.instance.scheduler.arm(retry)
        two.instance.scheduler.arm(retry)

        async def gone() -> bool:
            return not (await one.store.snapshot()).retries

        await _until(gone)
        await asyncio.sleep(0.05)
        runs = [
            one.instance.metrics.retries._value.get(),
            two.instance.metrics.retries._value.get(),
        ]
    turns = agents[0].turns + agents[1].turns
    assert [turn["execution_id"] for turn in turns] == ["t-9"]
    assert turns[0]["message"] == "go on"
    assert sorted(runs) == [0, 1]


async def test_an_instance_arms_the_waiting_turns_it_can_run(store_url: str) -> None:
    """`arm_waiting` arms each retry with a kept request for an agent it reaches; one
    without a request (an older `pool walk`'s) or for an agent of no client is left."""
    agent = MockAgent({})
    async with serving(store_url, {"a1": agent.client()}) as served:
        await _seed_retry(served.store)
        bare = ScheduledRetry("a1", "r2", NOW, None, "t-bare", NOW - timedelta(hours=1))
        elsewhere = ScheduledRetry(
            "a9", "r3", NOW, None, "t-else", NOW - timedelta(hours=1), request=REQUEST
        )
        await served.store.schedule_retry(bare)
        await served.store.schedule_retry(elsewhere)
        assert await served.instance.arm_waiting() == 1


async def test_the_switch_back_runs_once_across_two_instances(store_url: str) -> None:
    """An agent's cooldown passed and a is healthy: of two instances sweeping at once
    one moves it back (the cooldown cleared, one new generation); a probe of a is
    recorded, so the other finds nothing to do."""
    async with serving(store_url, {}) as one, serving(store_url, {}) as two:
        store = one.store
        first = await store.compare_and_set_assignment(
            "a1", "a", expected_generation=None, at=NOW - timedelta(days=1)
        )
        await store.set_gateway_until("a1", NOW - timedelta(seconds=1))
        done = await asyncio.gather(
            one.instance.switchback.run_due(), two.instance.switchback.run_due()
        )
        snapshot = await store.snapshot()
    assert sorted(done) == [0, 1]
    assert snapshot.gateway_until == {}
    assert first is not None
    moved = snapshot.assignments["a1"]
    assert (moved.credential_id, moved.generation) == ("a", first.generation + 1)
    assert moved.assigned_at == first.assigned_at  # the same choice: no operator's word


async def test_no_switch_back_while_every_subscription_is_walled(store_url: str) -> None:
    """a and b are rate limited until a reset ahead: the cooldown moves to that reset."""
    reset = NOW + timedelta(minutes=20)
    async with serving(store_url, {}) as served:
        store = served.store
        for ident in ("a", "b"):
            await store.record(failure=Failure(ident, "rate_limit", NOW, reset, "a1"))
        await store.set_gateway_until("a1", NOW - timedelta(seconds=1))
        done = await served.instance.switchback.run_due()
        snapshot = await store.snapshot()
    assert done == 0
    assert snapshot.gateway_until == {"a1": reset}


async def test_a_turn_cut_short_at_shutdown_is_handed_over(store_url: str) -> None:
    """An async turn still running when the drain ends is cancelled and scheduled as a
    retry due now, its request kept: another instance finishes it."""
    agent = MockAgent({})
    client = agent.client()

    async def forever(*args: Any, **kwargs: Any) -> Any:
        await asyncio.Event().wait()

    client.task = forever  # type: ignore[method-assign]
    async with serving(store_url, {"a1": client}) as served:
        store = served.store
        answer = await served.http.post(
            "/v1/agents/a1/turns", json={"message": "long", "execution_id": "t-5", "async": True}
        )
        assert answer.status_code == 202
        await asyncio.sleep(0.05)
    async with serving(store_url, {}) as after:
        retry = (await after.store.snapshot()).retries["t-5"]
    assert retry.due_at == NOW
    assert retry.request is not None
    assert TurnRequest.model_validate_json(retry.request).message == "long"
    _ = store
