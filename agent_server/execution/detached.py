"""An async turn (contract §6.8): accepted now, run detached, its envelope sent by callback."""

from __future__ import annotations

import logging
import time
from typing import Any

from agent_server.errors import ApiError
from agent_server.execution.ask import AcceptedTurn, TurnAsk
from agent_server.execution.turn import TurnRunner
from agent_server.process.timings import CALLBACK_LEASE_GRACE_S
from agent_server.records.results import Results

logger = logging.getLogger("agent_server.executions")


def detach(turns: TurnRunner, results: Results, ask: TurnAsk) -> AcceptedTurn | None:
    """Accept `ask` (its refusals raise now) and run it detached, its envelope sent by
    callback. None, and an INFO line saying why, when it cannot be: no callback is
    configured, or it names no execution id to be known by; its caller runs it in-line."""
    if results.callbacks is None or ask.execution_id is None:
        logger.info(
            "async_result asked, answered synchronously: %s",
            "no execution_id" if results.callbacks is not None else "no callback configured",
        )
        return None
    accepted = turns.accept(ask)
    deadline = time.time() + ask.timeout_s + CALLBACK_LEASE_GRACE_S
    results.background(_run_detached(turns, results, accepted, deadline))
    return accepted


async def _run_detached(
    turns: TurnRunner, results: Results, accepted: AcceptedTurn, deadline: float
) -> None:
    """Run an async turn to its envelope, then send it to the controller."""
    try:
        _, envelope = await turns.conclude(accepted)  # a refusal after the 202 is settled too
    except Exception:  # a bug: still tell the controller the turn is over
        logger.exception("async turn failed", extra={"execution_id": accepted.execution_id})
        envelope = _internal_error(results, accepted)
    await results.send(envelope, deadline)


def _internal_error(results: Results, accepted: AcceptedTurn) -> dict[str, Any]:
    """The 500 envelope of a turn that raised where no turn should."""
    return results.settle(
        accepted.execution_id,
        500,
        {"detail": ApiError("internal error").body()},
        auth_route=accepted.credential.auth_route,
        elapsed_ms=0,
    )
