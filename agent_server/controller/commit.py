"""How an agent's assignment changes: by compare-and-set in the store, then on its server.

The store decides: of two workers committing at once exactly one wins its
compare-and-set, and the loser changes nothing, neither the store nor the server
(`commit_lost`). The winner then reloads the agent's own server with
`expected_generation`; if that server's credential changed meanwhile, the store keeps
the commit and the server is left as it is (the walk sends an override on every turn).
A new commit is stabilizing for a short window (warden's recovery).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from agent_server.controller.client import AgentClient
from agent_server.controller.errors import GenerationMismatch, StoreError
from agent_server.controller.events import Announcer, WalkPhase
from agent_server.controller.pool.file import PoolCredential
from agent_server.controller.pool.state import Assignment
from agent_server.controller.stores.base import PoolStore

STABILIZE_S = 10.0
"""How long a newly committed credential is stabilizing (warden's window), unless a turn
that started after the commit is served on it first."""


def stabilizing(
    assignment: Assignment | None, credential_id: str, now: datetime, window: timedelta
) -> bool:
    """`credential_id` is the assignment, committed less than `window` ago: a refusal of
    it now is an `immediate_hard_limit`."""
    if assignment is None or assignment.credential_id != credential_id:
        return False
    # Generation 1 is an agent's first assignment, no commit: nothing to stabilize.
    return assignment.generation > 1 and now - assignment.assigned_at < window


@dataclass(frozen=True)
class Assignments:
    """The one way a walker changes an agent's assignment (module docstring)."""

    store: PoolStore
    announce: Announcer

    async def commit(
        self,
        client: AgentClient,
        agent: str,
        credential: PoolCredential,
        *,
        expected_generation: int | None,
        server_generation: int | None,
    ) -> Assignment | None:
        """Make `credential` the agent's assignment if the store's generation is still
        `expected_generation`; then reload the agent's server. None: another won."""
        made = await self.store.compare_and_set_assignment(
            agent, credential.id, expected_generation=expected_generation, at=self.announce.clock()
        )
        if made is None:
            self.announce(WalkPhase.COMMIT_LOST, agent, credential_id=credential.id)
            return None
        note = None
        try:
            await client.reload_token(
                credential.secret, remove_api_key=True, expected_generation=server_generation
            )
        except GenerationMismatch:
            note = "the server's credential changed meanwhile: it was left as it is"
        self.announce(WalkPhase.COMMITTED, agent, credential_id=credential.id, note=note)
        return made

    async def first(self, agent: str, credential_id: str) -> Assignment:
        """Assign an agent that has none; the one a peer made meanwhile when it lost."""
        made = await self.store.compare_and_set_assignment(
            agent, credential_id, expected_generation=None, at=self.announce.clock()
        )
        current = made or await self.store.assignment(agent)
        if current is None:
            msg = f"the assignment of {agent} vanished while it was made"
            raise StoreError(msg)
        return current

    async def by_hand(
        self, client: AgentClient, agent: str, credential: PoolCredential
    ) -> Assignment:
        """An operator's choice: it wins over whatever the agent had (retried until the
        compare-and-set holds), then the agent's server is reloaded."""
        while True:
            current = await self.store.assignment(agent)
            expected = current.generation if current else None
            made = await self.store.compare_and_set_assignment(
                agent, credential.id, expected_generation=expected, at=self.announce.clock()
            )
            if made is not None:
                break
        await client.reload_token(credential.secret, remove_api_key=True)
        self.announce(WalkPhase.ASSIGNED, agent, credential_id=credential.id)
        return made
