"""The shared store: Redis (redis-py, asyncio), for controllers with several workers or hosts.

Each kind of record is one hash under `agent-server:pool:` (in the URL's database).
Whatever must not race runs as a Lua script, atomically on the server: the
assignment's compare-and-set, keeping only the newer failure or reading, and taking
a retry. Instants are integer microseconds (`codec.py`). This module is the only one
that imports `redis` (the `controller` extra).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

import redis.asyncio as redis
from redis.exceptions import RedisError

from agent_server.controller.clock import from_micros, to_micros
from agent_server.controller.errors import StoreError
from agent_server.controller.pool.state import (
    CREDENTIAL_KINDS,
    FAILURE_KINDS,
    Assignment,
    CredentialInfo,
    Failure,
    PoolSnapshot,
    Reading,
    ScheduledRetry,
)
from agent_server.controller.stores.codec import (
    decode_assignment,
    decode_failures,
    decode_reading,
    decode_retry,
    encode_failure,
    encode_reading,
    encode_retry,
    with_claim,
)

PREFIX = "agent-server:pool:"
CREDENTIALS, ASSIGNMENTS, FAILURES, READINGS, COOLDOWNS, RETRIES, CLAIMS = (
    PREFIX + name
    for name in (
        "credentials",
        "assignments",
        "failures",
        "readings",
        "gateway",
        "turn-retries",  # by turn; the one-an-agent `retries` hash of old is not read
        "claims",
    )
)
PROBES = PREFIX + "probes"
HEARTBEATS = PREFIX + "heartbeats"
LEASES = PREFIX + "leases:"
"""Followed by a credential id: that credential's leases."""
_FIELD_SEPARATOR = "\t"

_COMPARE_AND_SET = """
local raw = redis.call('HGET', KEYS[1], ARGV[1])
local current = -1
if raw then current = tonumber(cjson.decode(raw)['generation']) end
if current ~= tonumber(ARGV[2]) then return false end
local generation = 1
if current >= 0 then generation = current + 1 end
local value = '{"credential_id": ' .. ARGV[3] .. ', "generation": ' .. generation
    .. ', "assigned_at": ' .. ARGV[4] .. '}'
redis.call('HSET', KEYS[1], ARGV[1], value)
return value
"""
"""ARGV: agent, the expected generation (-1: none), the credential id as JSON, the
instant. The value is written as text: cjson would round a 16-digit instant."""
_KEEP_NEWER = """
local raw = redis.call('HGET', KEYS[1], ARGV[1])
if raw and tonumber(cjson.decode(raw)['at']) >= tonumber(ARGV[2]) then return 0 end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
return 1
"""
_TAKE_RETRY = """
local raw = redis.call('HGET', KEYS[1], ARGV[1])
if not raw or cjson.decode(raw)['retry_id'] ~= ARGV[2] then return 0 end
redis.call('HDEL', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[1])
return 1
"""
"""KEYS: retries, claims. ARGV: the turn, the retry id."""
_CLAIM_RETRY = """
local raw = redis.call('HGET', KEYS[1], ARGV[1])
if not raw or cjson.decode(raw)['retry_id'] ~= ARGV[2] then return 0 end
local held = redis.call('HGET', KEYS[2], ARGV[1])
if held and tonumber(held) > tonumber(ARGV[3]) then return 0 end
redis.call('HSET', KEYS[2], ARGV[1], ARGV[4])
return 1
"""
"""KEYS: retries, claims. ARGV: the turn, the retry id, now and the lease's end (us).
Instants below 2^53 us compare exactly as Lua numbers; they are kept as text."""

_ACQUIRE_LEASE = """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[2])
if not redis.call('ZSCORE', KEYS[1], ARGV[1])
    and redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[4]) then return 0 end
redis.call('ZADD', KEYS[1], ARGV[3], ARGV[1])
return 1
"""
"""KEYS: the credential's leases (a sorted set of holders scored by expiry, us). ARGV: the
holder, now, the lease's end, the ceiling. Ended leases are dropped before the count."""
_RENEW_LEASE = """
local held = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not held or tonumber(held) <= tonumber(ARGV[2]) then return 0 end
redis.call('ZADD', KEYS[1], ARGV[3], ARGV[1])
return 1
"""
"""KEYS: the credential's leases. ARGV: the holder, now, the lease's new end (us)."""

_CLAIM_PROBE = """
local last = redis.call('HGET', KEYS[1], ARGV[1])
if last and tonumber(last) > tonumber(ARGV[2]) - tonumber(ARGV[3]) then return 0 end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
return 1
"""
"""KEYS: the probes hash. ARGV: the credential, now, the spacing (us)."""


