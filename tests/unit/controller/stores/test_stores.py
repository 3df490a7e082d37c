"""One suite for both pool stores: SQLite in a temp file, Redis on a real redis-server."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from agent_server.controller.errors import StoreError
from agent_server.controller.pool.state import (
    CredentialInfo,
    Failure,
    Reading,
    ScheduledRetry,
    WindowUse,
)
from agent_server.controller.stores.base import PoolStore, default_store_url, open_store
from tests.support.redis_server import (  # noqa: F401 - fixtures
    redis_server,
    store_url_fixture,
)

pytestmark = pytest.mark.anyio

T0 = datetime(2026, 12, 1, 8, 30, 15, 123456, tzinfo=UTC)
"""An instant with microseconds: a store must give them back exactly."""


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
async def store(store_url: str) -> AsyncIterator[PoolStore]:
    opened = await open_store(store_url)
    try:
        yield opened
    finally:
        await opened.close()


async def test_a_new_agent_is_assigned_once_from_no_assignment(store: PoolStore) -> None:
    """From no assignment (expected None) the first CAS wins at generation 1."""
    assert await store.assignment("agent-1") is None
    made = await store.compare_and_set_assignment(
        "agent-1", "sub-a", expected_generation=None, at=T0
    )
    assert made is not None
    assert (made.credential_id, made.generation, made.assigned_at) == ("sub-a", 1, T0)
    assert await store.assignment("agent-1") == made
    again = await store.compare_and_set_assignment(
        "agent-1", "sub-b", expected_generation=None, at=T0
    )
    assert again is None


async def test_a_stale_generation_changes_nothing(store: PoolStore) -> None:
    """A CAS from a generation that moved on loses and leaves the assignment as it was."""
    await store.compare_and_set_assignment("a", "sub-a", expected_generation=None, at=T0)
    second = await store.compare_and_set_assignment("a", "sub-b", expected_generation=1, at=T0)
    assert second is not None
    assert second.generation == 2
    assert (
        await store.compare_and_set_assignment("a", "sub-c", expected_generation=1, at=T0) is None
    )
    current = await store.assignment("a")
    assert current is not None
    assert (current.credential_id, current.generation) == ("sub-b", 2)


async def test_of_racing_workers_exactly_one_commits(store_url: str) -> None:
    """Twelve connections commit different subscriptions from one generation: one wins."""
    first = await open_store(store_url)
    await first.compare_and_set_assignment("a", "sub-a", expected_generation=None, at=T0)
    workers = [await open_store(store_url) for _ in range(12)]
    try:
        made = await asyncio.gather(
            *(
                w.compare_and_set_assignment("a", f"sub-{n}", expected_generation=1, at=T0)
                for n, w in enumerate(workers)
            )
        )
        winners = [m for m in made if m is not None]
        assert len(winners) == 1
        assert await first.assignment("a") == winners[0]
        assert winners[0].generation == 2
    finally:
        for store in [first, *workers]:
            await store.close()


async def test_the_newer_failure_of_a_kind_stands(store: PoolStore) -> None:
    """A newer failure replaces an older one of its kind, never the other way round."""
    old = Failure("sub-a", "rate_limit", T0, T0 + timedelta(hours=1), "agent-1")
    new = Failure("sub-a", "rate_limit", T0 + timedelta(minutes=5), None, "agent-2")
    await store.record(failure=new)
    await store.record(failure=old)
    await store.record(failure=Failure("sub-a", "auth", T0, None, None))
    failures = (await store.snapshot()).failures["sub-a"]
    assert failures["rate_limit"] == new
    assert failures["auth"] == Failure("sub-a", "auth", T0, None, None)
    await store.record(failure=old.__class__("sub-a", "rate_limit", T0 + timedelta(hours=1)))
    assert (await store.snapshot()).failures["sub-a"]["rate_limit"].at == T0 + timedelta(hours=1)


async def test_a_reading_keeps_its_windows_and_instants_exactly(store: PoolStore) -> None:
    """Readings round-trip as aware datetimes to the microsecond; an older one is ignored."""
    reading = Reading(
        "sub-a",
        T0,
        "allowed_warning",
        T0 + timedelta(hours=2),
        WindowUse(0.91, T0 + timedelta(hours=2), "allowed_warning"),
        WindowUse(0.35, T0 + timedelta(days=3), "allowed"),
    )
    await store.record(reading=reading)
    await store.record(reading=Reading("sub-a", T0 - timedelta(seconds=1), "rejected"))
    kept = (await store.snapshot()).readings["sub-a"]
    assert kept == reading
    assert kept.at.tzinfo is not None


async def test_one_answer_records_its_reading_and_its_failure_together(store: PoolStore) -> None:
    """A refusal's reading and failure land in one write, each under its credential."""
    reading = Reading("sub-a", T0, "rejected", T0 + timedelta(hours=1))
    failure = Failure("sub-a", "rate_limit", T0, T0 + timedelta(hours=1), "agent-1")
    await store.record(reading=reading, failure=failure)
    snapshot = await store.snapshot()
    assert snapshot.readings == {"sub-a": reading}
    assert snapshot.failures == {"sub-a": {"rate_limit": failure}}


