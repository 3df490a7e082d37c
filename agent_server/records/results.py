"""Where a turn's terminal answer goes besides its HTTP answer (contract §6.6, §6.8).

Every terminal answer becomes an envelope, redacted like the answer itself, and is
retained on disk in the background, by one thread of its own: records are written
one after another, and the loop shares the GIL and the CPUs with that one thread
however many turns end at once. An async turn's envelope is also persisted as
pending and delivered to the controller. Nothing here can fail a turn.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from agent_server.metrics import Metrics
from agent_server.names import AuthRoute
from agent_server.records.callback import CallbackSender
from agent_server.records.envelope import bound_log, envelope_of
from agent_server.records.retained import RetainedResults
from agent_server.redaction import Redactor

logger = logging.getLogger("agent_server.results")


class Results:
    """The retained results, the callbacks (when configured), and their work in flight."""

    def __init__(
        self,
        retained: RetainedResults,
        redactor: Redactor,
        metrics: Metrics,
        callbacks: CallbackSender | None,
    ) -> None:
        self.retained = retained
        self.redactor = redactor
        self.metrics = metrics
        self.callbacks = callbacks
        self._tasks: set[asyncio.Task[None]] = set()
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="retention")

    def settle(
        self,
        execution_id: str,
        status: int,
        body: dict[str, Any],
        *,
        auth_route: AuthRoute,
        elapsed_ms: int,
    ) -> dict[str, Any]:
        """The envelope of a terminal answer (not yet redacted: `send` and the retention
        do it, in a thread); its retention starts at the loop's next step.

        Nothing of it is done in front of the HTTP answer: the answer is serialised and
        written in this step of the loop, the envelope's redaction and file after it.
        """
        envelope = envelope_of(
            execution_id, status, body, auth_route=auth_route, elapsed_ms=elapsed_ms
        )
        asyncio.get_running_loop().call_soon(self._start_retention, execution_id, envelope)
        return envelope

    async def send(self, envelope: dict[str, Any], deadline: float) -> None:
        """Persist an async turn's envelope as pending, then deliver it in the background."""
        if self.callbacks is None:
            return
        bounded = await asyncio.to_thread(self._ready, envelope)
        try:
            await self.callbacks.persist(bounded, deadline)
        except OSError as exc:  # still try to deliver what is in memory
            logger.warning(
                "could not persist the pending result (%s): a restart before delivery loses it",
                exc,
                extra={"execution_id": envelope["execution_id"]},
            )
        self.callbacks.deliver_later(bounded, deadline)

    def get(self, execution_id: str) -> dict[str, Any] | None:
        """The retained record of `execution_id` (blocking: run it in a thread)."""
        return self.retained.get(execution_id)

    def background(self, work: Coroutine[Any, Any, None]) -> None:
        """Run `work` in the background; `close` waits for it."""
        task = asyncio.create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def close(self, budget_s: float) -> None:
        """Let retention and deliveries in flight finish within `budget_s`, then stop them
        (an undelivered result stays pending for the next start)."""
        deadline = time.monotonic() + budget_s
        await asyncio.sleep(0)  # a retention `settle` scheduled starts first
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=budget_s)
        for task in list(self._tasks):
            task.cancel()
        self._writer.shutdown(wait=False, cancel_futures=True)
        if self.callbacks is not None:
            await self.callbacks.close(max(0.0, deadline - time.monotonic()))

    def _start_retention(self, execution_id: str, envelope: dict[str, Any]) -> None:
        self.background(self._retain(execution_id, envelope))

    async def _retain(self, execution_id: str, envelope: dict[str, Any]) -> None:
        def keep() -> None:
            self.retained.keep(execution_id, self._ready(envelope))

        try:
            await asyncio.get_running_loop().run_in_executor(self._writer, keep)
        except (OSError, ValueError) as exc:
            self.metrics.retention_failures.inc()
            logger.warning(
                "could not retain the result: %s", exc, extra={"execution_id": execution_id}
            )

    def _ready(self, envelope: dict[str, Any]) -> dict[str, Any]:
        """`envelope` redacted like an answer, its log bounded (blocking: run it in a thread)."""
        clean: dict[str, Any] = self.redactor.clean(envelope)
        return bound_log(clean)
