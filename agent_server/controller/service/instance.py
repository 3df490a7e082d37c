"""One running `pool serve`: the walker, the retries' timers, the switch-back, the sweep.

Everything the API shows is read from the store, so any instance answers for the whole
pool. What runs once across instances is claimed in the store: a retry by
`claim_retry` (`retries.py`), a switch-back by `claim_probe` and the assignment's
compare-and-set (`switchback.py`). Every `tick_s` the sweep arms the retries the store
holds (other instances' new waits too) and runs the switch-backs that are due.

Shutdown (`close`): new turns are refused (503), the sweep stops, the walks running
here get `drain_s` to finish; an async turn still running then is cancelled (its
lease released by the walk) and scheduled again as a retry due now, request kept, so
another instance (or the next start) reads its result back or runs it: nothing lost.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping
from dataclasses import dataclass, replace

from agent_server.controller.client import AgentClient
from agent_server.controller.clock import Clock, utc_now
from agent_server.controller.errors import ControllerError
from agent_server.controller.events import Announcer, WalkEvent, logger
from agent_server.controller.pool.file import Pool
from agent_server.controller.pool.state import ScheduledRetry
from agent_server.controller.result import WalkResult
from agent_server.controller.retries import RetryScheduler
from agent_server.controller.service.broadcast import Broadcast
from agent_server.controller.service.metrics import ServiceMetrics
from agent_server.controller.service.switchback import SwitchBack
from agent_server.controller.service.turns import TurnBook, TurnRequest, keep_request
from agent_server.controller.stores.base import PoolStore
from agent_server.controller.walker import Walker

TICK_S = 5.0
DRAIN_S = 30.0


@dataclass(frozen=True)
class ServiceConfig:
    """How one instance runs: its pool, its store, and its timings."""

    pool: Pool
    store: PoolStore
    tick_s: float = TICK_S
    """How often the store is swept for new retries and due switch-backs."""
    drain_s: float = DRAIN_S
    """How long running walks may take to finish at shutdown."""
    clock: Clock = utc_now
    clients: Mapping[str, AgentClient] | None = None
    """Each agent's client (None: one a `[agent.NAME]` of the pool file, by its url)."""


class ServiceInstance:
    """The state of one instance (module docstring)."""

    def __init__(self, config: ServiceConfig) -> None:
        self.config = config
        self.pool = config.pool
        self.store = config.store
        self.broadcast = Broadcast()
        self.metrics = ServiceMetrics()
        self.turns = TurnBook()
        self.accepting = True
        self.clients = (
            dict(config.clients)
            if config.clients is not None
            else {
                name: AgentClient(agent.url, agent.token)
                for name, agent in self.pool.agents.items()
            }
        )
        self.walker = Walker(self.clients, self.store, self.pool, clock=config.clock, hook=self._on)
        self.scheduler = RetryScheduler(
            self.store, self._run_retry, clock=config.clock, hook=self._on
        )
        announce = Announcer(self._on, config.clock)
        self.switchback = SwitchBack(self.store, self.pool, announce, self.metrics.probes.inc)
        self._walking = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._requests: dict[str, tuple[str, TurnRequest]] = {}
        self._sweep: asyncio.Task[None] | None = None

    def _on(self, event: WalkEvent) -> None:
        self.metrics.on_event(event)
        self.broadcast.publish("walk", event.as_json())

    async def start(self) -> None:
        """Register the pool's credentials, arm the retries and start the sweep."""
        await self.store.register_credentials(self.pool.infos)
        await self.arm_waiting()
        self._sweep = asyncio.create_task(self._sweeping(), name="pool-serve-sweep")

    async def arm_waiting(self) -> int:
        """Arm every retry the store holds with a request (any instance's, or `pool
        walk`'s) for an agent this instance reaches."""
        armed = 0
        for retry in (await self.store.snapshot()).retries.values():
            if retry.request is not None and retry.agent in self.clients:
                self.scheduler.arm(retry)
                armed += 1
        return armed

    async def _sweeping(self) -> None:
        while True:
            await asyncio.sleep(self.config.tick_s)
            try:
                await self.arm_waiting()
                await self.switchback.run_due()
            except ControllerError as exc:  # the store is down: try again next tick
                logger.warning("pool serve: the sweep failed (%s)", type(exc).__name__)

    async def run_turn(
        self, agent: str, request: TurnRequest, execution_id: str, *, rerun: bool = False
    ) -> WalkResult:
        """Walk one turn; a turn that waits keeps its request in the store with its retry."""
        self._walking += 1
        self._idle.clear()
        self._requests[execution_id] = (agent, request)
        try:
            result = await self.walker.walk(request.turn(agent, execution_id, rerun=rerun))
            self.metrics.on_result(result)
            if result.retry is not None:
                kept = keep_request(result.retry, request)
                await self.store.schedule_retry(kept)
                result = replace(result, retry=kept)
                self.scheduler.arm(kept)
            return result
        finally:
            self._requests.pop(execution_id, None)
            self._walking -= 1
            if self._walking == 0:
                self._idle.set()

    async def _run_retry(self, retry: ScheduledRetry) -> WalkResult:
        request = TurnRequest.model_validate_json(retry.request or "")
        result = await self.run_turn(retry.agent, request, retry.turn_ref, rerun=True)
        self.turns.record(result)
        return result

    def begin_shutdown(self) -> None:
        """Refuse new turns and end the event streams (an open stream would hold the
        server's shutdown for the whole drain)."""
        self.accepting = False
        self.broadcast.close()

    async def close(self) -> None:
        """Shut down gracefully (module docstring)."""
        self.begin_shutdown()
        if self._sweep is not None:
            self._sweep.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweep
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._idle.wait(), self.config.drain_s)
        left = dict(self._requests)
        await self.scheduler.close()
        for task in self.turns.unfinished():
            task.cancel()
        await asyncio.gather(*self.turns.unfinished(), return_exceptions=True)
        await self._hand_over(left)
        self.broadcast.close()
        for client in self.clients.values():
            await client.aclose()

    async def _hand_over(self, left: dict[str, tuple[str, TurnRequest]]) -> None:
        """The turns cut short: each a retry due now, for another instance to finish."""
        now = self.config.clock()
        for execution_id, (agent, request) in left.items():
            retry = ScheduledRetry(
                agent=agent,
                retry_id=f"handover-{execution_id}",
                due_at=now,
                assignment_generation=None,
                turn_ref=execution_id,
                scheduled_at=now,
            )
            with contextlib.suppress(ControllerError):
                await self.store.schedule_retry(keep_request(retry, request))
