"""The pool's shared state: the store protocol, and `open_store` for a store URL.

A store keeps, and a walk reads in one snapshot:

- credentials by id (their kind; never a secret);
- each agent's assignment with a generation, changed only by compare-and-set, so of
  two workers committing at once exactly one wins and the other changes nothing;
- failures: the latest of each kind (`rate_limit`, `auth`, `billing`) a credential,
  with its instant and reset (an older one never replaces a newer one);
- readings: the latest of each credential, with the instant it was taken;
- each agent's gateway cooldown (the switch-back's due time);
- every waiting turn's retry, keyed by turn: claimed atomically before it runs (so two
  controllers never both run it), and removed once it ran; a claim carries a lease,
  after which a controller that died holding it is taken to have died;
- each agent's latest heartbeat (its instant and its checked JSON body), so every
  `pool serve` instance shows every agent's liveness;
- leases: each credential's turns in flight across the fleet, one a holder with an
  expiry, taken only under the credential's ceiling (so of N racing holders exactly
  the ceiling's worth win), renewed while a turn runs, released at its end; a lease
  whose holder died ends at its expiry.

Two implementations pass one test suite: SQLite (`sqlite:///PATH`, the embedded
default) and Redis (`redis://HOST:PORT/DB`, for several workers or hosts).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import Protocol

from agent_server.controller.errors import StoreError
from agent_server.controller.pool.state import (
    Assignment,
    CredentialInfo,
    Failure,
    PoolSnapshot,
    Reading,
    ScheduledRetry,
)

SQLITE_PREFIX = "sqlite:///"
REDIS_PREFIXES = ("redis://", "rediss://", "unix://")


class PoolStore(Protocol):
    """Where a controller keeps its pool's state (module docstring)."""

    async def register_credentials(self, infos: Sequence[CredentialInfo]) -> None:
        """Record these credentials (id and kind); others already known stay."""

    async def credentials(self) -> list[CredentialInfo]:
        """Every credential registered, by id."""

    async def snapshot(self) -> PoolSnapshot:
        """Assignments, failures, readings, cooldowns and retries, read at once."""

    async def assignment(self, agent: str) -> Assignment | None:
        """The agent's assignment, if it has one."""

    async def compare_and_set_assignment(
        self, agent: str, credential_id: str, *, expected_generation: int | None, at: datetime
    ) -> Assignment | None:
        """Assign `credential_id` if the agent's generation is still `expected_generation`
        (None: it has no assignment); the new assignment, or None when another won."""

    async def record(
        self, *, reading: Reading | None = None, failure: Failure | None = None
    ) -> None:
        """Keep what one answer said of a credential, in one write: `reading` as its
        latest and `failure` as its latest of that kind, each unless a newer one is."""

    async def set_gateway_until(self, agent: str, until: datetime | None) -> None:
        """Send the agent's turns to the gateway first until `until` (None: no longer)."""

    async def schedule_retry(self, retry: ScheduledRetry) -> None:
        """Make `retry` its turn's retry (replacing an older one of that turn, and its claim)."""

    async def claim_retry(
        self, turn_ref: str, retry_id: str, *, at: datetime, until: datetime
    ) -> bool:
        """Claim the turn's retry until `until` if it is still `retry_id` and no claim on it
        is held at `at` (one whose lease ended counts as none): True for the one claimant. The
        retry stays in the store until `take_retry`."""

    async def take_retry(self, turn_ref: str, retry_id: str) -> bool:
        """Remove the turn's retry (and its claim) if it is still `retry_id`; True for the
        one taker."""

    async def acquire_lease(
        self, credential_id: str, holder: str, *, ceiling: int, at: datetime, until: datetime
    ) -> bool:
        """Take a lease on the credential for `holder` until `until` if fewer than `ceiling`
        leases are held at `at` (ended ones do not count): True when taken. A holder that
        already holds one has it extended instead (True)."""

    async def renew_lease(
        self, credential_id: str, holder: str, *, at: datetime, until: datetime
    ) -> bool:
        """Extend the holder's lease to `until` if it still holds one at `at`: True if so."""

    async def release_lease(self, credential_id: str, holder: str) -> None:
        """End the holder's lease on the credential (none held: nothing changes)."""

    async def claim_probe(self, credential_id: str, *, at: datetime, spacing: timedelta) -> bool:
        """Record a probe of the credential at `at` unless one was recorded less than
        `spacing` before: True for the prober (atomic across controllers)."""

    async def record_heartbeat(self, agent: str, at: datetime, body: str) -> None:
        """Keep `body` (JSON, checked by the caller) as the agent's latest heartbeat."""

    async def heartbeats(self) -> dict[str, tuple[datetime, str]]:
        """Every agent's latest heartbeat: its instant and its body."""

    async def clear_failures(self, credential_id: str) -> None:
        """Forget every failure of a credential (its token was rotated)."""

    async def close(self) -> None:
        """Release the connection."""


def default_store_url(environ: Mapping[str, str] | None = None) -> str:
    """`sqlite:///` a file under the state dir: `$AGENT_SERVER_STATE_DIR`, else
    `${XDG_STATE_HOME:-~/.local/state}/agent-server`."""
    env = os.environ if environ is None else environ
    state = env.get("AGENT_SERVER_STATE_DIR") or str(
        Path(env.get("XDG_STATE_HOME") or Path.home() / ".local" / "state") / "agent-server"
    )
    return SQLITE_PREFIX + str(Path(state) / "controller.sqlite3")


async def open_store(url: str) -> PoolStore:
    """The store a URL names: `sqlite:///PATH` or `redis://HOST:PORT/DB`."""
    if url.startswith(SQLITE_PREFIX):
        from agent_server.controller.stores.sqlite import SqliteStore

        return await SqliteStore.open(Path(url.removeprefix(SQLITE_PREFIX)))
    if url.startswith(REDIS_PREFIXES):
        from agent_server.controller.stores.redis import RedisStore

        return await RedisStore.open(url)
    msg = "store URL must be sqlite:///PATH or redis://HOST:PORT/DB"
    raise StoreError(msg)
