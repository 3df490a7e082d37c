"""The walker: one front door for a fleet of agents, each reached through its own client.

    walker = Walker({"agent-1": client_1, "agent-2": client_2}, store, pool)
    result = await walker.walk(WalkTurn(agent="agent-1", message="fix the test"))

A walker is given the client of each agent (a mapping, or a callable that returns the
client of an agent's name), so a turn, an assignment and a reload always reach the
server of the agent they name. Each turn's walk (`walk.Walk`) is handed exactly what
it works with: that agent's client, the store, the pool, the announcer and the clocks.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Mapping
from datetime import timedelta

from agent_server.controller.client import AgentClient
from agent_server.controller.clock import Clock, utc_now
from agent_server.controller.commit import STABILIZE_S, Assignments
from agent_server.controller.errors import ControllerError, PoolFileError, UnknownAgent
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
        stabilize_s: float = STABILIZE_S,
    ) -> None:
        self.store = store
        self.pool = pool
        self.clock = clock
        self.monotonic = monotonic
        self.announce = Announcer(hook, clock)
        self.assignments = Assignments(store, self.announce)
        self.stabilize_s = stabilize_s
        self._clients = clients
        self._stops: dict[str, int] = {}
        """A count of stops by agent: a walk started before the latest stop of its agent
        is superseded (it sends nothing more and commits nothing)."""
        self._in_flight: dict[str, set[str]] = {}
        """The execution ids of the walks in flight, by agent (to terminate on a stop)."""

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
        agent = turn.agent
        stops = self._stops.get(agent, 0)
        walk = Walk(
            turn,
            client=self.client_of(agent),
            store=self.store,
            pool=self.pool,
            assignments=self.assignments,
            announce=self.announce,
            monotonic=self.monotonic,
            stabilize=timedelta(seconds=self.stabilize_s),
            stopped=lambda: self._stops.get(agent, 0) != stops,
        )
        flying = self._in_flight.setdefault(agent, set())
        flying.add(walk.execution_id)
        try:
            return await walk.run()
        finally:
            flying.discard(walk.execution_id)

    async def assign(self, agent: str, credential_id: str) -> Assignment:
        """Assign a subscription by hand, on the agent's own server. The operator's choice
        wins: the next turn goes to it first even if it failed recently (the skip list does
        not second-guess it), and it supersedes the turns the agent waits with."""
        credential = self.pool.get(credential_id)
        if credential is None or credential.kind != "subscription":
            msg = f"{credential_id!r} is no subscription of the pool"
            raise PoolFileError(msg)
        made = await self.assignments.by_hand(self.client_of(agent), agent, credential)
        await self._drop_waiting(agent, "a manual assignment")
        return made

    async def stop(self, agent: str) -> int:
        """Stop the agent: cancel its waiting turns' retries and every walk of it in flight
        (the server's turn is terminated; a late answer changes nothing, as the assignment's
        generation moved on). How many waiting turns were cancelled."""
        current = await self.store.assignment(agent)
        if current is not None:  # a walk in flight (here or elsewhere) loses its commit
            await self.store.compare_and_set_assignment(
                agent,
                current.credential_id,
                expected_generation=current.generation,
                at=current.assigned_at,  # the same choice, as old: no operator's word
            )
        self._stops[agent] = self._stops.get(agent, 0) + 1
        for execution_id in list(self._in_flight.get(agent, ())):
            with contextlib.suppress(ControllerError):
                await self.client_of(agent).terminate(execution_id)
        return await self._drop_waiting(agent, "stopped by hand")

    async def clear(self, credential_id: str) -> None:
        """Forget a credential's failures (its token was rotated): it is offered again."""
        if self.pool.get(credential_id) is None:
            msg = f"{credential_id!r} is not in the pool"
            raise PoolFileError(msg)
        await self.store.clear_failures(credential_id)
        self.announce(WalkPhase.CLEARED, "", credential_id=credential_id)

    async def _drop_waiting(self, agent: str, why: str) -> int:
        dropped = 0
        for retry in (await self.store.snapshot()).retries_of(agent):
            if await self.store.take_retry(retry.turn_ref, retry.retry_id):
                dropped += 1
                self.announce(WalkPhase.SUPERSEDED, agent, note=f"turn {retry.turn_ref}: {why}")
        return dropped
