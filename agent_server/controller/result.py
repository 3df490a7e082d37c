"""What one walk did: each attempt, in order, and how the turn ended."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from agent_server.controller.errors import AgentError
from agent_server.controller.pool.state import CredentialKind, ScheduledRetry
from agent_server.wire.instants import format_instant
from agent_server.wire.turns import TurnResponse

WalkOutcome = Literal["served", "waiting_for_capacity", "failed", "out_of_time", "stopped"]
"""served: a credential served the turn; waiting_for_capacity: every credential is
exhausted and one retry is scheduled; failed: an answer no other credential would
change (a model rejection, a timeout, an upstream fault, a refusal of the server's);
out_of_time: the turn's remaining time no longer covers another attempt; stopped: an
operator stopped the agent while it walked (`Walker.stop`)."""


@dataclass(frozen=True)
class Attempt:
    """One rung tried: the credential it was sent with, and how it ended."""

    credential_id: str | None
    """None: the server ran a credential the pool does not know (nobody is blamed)."""
    kind: CredentialKind | None
    status: int
    error_code: str | None
    """None: it served."""
    resets_at: datetime | None = None

    def as_json(self) -> dict[str, Any]:
        """`{credential, error_code, resets_at}`, as `pool walk --json` prints it."""
        return {
            "credential": self.credential_id,
            "kind": self.kind,
            "status": self.status,
            "error_code": self.error_code,
            "resets_at": format_instant(self.resets_at),
        }

    def label(self) -> str:
        """`A (rate limit)`, `platform API key (billing)`: one step of the trail's text."""
        names = {"api_key": "platform API key", "gateway": f"gateway {self.credential_id}"}
        name = names.get(self.kind or "", self.credential_id or "the server's own credential")
        said = "served" if self.error_code is None else self.error_code.replace("_", " ")
        return f"{name} ({said})"


@dataclass(frozen=True)
class WalkResult:
    """How the turn ended, and every attempt on the way, in order."""

    agent: str
    execution_id: str
    outcome: WalkOutcome
    status: int | None
    """The last answer's HTTP status (None when nothing was sent)."""
    served_by: str | None
    committed: bool
    """The serving subscription became the agent's assignment (store and server)."""
    trail: tuple[Attempt, ...]
    earliest_reset: datetime | None = None
    retry: ScheduledRetry | None = None
    legacy: bool = False
    """The server ignored the override (no `X-Trinity-Auth-Override`): walked once."""
    answer: TurnResponse | None = None
    error: AgentError | None = None

    def trail_text(self) -> str:
        """`A (rate limit) -> B (auth) -> platform API key (billing)`."""
        return " -> ".join(attempt.label() for attempt in self.trail)

    def as_json(self) -> dict[str, Any]:
        """What `pool walk --json` prints."""
        return {
            "agent": self.agent,
            "execution_id": self.execution_id,
            "outcome": self.outcome,
            "status": self.status,
            "served_by": self.served_by,
            "committed": self.committed,
            "legacy": self.legacy,
            "trail": [attempt.as_json() for attempt in self.trail],
            "earliest_reset": format_instant(self.earliest_reset),
            "retry_at": format_instant(self.retry.due_at) if self.retry else None,
            "response": self.answer.response if self.answer else None,
            "error": self.error.message if self.error else None,
        }
