"""Each agent's liveness: the heartbeat its server POSTs (`records/heartbeat.py` sends it).

The body is agent-side output and checked as hostile: a bounded size, known keys only,
bounded strings and counts. What an instance received is kept in memory, by agent
(the latest beat), and shown in `/v1/pool` and as `heartbeat` events; a heartbeat goes
to the instance its server reaches, so another instance shows the agent once a beat of
it arrives there (`docs/pool-service.md`, "Across instances").
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


class Liveness:
    """The latest beat of each agent, as this instance received them."""

    def __init__(self) -> None:
        self._beats: dict[str, Beat] = {}

    def receive(self, agent: str, body: HeartbeatBody, at: datetime) -> Beat:
        """Keep `body` as the agent's latest beat."""
        beat = Beat(agent, at, body)
        self._beats[agent] = beat
        return beat

    def of(self, agent: str) -> Beat | None:
        """The agent's latest beat, if one arrived."""
        return self._beats.get(agent)

    @property
    def agents(self) -> list[str]:
        """The agents a beat arrived from."""
        return sorted(self._beats)