async def test_a_gateway_cooldown_is_set_and_cleared(store: PoolStore) -> None:
    """The agent's gateway cooldown is an instant, and None removes it."""
    await store.set_gateway_until("a", T0)
    assert (await store.snapshot()).gateway_until == {"a": T0}
    await store.set_gateway_until("a", None)
    assert (await store.snapshot()).gateway_until == {}


async def test_an_agents_latest_heartbeat_is_kept(store: PoolStore) -> None:
    """One a agent, the latest replacing the one before, body as given (tabs too)."""
    await store.record_heartbeat("a", T0, '{"memory_mb": 1}')
    await store.record_heartbeat("a", T0 + timedelta(seconds=5), '{"s": "x\ty"}')
    await store.record_heartbeat("b", T0, "{}")
    assert await store.heartbeats() == {
        "a": (T0 + timedelta(seconds=5), '{"s": "x\ty"}'),
        "b": (T0, "{}"),
    }


def _retry(retry_id: str, due: datetime = T0, turn: str = "exec-1") -> ScheduledRetry:
    return ScheduledRetry("a", retry_id, due, 1, turn, T0)


async def test_each_waiting_turn_has_its_own_retry_taken_once(store_url: str) -> None:
    """A turn's new retry replaces its old one; another turn of the agent keeps its own;
    of eight takers racing, one takes it."""
    store = await open_store(store_url)
    takers = [await open_store(store_url) for _ in range(8)]
    later = T0 + timedelta(minutes=30)
    try:
        await store.schedule_retry(_retry("old"))
        await store.schedule_retry(_retry("new", later))
        kept = replace(_retry("other", T0, turn="exec-2"), request='{"message": "hi"}')
        await store.schedule_retry(kept)
        snapshot = await store.snapshot()
        assert snapshot.retries == {"exec-1": _retry("new", later), "exec-2": kept}
        assert [r.turn_ref for r in snapshot.retries_of("a")] == ["exec-2", "exec-1"]
        assert await store.take_retry("exec-1", "old") is False
        taken = await asyncio.gather(*(t.take_retry("exec-1", "new") for t in takers))
        assert taken.count(True) == 1
        assert set((await store.snapshot()).retries) == {"exec-2"}
    finally:
        for opened in [store, *takers]:
            await opened.close()


async def test_a_retry_is_claimed_once_until_its_lease_ends(store_url: str) -> None:
    """Of eight claimants one wins; the claim is in the snapshot; once its lease ended
    (its controller died) it can be claimed again; a new retry of the turn is unclaimed."""
    store = await open_store(store_url)
    claimants = [await open_store(store_url) for _ in range(8)]
    lease = T0 + timedelta(minutes=20)
    try:
        await store.schedule_retry(_retry("r1"))
        claims = await asyncio.gather(
            *(c.claim_retry("exec-1", "r1", at=T0, until=lease) for c in claimants)
        )
        assert claims.count(True) == 1
        assert (await store.snapshot()).retries["exec-1"].claimed_until == lease
        assert not await store.claim_retry("exec-1", "r1", at=T0, until=lease)
        assert not await store.claim_retry("exec-1", "r0", at=lease, until=lease)
        assert await store.claim_retry("exec-1", "r1", at=lease, until=lease + timedelta(1))
        await store.schedule_retry(_retry("r2"))
        assert (await store.snapshot()).retries["exec-1"].claimed_until is None
    finally:
        for opened in [store, *claimants]:
            await opened.close()


