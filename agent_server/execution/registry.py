"""The execution registry: which turns run, the parallel cap, terminate and drain.

One asyncio loop owns it, so plain dicts suffice; every change happens between
awaits.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import math
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Literal

from agent_server.errors import Busy, ExecutionInProgress, NotFound
from agent_server.process.timings import SHUTDOWN_MARGIN_S
from agent_server.records.progress import Progress
from agent_server.records.retained import MAX_RESULTS
from agent_server.wire.names import AuthRoute

logger = logging.getLogger("agent_server.registry")

RECENT_LIMIT = MAX_RESULTS
"""As many finished ids as retained results (contract §6.6)."""
RECENT_PROGRESS_LIMIT = 16
"""Finished turns whose events a late subscriber can still replay."""
BUSY_RETRY_AFTER_S = 5


@dataclass
class Execution:
    """One accepted turn: enough to list it and to stop it."""

    execution_id: str
    auth_route: AuthRoute
    generation: int
    state: Literal["queued", "running"] = "running"
    """`queued`: accepted, waiting for the chat; nothing spawned yet."""
    started_at: str = field(default_factory=lambda: datetime.now(UTC).isoformat())
    started: float = field(default_factory=time.monotonic)
    cancel: asyncio.Event = field(default_factory=asyncio.Event)
    terminated: bool = False
    """Set by the terminate route (a client disconnect cancels without it)."""
    shut_down: bool = False
    """Set when the shutdown drain killed the turn after its grace."""
    done: asyncio.Event = field(default_factory=asyncio.Event)
    progress: Progress = field(default_factory=Progress)


class Registry:
    """Running turns by execution id, capped at `max_parallel`."""

    def __init__(self, max_parallel: int) -> None:
        self.max_parallel = max_parallel
        self._running: dict[str, Execution] = {}
        self._recent: collections.OrderedDict[str, None] = collections.OrderedDict()
        self._recent_progress: collections.OrderedDict[str, Progress] = collections.OrderedDict()
        self.accepting = True

    def start(
        self, execution_id: str, auth_route: AuthRoute, generation: int, *, queued: bool = False
    ) -> Execution:
        """Register a turn (`queued` until it may run), or raise ExecutionInProgress / Busy.

        A queued turn holds a slot like a running one: it is listed, terminable, and
        counted against `max_parallel` (never 429: the controller reads 429 as a limit).
        """
        if execution_id in self._running:
            msg = f"execution {execution_id} is already running"
            raise ExecutionInProgress(msg)
        if not self.accepting or len(self._running) >= self.max_parallel:
            msg = f"all {self.max_parallel} turn slots are busy; retry later"
            raise Busy(msg, headers={"Retry-After": str(BUSY_RETRY_AFTER_S)})
        execution = Execution(
            execution_id, auth_route, generation, state="queued" if queued else "running"
        )
        self._running[execution_id] = execution
        self._recent.pop(execution_id, None)
        return execution

    def finish(self, execution: Execution) -> None:
        """Forget a finished turn; its id may be re-issued from now on."""
        if self._running.get(execution.execution_id) is execution:
            del self._running[execution.execution_id]
        self._recent[execution.execution_id] = None
        while len(self._recent) > RECENT_LIMIT:
            self._recent.popitem(last=False)
        self._recent_progress.pop(execution.execution_id, None)
        self._recent_progress[execution.execution_id] = execution.progress
        while len(self._recent_progress) > RECENT_PROGRESS_LIMIT:
            self._recent_progress.popitem(last=False)
        execution.done.set()

    def holds(self, execution_id: str) -> bool:
        """True while a turn of this id is running or queued."""
        return execution_id in self._running

    def running(self) -> list[Execution]:
        """The turns running now, oldest first."""
        return sorted(self._running.values(), key=lambda e: e.started)

    def recently_completed(self) -> list[str]:
        """Ids of the most recently finished turns, newest last."""
        return list(self._recent)

    def progress(self, execution_id: str) -> Progress | None:
        """The events of a running turn, or of one of the last finished ones."""
        execution = self._running.get(execution_id)
        if execution is not None:
            return execution.progress
        return self._recent_progress.get(execution_id)

    def __len__(self) -> int:
        return len(self._running)

    def terminate(self, execution_id: str) -> str:
        """Stop a running turn: `terminated`, `already_finished`, or NotFound."""
        execution = self._running.get(execution_id)
        if execution is None:
            if execution_id in self._recent:
                return "already_finished"
            msg = f"no execution {execution_id}"
            raise NotFound(msg)
        execution.terminated = True
        execution.cancel.set()
        return "terminated"

    async def drain(self, grace_s: float) -> None:
        """Stop accepting; let running turns finish for `grace_s`, then kill the rest."""
        self.accepting = False
        running = list(self._running.values())
        if not running:
            return
        logger.info("shutdown: waiting up to %ss for %d running turns", grace_s, len(running))
        pending = [asyncio.ensure_future(e.done.wait()) for e in running]
        _, late = await asyncio.wait(pending, timeout=grace_s if math.isfinite(grace_s) else None)
        for execution in running:
            if not execution.done.is_set():
                logger.warning("shutdown: killing turn %s", execution.execution_id)
                execution.shut_down = True
                execution.cancel.set()
        if late:
            await asyncio.wait(late, timeout=SHUTDOWN_MARGIN_S)
        for task in pending:
            task.cancel()
