"""Agents waiting for capacity: one timer an agent, armed from the store, run once.

The walk persists one `ScheduledRetry` an agent (a new one replaces it). At start a
controller calls `arm_all`, which arms one timer for each; arming again, in this
process or after a restart, never makes a second timer for the same retry. When a
timer fires, the retry is taken from the store atomically, so of several controllers
sharing a store exactly one runs it; and it runs only if the agent's assignment is
still the one it was scheduled under (a manual assignment since supersedes it).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

from agent_server.controller.clock import Clock, utc_now
from agent_server.controller.events import EventHook, WalkEvent, WalkPhase, emit
from agent_server.controller.pool.state import ScheduledRetry
from agent_server.controller.stores.base import PoolStore

RunRetry = Callable[[ScheduledRetry], Awaitable[object]]
"""What the controller does when an agent's retry is due: walk its turn again."""


class RetryScheduler:
    """The timers of the retries in one store, for one controller process."""

    def __init__(
        self,
        store: PoolStore,
        run: RunRetry,
        *,
        clock: Clock = utc_now,
        hook: EventHook | None = None,
    ) -> None:
        self.store = store
        self.run = run
        self.clock = clock
        self.hook = hook
        self._armed: dict[str, tuple[str, asyncio.Task[None]]] = {}

    @property
    def armed(self) -> dict[str, str]:
        """The armed retry of each agent: agent -> retry id."""
        return {
            agent: retry_id for agent, (retry_id, task) in self._armed.items() if not task.done()
        }

    async def arm_all(self) -> int:
        """Arm a timer for every retry the store holds; how many are armed now."""
        for retry in (await self.store.snapshot()).retries.values():
            self.arm(retry)
        return len(self.armed)

    def arm(self, retry: ScheduledRetry) -> None:
        """Arm `retry` (it replaces an older one of its agent; the same one is a no-op)."""
        held = self._armed.get(retry.agent)
        if held is not None:
            retry_id, task = held
            if retry_id == retry.retry_id and not task.done():
                return
            task.cancel()
        task = asyncio.create_task(self._fire(retry), name=f"retry-{retry.agent}")
        self._armed[retry.agent] = (retry.retry_id, task)

    async def _fire(self, retry: ScheduledRetry) -> None:
        await asyncio.sleep(max(0.0, (retry.due_at - self.clock()).total_seconds()))
        if not await self.store.take_retry(retry.agent, retry.retry_id):
            return  # another controller ran it, or it was replaced or superseded
        assignment = await self.store.assignment(retry.agent)
        current = assignment.generation if assignment else None
        if current != retry.assignment_generation:
            self._emit(WalkPhase.SUPERSEDED, retry, "the assignment changed since it was scheduled")
            return
        self._emit(WalkPhase.RETRY_DUE, retry, f"turn {retry.turn_ref}")
        await self.run(retry)

    def _emit(self, phase: WalkPhase, retry: ScheduledRetry, note: str) -> None:
        emit(self.hook, WalkEvent(phase, retry.agent, self.clock(), note=note))

    async def close(self) -> None:
        """Cancel every timer (the retries stay in the store for the next start)."""
        tasks = [task for _, task in self._armed.values()]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._armed.clear()
