"""The gateway's switch-back, run by the service when an agent's cooldown ends.

After the gateway served an agent, its turns go to the gateway first until
`gateway_until` (`pool/waits.switch_back_at`); the walk ends that cooldown only when a
turn comes by and a subscription serves it. The service ends it itself: when the
cooldown has passed, it looks for a subscription that has recovered (no wall, no
recent failure, no fresh refusing reading: what the walk would rank as healthy; the
agent's own assignment first, else the most headroom). Finding one is a probe of it,
spaced like the walk's probes (`claim_probe`: at most one a credential per
`probe_spacing_seconds`, across instances); the move is a compare-and-set of the
agent's assignment, so of several instances exactly one makes it. The cooldown is
then cleared and the agent's next turn goes to that subscription first. With no
subscription recovered, the cooldown is pushed to when one is next offered.

It sends no turn: the probe reads the store's windows and failures (a turn is the
agent's to send), and the server is not reloaded (every walked turn carries its
credential as an override).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta

from agent_server.controller.events import Announcer, WalkPhase
from agent_server.controller.pool.file import Pool
from agent_server.controller.pool.rungs import PoolView
from agent_server.controller.pool.standing import (
    Standing,
    failed_recently,
    fresh_refusal,
    headroom_key,
    walled,
)
from agent_server.controller.pool.state import PoolSnapshot
from agent_server.controller.pool.waits import switch_back_at
from agent_server.controller.stores.base import PoolStore


def recovered(view: PoolView, now: datetime) -> str | None:
    """The subscription the agent goes back to: its assignment if it recovered, else the
    recovered one with the most headroom; None when none has (pure)."""
    healthy = [s for s in view.standings if s.info.kind == "subscription" and _healthy(s, now)]
    assigned = view.assignment.credential_id if view.assignment else None
    for standing in healthy:
        if standing.info.id == assigned:
            return assigned
    healthy.sort(key=lambda s: headroom_key(s, now))
    return healthy[0].info.id if healthy else None


def _healthy(standing: Standing, now: datetime) -> bool:
    return (
        walled(standing, now) is None
        and not failed_recently(standing, now)
        and not fresh_refusal(standing, now)
    )


class SwitchBack:
    """Ends the gateway cooldowns that have passed (module docstring)."""

    def __init__(
        self, store: PoolStore, pool: Pool, announce: Announcer, on_probe: Callable[[], None]
    ) -> None:
        self.store = store
        self.pool = pool
        self.announce = announce
        self.on_probe = on_probe

    async def run_due(self) -> int:
        """Try every agent whose cooldown has passed; how many were switched back here."""
        snapshot = await self.store.snapshot()
        now = self.announce.clock()
        done = 0
        for agent, until in sorted(snapshot.gateway_until.items()):
            if until <= now and await self._one(agent, snapshot, now):
                done += 1
        return done

    async def _one(self, agent: str, snapshot: PoolSnapshot, now: datetime) -> bool:
        view = PoolView.of(self.pool.infos, snapshot, agent, now=now)
        target = recovered(view, now)
        if target is None:
            later = switch_back_at(view.standings, now)
            await self.store.set_gateway_until(agent, later)
            return False
        spacing = timedelta(seconds=self.pool.probe_spacing_seconds)
        if not await self.store.claim_probe(target, at=now, spacing=spacing):
            return False  # probed lately (here, elsewhere, or by a walk): a later tick
        current = snapshot.assignments.get(agent)
        same = current is not None and current.credential_id == target
        made = await self.store.compare_and_set_assignment(
            agent,
            target,
            expected_generation=current.generation if current else None,
            # The same choice keeps its instant: no operator's word, no new commit.
            at=current.assigned_at if same and current else now,
        )
        if made is None:
            return False  # another instance moved it first
        await self.store.set_gateway_until(agent, None)
        self.on_probe()
        note = "the gateway's cooldown ended and the subscription is offered again"
        self.announce(WalkPhase.SWITCHED_BACK, agent, credential_id=target, note=note)
        return True
