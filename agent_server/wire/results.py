"""What outlives a turn on the wire (contract §6.6-§6.8): the result envelope of a
callback, a retained result, and one live event."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from agent_server.wire.names import AuthRoute
from agent_server.wire.turns import TurnMetadata


class ResultEnvelope(BaseModel):
    """A turn's terminal answer in the shape of Trinity's result callback (contract §6.6)."""

    model_config = ConfigDict(extra="forbid")

    execution_id: str
    status: Literal["success", "failed", "cancelled"]
    response: str | None
    response_truncated: bool
    """The response was longer than the 4,000,000 characters the callback takes."""
    error: str | None
    """A failure's message, at most 500 characters."""
    error_code: str | None
    """A failure's code in Trinity's vocabulary (contract §6.8)."""
    terminal_reason: str
    session_id: str | None
    metadata: TurnMetadata | None
    execution_log: list[Any] | None
    truncated_log: bool
    """The execution log was over 16,000,000 bytes and is left out."""
    execution_time_ms: int
    auth_route: AuthRoute
    """The override that served the turn, as `X-Trinity-Auth-Override` would say."""
    http_status: int
    """The status the turn's synchronous answer has."""
    detail: dict[str, Any] | None
    """A failure's §7 detail without `metadata` and `execution_log`."""


class RetainedResult(ResultEnvelope):
    """`GET /api/executions/{id}/result`: the envelope and when it was kept."""

    retained_at: str


class LiveEvent(BaseModel):
    """One server-sent event of `…/events` or `…/stream` (contract §6.7)."""

    event: str | None = None
    """The CLI event's `type` (`…/events` only); `terminal` last."""
    id: str | None = None
    """Its sequence number, from 1 (`…/events` only)."""
    data: str
    """The CLI's line (JSON), or the terminal's JSON."""
    retry: int | None = None