async def test_of_racing_holders_exactly_the_ceiling_take_a_lease(store_url: str) -> None:
    """Ten connections race for a credential with a ceiling of three: exactly three hold
    it; a release frees one slot; another credential is counted apart."""
    store = await open_store(store_url)
    holders = [await open_store(store_url) for _ in range(10)]
    until = T0 + timedelta(minutes=5)
    try:
        taken = await asyncio.wait_for(
            asyncio.gather(
                *(
                    h.acquire_lease("sub-a", f"turn-{n}", ceiling=3, at=T0, until=until)
                    for n, h in enumerate(holders)
                )
            ),
            timeout=20,
        )
        assert taken.count(True) == 3
        assert not await store.acquire_lease("sub-a", "late", ceiling=3, at=T0, until=until)
        assert await store.acquire_lease("sub-b", "late", ceiling=3, at=T0, until=until)
        winner = f"turn-{taken.index(True)}"
        assert await store.acquire_lease("sub-a", winner, ceiling=3, at=T0, until=until)
        await store.release_lease("sub-a", winner)
        await store.release_lease("sub-a", winner)
        assert await store.acquire_lease("sub-a", "late", ceiling=3, at=T0, until=until)
    finally:
        for opened in [store, *holders]:
            await opened.close()


_LEASE_TAKER = """
import asyncio, sys
from datetime import datetime, timedelta
from agent_server.controller.stores.base import open_store

async def main() -> None:
    store = await open_store(sys.argv[1])
    at = datetime.fromisoformat(sys.argv[3])
    taken = await store.acquire_lease(
        "sub-a", sys.argv[2], ceiling=2, at=at, until=at + timedelta(minutes=5)
    )
    await store.close()
    print(taken)

asyncio.run(main())
"""


def test_of_racing_processes_exactly_the_ceiling_take_a_lease(store_url: str) -> None:
    """Six controller processes race for a credential with a ceiling of two: two win."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[4])}
    racers = [
        subprocess.Popen(
            [sys.executable, "-c", _LEASE_TAKER, store_url, f"p{n}", T0.isoformat()],
            stdout=subprocess.PIPE,
            env=env,
            text=True,
        )
        for n in range(6)
    ]
    try:
        said = [racer.communicate(timeout=60)[0].strip() for racer in racers]
    finally:
        for racer in racers:
            if racer.poll() is None:
                racer.kill()
                racer.wait()
    assert [racer.returncode for racer in racers] == [0] * 6
    assert sorted(said) == ["False"] * 4 + ["True"] * 2


async def test_a_lease_whose_holder_died_ends_at_its_expiry(store: PoolStore) -> None:
    """A lease not renewed stops counting at its expiry; a renewed one keeps counting."""
    end = T0 + timedelta(minutes=5)
    assert await store.acquire_lease("sub-a", "dead", ceiling=2, at=T0, until=end)
    assert await store.acquire_lease("sub-a", "alive", ceiling=2, at=T0, until=end)
    assert await store.renew_lease("sub-a", "alive", at=T0, until=end + timedelta(minutes=5))
    assert not await store.acquire_lease("sub-a", "new", ceiling=2, at=T0, until=end)
    assert await store.acquire_lease("sub-a", "new", ceiling=2, at=end, until=end + timedelta(1))
    assert not await store.acquire_lease("sub-a", "third", ceiling=2, at=end, until=end)
    assert not await store.renew_lease("sub-a", "dead", at=end, until=end + timedelta(1))


async def test_the_snapshot_holds_each_credentials_leases(store: PoolStore) -> None:
    """The snapshot says each credential's turns in flight: its leases' ends, an ended one
    not counted at a later instant, a released one gone."""
    await store.register_credentials(
        [CredentialInfo("sub-a", "subscription"), CredentialInfo("sub-b", "subscription")]
    )
    short, long = T0 + timedelta(minutes=1), T0 + timedelta(minutes=9)
    for holder, until in (("one", short), ("two", long), ("three", long)):
        assert await store.acquire_lease("sub-a", holder, ceiling=5, at=T0, until=until)
    await store.release_lease("sub-a", "three")
    snapshot = await store.snapshot()
    assert sorted(snapshot.leases["sub-a"]) == [short, long]
    assert "sub-b" not in snapshot.leases
    assert (snapshot.in_flight("sub-a", T0), snapshot.in_flight("sub-a", short)) == (2, 1)
    assert snapshot.in_flight("sub-b", T0) == 0


async def test_probes_of_one_credential_are_spaced(store_url: str) -> None:
    """Of eight racing probers one probes; the next probe waits out the spacing; another
    credential is spaced apart."""
    store = await open_store(store_url)
    probers = [await open_store(store_url) for _ in range(8)]
    minute = timedelta(minutes=1)
    try:
        claims = await asyncio.wait_for(
            asyncio.gather(*(p.claim_probe("sub-a", at=T0, spacing=minute) for p in probers)),
            timeout=20,
        )
        assert claims.count(True) == 1
        assert not await store.claim_probe("sub-a", at=T0 + minute / 2, spacing=minute)
        assert await store.claim_probe("sub-b", at=T0, spacing=minute)
        assert await store.claim_probe("sub-a", at=T0 + minute, spacing=minute)
    finally:
        for opened in [store, *probers]:
            await opened.close()


async def test_clearing_a_credential_forgets_every_failure(store: PoolStore) -> None:
    """A rotated token: its failures go, another credential's stay."""
    await store.record(failure=Failure("sub-a", "auth", T0))
    await store.record(failure=Failure("sub-a", "immediate_hard_limit", T0))
    await store.record(failure=Failure("sub-b", "billing", T0))
    await store.clear_failures("sub-a")
    assert set((await store.snapshot()).failures) == {"sub-b"}


