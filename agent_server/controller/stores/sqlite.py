"""The embedded store: one SQLite file (stdlib `sqlite3`), in WAL mode, off the event loop.

Every call runs on one worker thread that owns the connection, so the event loop
never waits on the disk. WAL lets readers run beside the one writer, and
`busy_timeout` lets several controller processes share the file; a compare-and-set
runs in a `BEGIN IMMEDIATE` transaction, so two processes never both win it.
`synchronous=NORMAL`: a commit survives a crash of the controller, and the file stays
consistent after a power loss, which may lose the last commits (a few readings).
Instants are integer microseconds (`codec.py`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sqlite3
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar, cast

from agent_server.controller.clock import from_micros, to_micros
from agent_server.controller.errors import StoreError
from agent_server.controller.pool.state import (
    CREDENTIAL_KINDS,
    Assignment,
    CredentialInfo,
    CredentialKind,
    Failure,
    PoolSnapshot,
    Reading,
    ScheduledRetry,
)
from agent_server.controller.stores.codec import (
    decode_failures,
    decode_reading,
    decode_retry,
    encode_failure,
    encode_reading,
    encode_retry,
    micros,
    with_claim,
)

T = TypeVar("T")
BUSY_TIMEOUT_MS = 5000
SCHEMA = """
CREATE TABLE IF NOT EXISTS credentials (id TEXT PRIMARY KEY, kind TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS assignments (
    agent TEXT PRIMARY KEY, credential_id TEXT NOT NULL,
    generation INTEGER NOT NULL, assigned_us INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS failures (
    credential_id TEXT NOT NULL, kind TEXT NOT NULL, at_us INTEGER NOT NULL, body TEXT NOT NULL,
    PRIMARY KEY (credential_id, kind));
CREATE TABLE IF NOT EXISTS readings (
    credential_id TEXT PRIMARY KEY, at_us INTEGER NOT NULL, body TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS gateway_cooldowns (agent TEXT PRIMARY KEY, until_us INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS turn_retries (turn_ref TEXT PRIMARY KEY, retry_id TEXT NOT NULL,
    body TEXT NOT NULL, claimed_us INTEGER);
CREATE TABLE IF NOT EXISTS leases (credential_id TEXT NOT NULL, holder TEXT NOT NULL,
    until_us INTEGER NOT NULL, PRIMARY KEY (credential_id, holder));
CREATE TABLE IF NOT EXISTS probes (credential_id TEXT PRIMARY KEY, at_us INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS heartbeats (
    agent TEXT PRIMARY KEY, at_us INTEGER NOT NULL, body TEXT NOT NULL);
"""
# The one-a-agent `retries` table of earlier versions is left as it is and not read.


class SqliteStore:
    """A `PoolStore` in one SQLite file."""

    def __init__(self, connection: sqlite3.Connection, worker: ThreadPoolExecutor) -> None:
        self._db = connection
        self._worker = worker

    @classmethod
    async def open(cls, path: Path) -> SqliteStore:
        """Open (creating it 0600, its directory 0700) the store at `path`."""
        worker = ThreadPoolExecutor(1, thread_name_prefix="pool-sqlite")
        try:
            connection = await asyncio.get_running_loop().run_in_executor(worker, _connect, path)
        except (OSError, sqlite3.Error) as exc:
            worker.shutdown()
            msg = f"cannot open the SQLite store {path}: {exc}"
            raise StoreError(msg) from exc
        return cls(connection, worker)

    async def _run(self, call: Callable[[sqlite3.Connection], T]) -> T:
        try:
            return await asyncio.get_running_loop().run_in_executor(self._worker, call, self._db)
        except sqlite3.Error as exc:
            msg = f"SQLite store: {exc}"
            raise StoreError(msg) from exc

    async def close(self) -> None:
        """Close the connection and its thread."""
        await self._run(lambda db: db.close())
        self._worker.shutdown()

    async def register_credentials(self, infos: Sequence[CredentialInfo]) -> None:
        """Record these credentials (id and kind)."""
        rows = [(info.id, info.kind) for info in infos]

        def write(db: sqlite3.Connection) -> None:
            with _transaction(db):
                db.executemany(
                    "INSERT INTO credentials (id, kind) VALUES (?, ?) "
                    "ON CONFLICT (id) DO UPDATE SET kind = excluded.kind",
                    rows,
                )

        await self._run(write)

    async def credentials(self) -> list[CredentialInfo]:
        """Every credential registered, by id."""
        rows = await self._run(
            lambda db: db.execute("SELECT id, kind FROM credentials ORDER BY id").fetchall()
        )
        return [
            CredentialInfo(i, cast(CredentialKind, k)) for i, k in rows if k in CREDENTIAL_KINDS
        ]

    async def snapshot(self) -> PoolSnapshot:
        """Everything a walk reads, in one read transaction."""
        return await self._run(_snapshot)

    async def assignment(self, agent: str) -> Assignment | None:
        """The agent's assignment, if any."""
        row = await self._run(
            lambda db: db.execute(
                "SELECT agent, credential_id, generation, assigned_us FROM assignments "
                "WHERE agent = ?",
                (agent,),
            ).fetchone()
        )
        return _assignment(row) if row else None

    async def compare_and_set_assignment(
        self, agent: str, credential_id: str, *, expected_generation: int | None, at: datetime
    ) -> Assignment | None:
        """Assign when the generation is still the expected one (one writer at a time)."""

        def swap(db: sqlite3.Connection) -> Assignment | None:
            with _transaction(db, immediate=True):
                row = db.execute(
                    "SELECT generation FROM assignments WHERE agent = ?", (agent,)
                ).fetchone()
                current = row[0] if row else None
                if current != expected_generation:
                    return None
                generation = (current or 0) + 1
                db.execute(
                    "INSERT OR REPLACE INTO assignments VALUES (?, ?, ?, ?)",
                    (agent, credential_id, generation, to_micros(at)),
                )
            return Assignment(agent, credential_id, generation, at)

        return await self._run(swap)

    async def record(
        self, *, reading: Reading | None = None, failure: Failure | None = None
    ) -> None:
        """Keep the newer reading, and the newer failure of each kind, in one transaction."""

        def write(db: sqlite3.Connection) -> None:
            with _transaction(db):
                if reading is not None:
                    db.execute(
                        "INSERT INTO readings VALUES (?, ?, ?) ON CONFLICT (credential_id) "
                        "DO UPDATE SET at_us = excluded.at_us, body = excluded.body "
                        "WHERE excluded.at_us > readings.at_us",
                        (reading.credential_id, to_micros(reading.at), encode_reading(reading)),
                    )
                if failure is not None:
                    db.execute(
                        "INSERT INTO failures VALUES (?, ?, ?, ?) "
                        "ON CONFLICT (credential_id, kind) "
                        "DO UPDATE SET at_us = excluded.at_us, body = excluded.body "
                        "WHERE excluded.at_us > failures.at_us",
                        (
                            failure.credential_id,
                            failure.kind,
                            to_micros(failure.at),
                            encode_failure(failure),
                        ),
                    )

        await self._run(write)

    async def set_gateway_until(self, agent: str, until: datetime | None) -> None:
        """Set or clear the agent's gateway cooldown."""
        if until is None:
            await self._write("DELETE FROM gateway_cooldowns WHERE agent = ?", (agent,))
        else:
            await self._write(
                "INSERT OR REPLACE INTO gateway_cooldowns VALUES (?, ?)", (agent, micros(until))
            )

    async def schedule_retry(self, retry: ScheduledRetry) -> None:
        """The turn's retry is now `retry` (unclaimed)."""
        await self._write(
            "INSERT OR REPLACE INTO turn_retries VALUES (?, ?, ?, NULL)",
            (retry.turn_ref, retry.retry_id, encode_retry(retry)),
        )

    async def claim_retry(
        self, turn_ref: str, retry_id: str, *, at: datetime, until: datetime
    ) -> bool:
        """Claim it if it is still `retry_id` and unclaimed (or its lease ended)."""
        now_us = to_micros(at)

        def claim(db: sqlite3.Connection) -> bool:
            with _transaction(db, immediate=True):
                cursor = db.execute(
                    "UPDATE turn_retries SET claimed_us = ? WHERE turn_ref = ? AND retry_id = ? "
                    "AND (claimed_us IS NULL OR claimed_us <= ?)",
                    (to_micros(until), turn_ref, retry_id, now_us),
                )
            return cursor.rowcount == 1

        return await self._run(claim)

    async def take_retry(self, turn_ref: str, retry_id: str) -> bool:
        """Delete the turn's retry if it is still `retry_id`; True for the taker."""

        def take(db: sqlite3.Connection) -> bool:
            with _transaction(db):
                cursor = db.execute(
                    "DELETE FROM turn_retries WHERE turn_ref = ? AND retry_id = ?",
                    (turn_ref, retry_id),
                )
            return cursor.rowcount == 1

        return await self._run(take)

    async def acquire_lease(
        self, credential_id: str, holder: str, *, ceiling: int, at: datetime, until: datetime
    ) -> bool:
        """Count the live leases and take one in one BEGIN IMMEDIATE transaction."""
        now_us, until_us = to_micros(at), to_micros(until)

        def acquire(db: sqlite3.Connection) -> bool:
            with _transaction(db, immediate=True):
                db.execute(
                    "DELETE FROM leases WHERE credential_id = ? AND until_us <= ?",
                    (credential_id, now_us),
                )
                held = db.execute(
                    "SELECT holder FROM leases WHERE credential_id = ?", (credential_id,)
                ).fetchall()
                if holder not in {row[0] for row in held} and len(held) >= ceiling:
                    return False
                db.execute(
                    "INSERT OR REPLACE INTO leases (credential_id, holder, until_us) "
                    "VALUES (?, ?, ?)",
                    (credential_id, holder, until_us),
                )
            return True

        return await self._run(acquire)

    async def renew_lease(
        self, credential_id: str, holder: str, *, at: datetime, until: datetime
    ) -> bool:
        """Extend the lease if it has not ended."""

        def renew(db: sqlite3.Connection) -> bool:
            with _transaction(db, immediate=True):
                cursor = db.execute(
                    "UPDATE leases SET until_us = ? WHERE credential_id = ? AND holder = ? "
                    "AND until_us > ?",
                    (to_micros(until), credential_id, holder, to_micros(at)),
                )
            return cursor.rowcount == 1

        return await self._run(renew)

    async def release_lease(self, credential_id: str, holder: str) -> None:
        """Delete the holder's lease."""
        await self._write(
            "DELETE FROM leases WHERE credential_id = ? AND holder = ?", (credential_id, holder)
        )

    async def claim_probe(self, credential_id: str, *, at: datetime, spacing: timedelta) -> bool:
        """Read the last probe and record this one in one BEGIN IMMEDIATE transaction."""
        at_us, spacing_us = to_micros(at), int(spacing.total_seconds() * 1_000_000)

        def claim(db: sqlite3.Connection) -> bool:
            with _transaction(db, immediate=True):
                row = db.execute(
                    "SELECT at_us FROM probes WHERE credential_id = ?", (credential_id,)
                ).fetchone()
                if row is not None and row[0] > at_us - spacing_us:
                    return False
                db.execute(
                    "INSERT OR REPLACE INTO probes (credential_id, at_us) VALUES (?, ?)",
                    (credential_id, at_us),
                )
            return True

        return await self._run(claim)

    async def record_heartbeat(self, agent: str, at: datetime, body: str) -> None:
        """Replace the agent's heartbeat."""
        await self._write(
            "INSERT OR REPLACE INTO heartbeats VALUES (?, ?, ?)", (agent, micros(at), body)
        )

    async def heartbeats(self) -> dict[str, tuple[datetime, str]]:
        """Every agent's latest heartbeat."""
        rows = await self._run(
            lambda db: db.execute("SELECT agent, at_us, body FROM heartbeats").fetchall()
        )
        return {agent: (from_micros(at_us), body) for agent, at_us, body in rows}

    async def clear_failures(self, credential_id: str) -> None:
        """Forget the credential's failures."""
        await self._write("DELETE FROM failures WHERE credential_id = ?", (credential_id,))

    async def _write(self, sql: str, row: tuple[Any, ...]) -> None:
        def write(db: sqlite3.Connection) -> None:
            with _transaction(db):
                db.execute(sql, row)

        await self._run(write)


def _connect(path: Path) -> sqlite3.Connection:
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    # Created 0600 before SQLite opens it: the pool's state is the controller's alone.
    os.close(os.open(path, os.O_CREAT | os.O_RDWR | os.O_NOFOLLOW, 0o600))
    db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    db.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
    # Switching a new file to WAL takes an exclusive lock without waiting on the busy
    # handler, so controllers opening one file at once retry that within the same bound.
    deadline = time.monotonic() + BUSY_TIMEOUT_MS / 1000
    while True:
        try:
            db.execute("PRAGMA journal_mode = WAL")
            break
        except sqlite3.OperationalError:
            if time.monotonic() > deadline:
                db.close()
                raise
            time.sleep(0.01)
    db.execute("PRAGMA synchronous = NORMAL")
    try:
        # The write lock first (the busy handler waits for it), never a read upgraded.
        with _transaction(db, immediate=True):
            for statement in filter(str.strip, SCHEMA.split(";")):
                db.execute(statement)
    except sqlite3.Error:
        db.close()
        raise
    return db


@contextlib.contextmanager
def _transaction(db: sqlite3.Connection, *, immediate: bool = False) -> Iterator[None]:
    """BEGIN (IMMEDIATE: take the write lock at once) ... COMMIT, or ROLLBACK on an error."""
    db.execute("BEGIN IMMEDIATE" if immediate else "BEGIN")
    try:
        yield
    except BaseException:
        db.execute("ROLLBACK")
        raise
    db.execute("COMMIT")


def _assignment(row: tuple[Any, ...]) -> Assignment:
    agent, credential_id, generation, assigned_us = row
    return Assignment(agent, credential_id, generation, from_micros(assigned_us))


def _snapshot(db: sqlite3.Connection) -> PoolSnapshot:
    with _transaction(db):
        assignments = db.execute(
            "SELECT agent, credential_id, generation, assigned_us FROM assignments"
        ).fetchall()
        failures = db.execute("SELECT credential_id, body FROM failures").fetchall()
        readings = db.execute("SELECT credential_id, body FROM readings").fetchall()
        cooldowns = db.execute("SELECT agent, until_us FROM gateway_cooldowns").fetchall()
        retries = db.execute("SELECT turn_ref, body, claimed_us FROM turn_retries").fetchall()
        leases = db.execute("SELECT credential_id, until_us FROM leases").fetchall()
    ends: dict[str, list[datetime]] = {}
    for credential_id, until_us in leases:
        ends.setdefault(credential_id, []).append(from_micros(until_us))
    return PoolSnapshot(
        leases={ident: tuple(held) for ident, held in ends.items()},
        assignments={row[0]: _assignment(row) for row in assignments},
        failures=decode_failures(failures),
        readings={c: decode_reading(c, body) for c, body in readings},
        gateway_until={agent: from_micros(until) for agent, until in cooldowns},
        retries={turn: with_claim(decode_retry(body), claimed) for turn, body, claimed in retries},
    )
