"""A controller process that runs the retries of one store, to be killed mid-walk.

    python -m tests.support.retry_controller STORE_URL AGENT_URL AGENT LEASE_S

The pool is one subscription `a` whose secret is `$RETRY_CONTROLLER_A`. It arms every
retry in the store and re-runs each due turn (`rerun=True`) on the agent's server,
printing `claimed` when a walk starts, then waits to be killed.
"""

from __future__ import annotations

import asyncio
import os
import sys
from datetime import timedelta

from pydantic import SecretStr

from agent_server.controller import (
    AgentClient,
    PoolCredential,
    RetryScheduler,
    ScheduledRetry,
    Walker,
    WalkResult,
    WalkTurn,
    build_pool,
    open_store,
)
from tests.support.server import CONTROLLER_TOKEN


async def _serve(store_url: str, agent_url: str, agent: str, lease_s: float) -> None:
    pool = build_pool(
        [PoolCredential("a", "subscription", SecretStr(os.environ["RETRY_CONTROLLER_A"]))]
    )
    store = await open_store(store_url)
    client = AgentClient(agent_url, SecretStr(CONTROLLER_TOKEN))
    walker = Walker({agent: client}, store, pool)

    async def run(retry: ScheduledRetry) -> WalkResult:
        print("claimed", retry.turn_ref, flush=True)
        turn = WalkTurn(agent, "again", execution_id=retry.turn_ref, rerun=True, timeout_s=120)
        return await walker.walk(turn)

    scheduler = RetryScheduler(store, run, lease=timedelta(seconds=lease_s))
    await scheduler.arm_all()
    await asyncio.sleep(3600)


if __name__ == "__main__":
    asyncio.run(_serve(sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])))