async def test_credentials_are_kept_by_id_without_secrets(store: PoolStore) -> None:
    """Registering twice updates a kind and keeps one entry an id."""
    await store.register_credentials([CredentialInfo("sub-a", "subscription")])
    await store.register_credentials(
        [CredentialInfo("key", "api_key"), CredentialInfo("sub-a", "subscription")]
    )
    assert await store.credentials() == [
        CredentialInfo("key", "api_key"),
        CredentialInfo("sub-a", "subscription"),
    ]


async def test_the_snapshot_lists_every_assignment(store: PoolStore) -> None:
    """The snapshot has every agent's assignment, and who is on a credential."""
    for agent in ("b", "a"):
        await store.compare_and_set_assignment(agent, "sub-a", expected_generation=None, at=T0)
    snapshot = await store.snapshot()
    assert set(snapshot.assignments) == {"a", "b"}
    assert snapshot.agents_on("sub-a") == ["a", "b"]


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        pytest.param("postgres://db/pool", StoreError, id="an unknown scheme is refused"),
        pytest.param("redis://127.0.0.1:1/0", StoreError, id="a Redis that does not answer"),
    ],
)
async def test_a_store_that_cannot_be_used_is_a_store_error(
    url: str, expected: type[Exception]
) -> None:
    """open_store raises StoreError, never a driver's own exception."""
    with pytest.raises(expected):
        await open_store(url)


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        pytest.param(
            {"AGENT_SERVER_STATE_DIR": "/var/lib/ctl"},
            "sqlite:////var/lib/ctl/controller.sqlite3",
            id="the state dir when set",
        ),
        pytest.param(
            {"XDG_STATE_HOME": "/home/op/.state"},
            "sqlite:////home/op/.state/agent-server/controller.sqlite3",
            id="else the XDG state home's agent-server folder",
        ),
    ],
)
def test_the_default_store_is_a_file_under_the_state_dir(
    environ: dict[str, str], expected: str
) -> None:
    """`--store` defaults to SQLite under the state dir."""
    assert default_store_url(environ) == expected


async def test_the_sqlite_file_is_private(tmp_path: Path) -> None:
    """The SQLite file is created 0600 in a 0700 directory."""
    path = tmp_path / "ctl" / "pool.sqlite3"
    store = await open_store(f"sqlite:///{path}")
    await store.close()
    assert path.stat().st_mode & 0o777 == 0o600
    assert path.parent.stat().st_mode & 0o777 == 0o700
