"""Turns waiting for capacity: one timer a waiting turn, armed from the store, run at least once.

The walk persists one `ScheduledRetry` a waiting turn (keyed by the turn, so two
waiting turns of one agent both keep theirs). At start a controller calls `arm_all`,
which arms a timer for each; arming again, in this process or after a restart, never
makes a second timer for the same retry. When a timer fires, the retry is claimed in
the store (atomically: of several controllers sharing a store exactly one runs it),
run, and only then removed. A controller killed while it runs one leaves the claim;
the claim's lease ends (`CLAIM_LEASE`), and the next start arms the retry again for
then: at least once. The re-run is safe by the turn's execution id: the walk reads a
turn the server already finished back from its retained result (`WalkTurn.rerun`).

A retry whose turn was stopped or superseded by hand is gone from the store: its timer
finds nothing to claim.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import replace
from datetime import timedelta

from agent_server.controller.clock import Clock, utc_now
from agent_server.controller.events import Announcer, EventHook, WalkPhase, logger
from agent_server.controller.pool.state import ScheduledRetry
from agent_server.controller.result import WalkResult
from agent_server.controller.stores.base import PoolStore

RunRetry = Callable[[ScheduledRetry], Awaitable[object]]
"""What the controller does when a turn's retry is due: walk that turn again (with
`WalkTurn(..., execution_id=retry.turn_ref, rerun=True)`). A `WalkResult` it returns
that waits again is armed too."""
CLAIM_LEASE = timedelta(minutes=20)
"""How long a claim holds: longer than a walk (900 s by default) and its answer."""


class RetryScheduler:
    """The timers of the retries in one store, for one controller process."""

    def __init__(
        self,
        store: PoolStore,
        run: RunRetry,
        *,
        clock: Clock = utc_now,
        hook: EventHook | None = None,
        lease: timedelta = CLAIM_LEASE,
    ) -> None:
        self.store = store
        self.run = run
        self.clock = clock
        self.lease = lease
        self.announce = Announcer(hook, clock)
        self._armed: dict[str, tuple[str, asyncio.Task[None]]] = {}

    @property
    def armed(self) -> dict[str, str]:
        """The armed retry of each waiting turn: turn -> retry id."""
        return {turn: retry_id for turn, (retry_id, task) in self._armed.items() if not task.done()}

    async def arm_all(self) -> int:
        """Arm a timer for every retry the store holds (a claimed one for when its lease
        ends); how many are armed now."""
        for retry in (await self.store.snapshot()).retries.values():
            self.arm(retry)
        return len(self.armed)

    def arm(self, retry: ScheduledRetry) -> None:
        """Arm `retry` (it replaces an older one of its turn; the same one is a no-op)."""
        held = self._armed.get(retry.turn_ref)
        if held is not None:
            retry_id, task = held
            if retry_id == retry.retry_id and not task.done():
                return
            task.cancel()
        task = asyncio.create_task(self._fire(retry), name=f"retry-{retry.turn_ref}")
        self._armed[retry.turn_ref] = (retry.retry_id, task)

    def disarm(self, turn_ref: str) -> None:
        """Cancel the turn's timer here (the store's retry is the caller's to take)."""
        held = self._armed.pop(turn_ref, None)
        if held is not None:
            held[1].cancel()

    async def _fire(self, retry: ScheduledRetry) -> None:
        due = retry.due_at
        if retry.claimed_until is not None:  # a claim of a controller that may have died
            due = max(due, retry.claimed_until)
        await asyncio.sleep(max(0.0, (due - self.clock()).total_seconds()))
        now = self.clock()
        claimed = await self.store.claim_retry(
            retry.turn_ref, retry.retry_id, at=now, until=now + self.lease
        )
        if not claimed:
            return  # another controller runs it, or it was replaced, stopped or superseded
        self.announce(WalkPhase.RETRY_DUE, retry.agent, note=f"turn {retry.turn_ref}")
        try:
            result = await self.run(retry)
        except Exception:
            # The claim stays: the retry runs again when its lease ends (at least once).
            logger.exception("the retry of turn %s failed; it runs again later", retry.turn_ref)
            self._forget(retry)
            self.arm(replace(retry, claimed_until=now + self.lease))
            return
        await self.store.take_retry(retry.turn_ref, retry.retry_id)
        self._forget(retry)
        if isinstance(result, WalkResult) and result.retry is not None:
            self.arm(result.retry)

    def _forget(self, retry: ScheduledRetry) -> None:
        """This timer is done: drop it, so that the turn's next one may be armed."""
        if self._armed.get(retry.turn_ref, ("",))[0] == retry.retry_id:
            del self._armed[retry.turn_ref]

    async def close(self) -> None:
        """Cancel every timer (the retries stay in the store for the next start)."""
        tasks = [task for _, task in self._armed.values()]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._armed.clear()
