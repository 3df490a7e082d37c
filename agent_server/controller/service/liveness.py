"""Each agent's liveness: the heartbeat its server POSTs (`records/heartbeat.py` sends it).

The body is agent-side output and checked as hostile: a bounded size, bounded strings
and counts, unknown keys dropped. The latest beat of each agent is kept, by agent
(the latest beat) in the store, so every instance shows it in `/v1/pool` and
`/metrics`; the instance it reached also pushes it as a `heartbeat` event.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

from agent_server.wire.instants import format_instant

MAX_BODY_BYTES = 64 * 1024
"""A heartbeat is a few hundred bytes; 20 turns of 120-character summaries fit well."""
_TEXT = Annotated[str, Field(max_length=256)]


class RunningTurnBeat(BaseModel):
    """One running turn of the agent, as its heartbeat says."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    execution_id: _TEXT
    tool: _TEXT | None = None
    summary: _TEXT | None = None
    since: _TEXT | None = None


class HeartbeatBody(BaseModel):
    """The heartbeat's body (Trinity's shape)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    memory_mb: Annotated[float, Field(ge=0, le=2**40)] | None = None
    active_executions: Annotated[int, Field(ge=0, le=100_000)] = 0
    uptime_s: Annotated[float, Field(ge=0, le=2**40)] | None = None
    executions: Annotated[list[RunningTurnBeat], Field(max_length=20)] = []


@dataclass(frozen=True)
class Beat:
    """The latest heartbeat of one agent, and when this instance received it."""

    agent: str
    received_at: datetime
    body: HeartbeatBody

    def as_json(self, now: datetime | None = None) -> dict[str, Any]:
        """As `/v1/pool` and the `heartbeat` event show it (`age_s` when `now` is given)."""
        said: dict[str, Any] = {
            "agent": self.agent,
            "received_at": format_instant(self.received_at),
            **self.body.model_dump(mode="json"),
        }
        if now is not None:
            said["age_s"] = round(max(0.0, (now - self.received_at).total_seconds()), 1)
        return said


def beats_of(kept: dict[str, tuple[datetime, str]]) -> dict[str, Beat]:
    """The store's heartbeats (`PoolStore.heartbeats`) as beats; one that no longer parses
    (a store written by another version) is left out."""
    beats = {}
    for agent, (at, body) in kept.items():
        try:
            beats[agent] = Beat(agent, at, HeartbeatBody.model_validate_json(body))
        except ValueError:
            continue
    return beats
