"""The turns posted to this instance: the request's shape, and the async ones' results.

A turn's request is checked before anything runs (a bad one is a 422 that changes
nothing). An async turn (`async: true`) runs in a task of this instance; its result
is kept for `RESULT_TTL` (at most `MAX_KEPT` turns) and read at `/v1/turns/{id}`.
A turn that waits for capacity keeps its request in the store beside its retry
(`ScheduledRetry.request`), so whichever instance claims the retry runs it.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from agent_server.controller.pool.state import ScheduledRetry
from agent_server.controller.result import WalkResult
from agent_server.controller.turn import WalkTurn
from agent_server.wire.values import EXECUTION_ID_PATTERN

MAX_MESSAGE_CHARS = 1_000_000
MAX_BODY_BYTES = 4 * MAX_MESSAGE_CHARS + 4096
"""A request's body, read whole only under this bound (a message of 1 M characters)."""
RESULT_TTL_S = 3600.0
MAX_KEPT = 1000


class TurnRequest(BaseModel):
    """`POST /v1/agents/{agent}/turns`'s body (and a waiting turn's kept request)."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    message: Annotated[str, Field(min_length=1, max_length=MAX_MESSAGE_CHARS)]
    execution_id: Annotated[str, Field(pattern=EXECUTION_ID_PATTERN)] | None = None
    interactive: bool = False
    timeout_s: Annotated[float, Field(gt=0, le=86_400)] = 900.0
    run_async: bool = Field(default=False, alias="async")

    def turn(self, agent: str, execution_id: str, *, rerun: bool = False) -> WalkTurn:
        """The walk's turn for `agent`, under `execution_id`."""
        return WalkTurn(
            agent=agent,
            message=self.message,
            interactive=self.interactive,
            execution_id=execution_id,
            timeout_s=self.timeout_s,
            rerun=rerun,
        )


def keep_request(retry: ScheduledRetry, request: TurnRequest) -> ScheduledRetry:
    """`retry` carrying `request`, so whichever `pool serve` claims it can run the turn."""
    return replace(retry, request=request.model_dump_json(by_alias=True))


def new_execution_id() -> str:
    """An execution id for a turn posted without one."""
    return f"walk-{uuid.uuid4().hex[:16]}"


@dataclass
class _Kept:
    task: asyncio.Task[WalkResult] | None
    result: WalkResult | str | None = None
    """The walk's result, or the name of the error that ended it."""
    ended: float = field(default=0.0)


class TurnBook:
    """The async turns of this instance, running and done, by execution id."""

    def __init__(self, monotonic: Callable[[], float] = time.monotonic) -> None:
        self._kept: OrderedDict[str, _Kept] = OrderedDict()
        self._monotonic = monotonic

    def running(self, execution_id: str) -> bool:
        """The turn runs here now."""
        kept = self._kept.get(execution_id)
        return kept is not None and kept.result is None

    def start(self, execution_id: str, work: Awaitable[WalkResult]) -> None:
        """Run `work` as the turn `execution_id` in the background."""
        self._prune()
        task = asyncio.ensure_future(work)
        self._kept[execution_id] = _Kept(task)
        task.add_done_callback(lambda done: self._finish(execution_id, done))

    def record(self, result: WalkResult) -> None:
        """Keep a result that ended here (a retry's run, a sync turn that waits)."""
        self._prune()
        self._kept[result.execution_id] = _Kept(None, result, self._monotonic())

    def _finish(self, execution_id: str, task: asyncio.Task[WalkResult]) -> None:
        kept = self._kept.get(execution_id)
        if kept is None or kept.task is not task:
            return
        if task.cancelled():
            del self._kept[execution_id]  # cut short at shutdown: handed over as a retry
            return
        error = task.exception()
        # An error's name only (its text may quote the agent's server): the log has the rest.
        kept.result = task.result() if error is None else type(error).__name__
        kept.ended = self._monotonic()

    def state(self, execution_id: str) -> WalkResult | str | None:
        """A done turn's result, the name of the error that ended it, or None while it runs.
        `KeyError` when this instance knows no such turn."""
        return self._kept[execution_id].result

    def unfinished(self) -> list[asyncio.Task[WalkResult]]:
        """The tasks still running."""
        return [k.task for k in self._kept.values() if k.task is not None and not k.task.done()]

    def _prune(self) -> None:
        now = self._monotonic()
        for execution_id, kept in list(self._kept.items()):
            expired = kept.result is not None and now - kept.ended > RESULT_TTL_S
            if expired or (len(self._kept) >= MAX_KEPT and kept.result is not None):
                del self._kept[execution_id]