class RedisStore:
    """A `PoolStore` in Redis."""

    def __init__(self, client: redis.Redis) -> None:
        self._redis = client
        self._compare_and_set = client.register_script(_COMPARE_AND_SET)
        self._keep_newer = client.register_script(_KEEP_NEWER)
        self._take_retry = client.register_script(_TAKE_RETRY)
        self._claim_retry = client.register_script(_CLAIM_RETRY)
        self._acquire_lease = client.register_script(_ACQUIRE_LEASE)
        self._renew_lease = client.register_script(_RENEW_LEASE)
        self._claim_probe = client.register_script(_CLAIM_PROBE)

    @classmethod
    async def open(cls, url: str) -> RedisStore:
        """Connect to `redis://HOST:PORT/DB` and check that it answers."""
        client = redis.Redis.from_url(url, decode_responses=True)
        store = cls(client)
        try:
            await store._call(client.ping())
        except StoreError:
            await client.aclose()
            raise
        return store

    async def _call(self, pending: Any) -> Any:
        try:
            return await pending
        except RedisError as exc:
            msg = f"Redis store: {type(exc).__name__}: {exc}"
            raise StoreError(msg) from exc

    async def close(self) -> None:
        """Close the connection pool."""
        await self._redis.aclose()

    async def register_credentials(self, infos: Sequence[CredentialInfo]) -> None:
        """Record these credentials (id and kind)."""
        if infos:
            mapping = {info.id: info.kind for info in infos}
            await self._call(self._redis.hset(CREDENTIALS, mapping=mapping))  # type: ignore[arg-type]

    async def credentials(self) -> list[CredentialInfo]:
        """Every credential registered, by id."""
        found: dict[str, str] = await self._call(self._redis.hgetall(CREDENTIALS))
        return [CredentialInfo(i, k) for i, k in sorted(found.items()) if k in CREDENTIAL_KINDS]

    async def snapshot(self) -> PoolSnapshot:
        """Everything a walk reads, in one MULTI/EXEC."""
        async with self._redis.pipeline(transaction=True) as pipe:
            for key in (ASSIGNMENTS, FAILURES, READINGS, COOLDOWNS, RETRIES, CLAIMS):
                pipe.hgetall(key)
            pipe.hkeys(CREDENTIALS)
            answered = await self._call(pipe.execute())
        assignments, failures, readings, cooldowns, retries, claims, idents = answered
        return PoolSnapshot(
            leases=await self._leases(idents),
            assignments={a: decode_assignment(a, body) for a, body in assignments.items()},
            failures=decode_failures(
                (field.partition(_FIELD_SEPARATOR)[0], body) for field, body in failures.items()
            ),
            readings={c: decode_reading(c, body) for c, body in readings.items()},
            gateway_until={a: from_micros(int(us)) for a, us in cooldowns.items()},
            retries={
                turn: with_claim(decode_retry(body), _micros(claims.get(turn)))
                for turn, body in retries.items()
            },
        )

    async def _leases(self, idents: Sequence[str]) -> dict[str, tuple[datetime, ...]]:
        """Each credential's lease ends, in one round trip after the snapshot's: they only
        rank candidates, and the ceiling is enforced by `acquire_lease`, not by this."""
        if not idents:
            return {}
        async with self._redis.pipeline(transaction=False) as pipe:
            for ident in idents:
                pipe.zrange(LEASES + ident, 0, -1, withscores=True)
            answered = await self._call(pipe.execute())
        return {
            ident: tuple(from_micros(int(score)) for _, score in held)
            for ident, held in zip(idents, answered, strict=True)
            if held
        }

    async def assignment(self, agent: str) -> Assignment | None:
        """The agent's assignment, if any."""
        body = await self._call(self._redis.hget(ASSIGNMENTS, agent))
        return decode_assignment(agent, body) if body else None

    async def compare_and_set_assignment(
        self, agent: str, credential_id: str, *, expected_generation: int | None, at: datetime
    ) -> Assignment | None:
        """Assign when the generation is still the expected one (atomic, on the server)."""
        expected = -1 if expected_generation is None else expected_generation
        args: list[str | int] = [agent, expected, json.dumps(credential_id), to_micros(at)]
        body = await self._call(self._compare_and_set(keys=[ASSIGNMENTS], args=args))
        return decode_assignment(agent, body) if body else None

    async def record(
        self, *, reading: Reading | None = None, failure: Failure | None = None
    ) -> None:
        """Keep the newer reading, and the newer failure of each kind, in one round trip."""
        async with self._redis.pipeline(transaction=True) as pipe:
            if reading is not None:
                args: list[str | int] = [
                    reading.credential_id,
                    to_micros(reading.at),
                    encode_reading(reading),
                ]
                await self._keep_newer(keys=[READINGS], args=args, client=pipe)
            if failure is not None:
                field = f"{failure.credential_id}{_FIELD_SEPARATOR}{failure.kind}"
                args = [field, to_micros(failure.at), encode_failure(failure)]
                await self._keep_newer(keys=[FAILURES], args=args, client=pipe)
            await self._call(pipe.execute())

    async def set_gateway_until(self, agent: str, until: datetime | None) -> None:
        """Set or clear the agent's gateway cooldown."""
        if until is None:
            await self._call(self._redis.hdel(COOLDOWNS, agent))
        else:
            await self._call(self._redis.hset(COOLDOWNS, agent, str(to_micros(until))))

    async def schedule_retry(self, retry: ScheduledRetry) -> None:
        """The turn's retry is now `retry` (unclaimed)."""
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.hset(RETRIES, retry.turn_ref, encode_retry(retry))
            pipe.hdel(CLAIMS, retry.turn_ref)
            await self._call(pipe.execute())

    async def claim_retry(
        self, turn_ref: str, retry_id: str, *, at: datetime, until: datetime
    ) -> bool:
        """Claim it if it is still `retry_id` and unclaimed (atomic, on the server)."""
        args: list[str | int] = [turn_ref, retry_id, to_micros(at), to_micros(until)]
        claimed = await self._call(self._claim_retry(keys=[RETRIES, CLAIMS], args=args))
        return bool(claimed)

    async def acquire_lease(
        self, credential_id: str, holder: str, *, ceiling: int, at: datetime, until: datetime
    ) -> bool:
        """Count the live leases and take one (atomic, on the server)."""
        args: list[str | int] = [holder, to_micros(at), to_micros(until), ceiling]
        taken = await self._call(self._acquire_lease(keys=[LEASES + credential_id], args=args))
        return bool(taken)

    async def renew_lease(
        self, credential_id: str, holder: str, *, at: datetime, until: datetime
    ) -> bool:
        """Extend the lease if it has not ended (atomic, on the server)."""
        args: list[str | int] = [holder, to_micros(at), to_micros(until)]
        renewed = await self._call(self._renew_lease(keys=[LEASES + credential_id], args=args))
        return bool(renewed)

    async def claim_probe(self, credential_id: str, *, at: datetime, spacing: timedelta) -> bool:
        """Read the last probe and record this one (atomic, on the server)."""
        spacing_us = int(spacing.total_seconds() * 1_000_000)
        args: list[str | int] = [credential_id, to_micros(at), spacing_us]
        return bool(await self._call(self._claim_probe(keys=[PROBES], args=args)))

    async def release_lease(self, credential_id: str, holder: str) -> None:
        """Remove the holder from the credential's leases."""
        await self._call(self._redis.zrem(LEASES + credential_id, holder))

    async def take_retry(self, turn_ref: str, retry_id: str) -> bool:
        """Delete the turn's retry if it is still `retry_id`; True for the taker."""
        taken = await self._call(
            self._take_retry(keys=[RETRIES, CLAIMS], args=[turn_ref, retry_id])
        )
        return bool(taken)

    async def record_heartbeat(self, agent: str, at: datetime, body: str) -> None:
        """Replace the agent's heartbeat (`micros<TAB>body`)."""
        kept = f"{to_micros(at)}{_FIELD_SEPARATOR}{body}"
        await self._call(self._redis.hset(HEARTBEATS, agent, kept))

    async def heartbeats(self) -> dict[str, tuple[datetime, str]]:
        """Every agent's latest heartbeat."""
        found: dict[str, str] = await self._call(self._redis.hgetall(HEARTBEATS))
        beats = {}
        for agent, kept in found.items():
            at_us, _, body = kept.partition(_FIELD_SEPARATOR)
            beats[agent] = (from_micros(int(at_us)), body)
        return beats

    async def clear_failures(self, credential_id: str) -> None:
        """Forget the credential's failures (every kind)."""
        fields = [f"{credential_id}{_FIELD_SEPARATOR}{kind}" for kind in FAILURE_KINDS]
        await self._call(self._redis.hdel(FAILURES, *fields))


def _micros(text: str | None) -> int | None:
    return int(text) if text is not None else None
