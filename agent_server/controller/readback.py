"""Reading a finished turn back from the server, so that running it again is safe.

A retry runs at least once: a controller that died while its walk ran leaves the turn
to be run again, though the server may have served it. The turn's execution id is the
key: the server retains a finished turn's result (`GET /api/executions/{id}/result`),
and a served one is read back instead of run again.
"""

from __future__ import annotations

from agent_server.controller.client import AgentClient
from agent_server.controller.errors import AgentError
from agent_server.wire.turns import TurnResponse


async def read_back(client: AgentClient, execution_id: str) -> TurnResponse | None:
    """The turn's answer when the server retained it as served; None when it did not
    (never ran, failed, expired, or a server that keeps no results)."""
    try:
        kept = await client.result(execution_id)
    except AgentError:
        return None
    if kept.status != "success" or kept.metadata is None:
        return None
    return TurnResponse(
        status="success",
        response=kept.response or "",
        execution_log=kept.execution_log or [],
        session_id=kept.session_id,
        timestamp=kept.retained_at,
        metadata=kept.metadata,
    )
