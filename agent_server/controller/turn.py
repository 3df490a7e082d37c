"""What one walk is asked to do: the agent, the prompt, and how much time it has."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from agent_server.wire.turns import ParallelTaskRequest

if TYPE_CHECKING:
    from agent_server.controller.pool.file import PoolCredential


@dataclass(frozen=True)
class WalkTurn:
    """One turn for the walk: the agent, the prompt, and how much time it has in all."""

    agent: str
    message: str
    interactive: bool = False
    """A person waits for it: a last resort may be any skipped subscription."""
    execution_id: str | None = None
    """Re-issued unchanged on every rung; generated when None."""
    timeout_s: float = 900.0
    """The whole walk's time; each attempt gets what is left (less a settle margin)."""
    model: str | None = None
    system_prompt: str | None = None
    rerun: bool = False
    """It may have run already (a retry re-armed after its controller died): the server's
    retained result of `execution_id` is read first, and a served turn is not run again."""

    def request(
        self, execution_id: str, timeout_s: float, credential: PoolCredential | None
    ) -> ParallelTaskRequest:
        """The turn's request for one attempt: `credential` as its override (None: the
        server's own), `timeout_s` what is left of the walk's time."""
        return ParallelTaskRequest(
            message=self.message,
            execution_id=execution_id,
            timeout_seconds=max(1, int(timeout_s)),
            model=self.model,
            system_prompt=self.system_prompt,
            auth_override=credential.override() if credential is not None else None,
        )
