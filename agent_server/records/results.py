"""Where a turn's terminal answer goes besides its HTTP answer (contract §6.6, §6.8).

Every terminal answer becomes an envelope, redacted like the answer itself, and is
retained on disk in the background, by one thread of its own: records are written
one after another, and the loop shares the GIL and the CPUs with that one thread
however many turns end at once. Until its write lands, the envelope is served from
memory, so a result asked for right after its answer is that answer's (read your
writes). An async turn's envelope is also persisted as pending and delivered to the
controller. Nothing here can fail a turn, and nothing is lost silently: what the
shutdown leaves unwritten is logged and counted.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Coroutine
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

from agent_server.metrics import Metrics
from agent_server.records.callback import CallbackSender
from agent_server.records.envelope import bound_log, envelope_of
from agent_server.records.retained import RecordReader, RetainedResults
from agent_server.redaction.redactor import Redactor
from agent_server.secret_file import compact_json
from agent_server.wire.names import AuthRoute

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
        self._unwritten: dict[str, dict[str, Any]] = {}
        """Settled records whose write has not landed yet, by execution id."""
        self._unsent: set[str] = set()
        """Async turns whose callback is not persisted yet."""

    def settle(
        self,
        execution_id: str,
        status: int,
        body: dict[str, Any],
        *,
        auth_route: AuthRoute,
        elapsed_ms: int,
    ) -> dict[str, Any]:
        """The envelope of a terminal answer (not yet redacted: the record and `send` are,
        in a thread); served from memory at once, retained from the loop's next step.

        Nothing of it is done in front of the HTTP answer: the answer is serialised and
        written in this step of the loop, the envelope's redaction and file after it.
        """
        envelope = envelope_of(
            execution_id, status, body, auth_route=auth_route, elapsed_ms=elapsed_ms
        )
        record = {**envelope, "retained_at": datetime.now(UTC).isoformat()}
        self._unwritten[execution_id] = record
        asyncio.get_running_loop().call_soon(self._start_retention, execution_id, record)
        return envelope

    def unwritten(self, execution_id: str) -> dict[str, Any] | None:
        """The record of `execution_id` settled but not on disk yet, as it will be written
        but for the redaction the answer gate does (its log bounded: blocking work for a
        large log, run it in a thread)."""
        record = self._unwritten.get(execution_id)
        return bound_log(record) if record is not None else None

    def reader(self, execution_id: str) -> RecordReader | None:
        """The retained record of `execution_id` on disk (blocking: run it in a thread)."""
        return self.retained.reader(execution_id)

    def get(self, execution_id: str) -> dict[str, Any] | None:
        """The record of `execution_id`, parsed: from memory, else from disk (blocking: for
        tests and tools; the route streams the file)."""
        return self.unwritten(execution_id) or self.retained.get(execution_id)

    async def send(self, envelope: dict[str, Any], deadline: float) -> None:
        """Persist an async turn's envelope as pending, then deliver it in the background."""
        if self.callbacks is None:
            return
        execution_id = envelope["execution_id"]
        self._unsent.add(execution_id)
        try:
            body = await asyncio.to_thread(self._body, execution_id, envelope)
            try:
                await self.callbacks.persist(execution_id, body, deadline)
            except OSError as exc:  # still try to deliver what is in memory
                logger.warning(
                    "could not persist the pending result (%s): a restart before delivery loses it",
                    exc,
                    extra={"execution_id": execution_id},
                )
        finally:
            self._unsent.discard(execution_id)
        self.callbacks.deliver_later(execution_id, body, deadline)

    def sweep(self) -> None:
        """At boot: what a crash left half-written goes, the directories get their bounds
        (blocking: run it in a thread)."""
        self.retained.files.sweep()
        if self.callbacks is not None:
            self.callbacks.pending.files.sweep()

    def background(self, work: Coroutine[Any, Any, None]) -> None:
        """Run `work` in the background; `close` waits for it."""
        task = asyncio.create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def close(self, budget_s: float) -> None:
        """Let retention and deliveries in flight finish within `budget_s`, then stop them
        (an undelivered result stays pending for the next start). What never reached the
        disk is logged at WARNING and counted."""
        deadline = time.monotonic() + budget_s
        await asyncio.sleep(0)  # a retention `settle` scheduled starts first
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=budget_s)
        unwritten, unsent = sorted(self._unwritten), sorted(self._unsent)
        for task in list(self._tasks):
            task.cancel()
        self._writer.shutdown(wait=False, cancel_futures=True)
        if unwritten:
            self.metrics.retention_failures.inc(len(unwritten))
            logger.warning(
                "shutdown: %d answered turn(s) not retained before exit: %s",
                len(unwritten),
                ", ".join(unwritten),
            )
        if unsent:
            self.metrics.callbacks.labels(result="lost").inc(len(unsent))
            logger.warning(
                "shutdown: %d async result(s) neither persisted nor delivered: %s",
                len(unsent),
                ", ".join(unsent),
            )
        if self.callbacks is not None:
            await self.callbacks.close(max(0.0, deadline - time.monotonic()))

    def _start_retention(self, execution_id: str, record: dict[str, Any]) -> None:
        self.background(self._retain(execution_id, record))

    async def _retain(self, execution_id: str, record: dict[str, Any]) -> None:
        def keep() -> None:
            self.retained.keep(self._ready(execution_id, record))

        try:
            await asyncio.get_running_loop().run_in_executor(self._writer, keep)
        except (OSError, ValueError) as exc:
            self.metrics.retention_failures.inc()
            logger.warning(
                "could not retain the result: %s", exc, extra={"execution_id": execution_id}
            )
        if self._unwritten.get(execution_id) is record:  # not a later run's of the same id
            del self._unwritten[execution_id]

    def _ready(self, execution_id: str, envelope: dict[str, Any]) -> dict[str, Any]:
        """`envelope` redacted like an answer, its log bounded (blocking: run it in a thread).

        The id stays as it is: it names the record, and no `.env` value may unname it."""
        clean: dict[str, Any] = self.redactor.clean(envelope)
        if clean is not envelope:
            clean = {**clean, "execution_id": execution_id}
        return bound_log(clean)

    def _body(self, execution_id: str, envelope: dict[str, Any]) -> bytes:
        """The callback's body: the envelope, ready, as compact UTF-8 JSON."""
        return compact_json(self._ready(execution_id, envelope)).encode()
