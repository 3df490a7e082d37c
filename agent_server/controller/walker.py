"""The walker: one front door for a fleet of agents, each reached through its own client.

    walker = Walker({"agent-1": client_1, "agent-2": client_2}, store, pool)
    result = await walker.walk(WalkTurn(agent="agent-1", message="fix the test"))

A walker is given the client of each agent (a mapping, or a callable that returns the
client of an agent's name), so a turn, an assignment and a reload always reach the
server of the agent they name. Each turn's walk (`walk.Walk`) is handed exactly what
it works with: that agent's client, the store, the pool, the announcer and the clocks.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

from agent_server.controller.client import AgentClient
from agent_server.controller.clock import Clock, utc_now
from agent_server.controller.commit import Assignments
from agent_server.controller.errors import PoolFileError, UnknownAgent
from agent_server.controller.events import Announcer, EventHook, WalkPhase
from agent_server.controller.pool.file import Pool
from agent_server.controller.pool.state import Assignment
from agent_server.controller.result import WalkResult
from agent_server.controller.stores.base import PoolStore
from agent_server.controller.turn import WalkTurn
from agent_server.controller.walk import Walk

AgentClients = Mapping[str, AgentClient] | Callable[[str], AgentClient]
"""The client of each agent: by name, or a callable that returns one for a name."""


class Walker:
    """Runs the turns of a fleet's agents through the walk (module docstring)."""

    def __init__(
        self,
        clients: AgentClients,
        store: PoolStore,
        pool: Pool,
        *,
        clock: Clock = utc_now,
        hook: EventHook | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self.pool = pool
        self.clock = clock
        self.monotonic = monotonic
        self.announce = Announcer(hook, clock)
        self.assignments = Assignments(store, self.announce)
        self._clients = clients

    def client_of(self, agent: str) -> AgentClient:
        """The client of `agent`'s server; `UnknownAgent` when the walker has none."""
        if isinstance(self._clients, Mapping):
            client = self._clients.get(agent)
        else:
            client = self._clients(agent)
        if client is None:
            msg = f"the walker has no client for agent {agent!r}"
            raise UnknownAgent(msg)
        return client

    async def walk(self, turn: WalkTurn) -> WalkResult:
        """Run `turn` through the ladder on its agent's server; never raises for a
        credential's refusal."""
        walk = Walk(
            turn,
            client=self.client_of(turn.agent),
            store=self.store,
            pool=self.pool,
            assignments=self.assignments,
            announce=self.announce,
            monotonic=self.monotonic,
        )
        return await walk.run()

    async def assign(self, agent: str, credential_id: str) -> Assignment:
        """Assign a subscription by hand, on the agent's own server: it supersedes a
        retry the agent waits for."""
        credential = self.pool.get(credential_id)
        if credential is None or credential.kind != "subscription":
            msg = f"{credential_id!r} is no subscription of the pool"
            raise PoolFileError(msg)
        made = await self.assignments.by_hand(self.client_of(agent), agent, credential)
        waiting = (await self.store.snapshot()).retries.get(agent)
        if waiting is not None and await self.store.take_retry(agent, waiting.retry_id):
            self.announce(WalkPhase.SUPERSEDED, agent, note="a manual assignment")
        return made
