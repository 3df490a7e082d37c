"""What a store keeps about a pool, and the snapshot of it that one walk decides on.

Never a secret: a credential is known by its id and kind (the secret stays in the
pool file's source), failures and readings by the credential's id. Every instant is
an aware UTC datetime on the controller's clock (`clock.py`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Literal, NamedTuple, get_args

from agent_server.wire.instants import parse_instant
from agent_server.wire.names import LONGEST_WINDOW, WINDOW_LENGTHS
from agent_server.wire.turns import RateLimitReading, RateLimitWindow, TurnMetadata

CredentialKind = Literal["subscription", "api_key", "gateway"]
CREDENTIAL_KINDS: tuple[CredentialKind, ...] = get_args(CredentialKind)
FailureKind = Literal["rate_limit", "auth", "billing", "immediate_hard_limit"]
"""The failures a credential is blamed for: the three that ask for another credential,
and a refusal while it was stabilizing after a commit (`immediate_hard_limit`)."""
FAILURE_KINDS: tuple[FailureKind, ...] = get_args(FailureKind)


def bounded_reset(resets_at: datetime | None, window: str | None, at: datetime) -> datetime | None:
    """`resets_at`, no later than one `window` length after `at`: the server's reset comes
    from what the CLI printed, and the agent can print anything; it must not park a
    credential past its window."""
    if resets_at is None:
        return None
    return min(resets_at, at + WINDOW_LENGTHS.get(window or "", LONGEST_WINDOW))


class CredentialInfo(NamedTuple):
    """A credential as the store knows it: its id and kind, never its secret."""

    id: str
    kind: CredentialKind


@dataclass(frozen=True)
class Assignment:
    """Which subscription an agent runs on; `generation` grows with every change (CAS)."""

    agent: str
    credential_id: str
    generation: int
    assigned_at: datetime


@dataclass(frozen=True)
class Failure:
    """One refusal of a credential: what kind, when, and when it resets (if said)."""

    credential_id: str
    kind: FailureKind
    at: datetime
    resets_at: datetime | None = None
    agent: str | None = None
    """The agent whose turn saw it (for the operator; decisions do not read it)."""


@dataclass(frozen=True)
class WindowUse:
    """One window of a reading: how full it was, and when it resets."""

    utilization: float | None
    resets_at: datetime | None
    status: str | None


@dataclass(frozen=True)
class Reading:
    """The provider's rate-limit reading of a credential, taken `at` (its age)."""

    credential_id: str
    at: datetime
    status: str | None
    resets_at: datetime | None = None
    five_hour: WindowUse | None = None
    seven_day: WindowUse | None = None

    @classmethod
    def of_turn(
        cls, credential_id: str, at: datetime, metadata: TurnMetadata | None
    ) -> Reading | None:
        """A turn's reading (`metadata.rate_limit`), if it carried one."""
        if metadata is None or metadata.rate_limit is None:
            return None
        return cls.of(credential_id, at, metadata.rate_limit)

    @classmethod
    def of(cls, credential_id: str, at: datetime, wire: RateLimitReading) -> Reading:
        """A turn's `metadata.rate_limit`, as the store keeps it."""
        return cls(
            credential_id=credential_id,
            at=at,
            status=wire.status,
            resets_at=bounded_reset(parse_instant(wire.resets_at), wire.rate_limit_type, at),
            five_hour=_window(wire.five_hour, "five_hour", at),
            seven_day=_window(wire.seven_day, "seven_day", at),
        )


def _window(wire: RateLimitWindow | None, name: str, at: datetime) -> WindowUse | None:
    if wire is None:
        return None
    resets_at = bounded_reset(parse_instant(wire.resets_at), name, at)
    return WindowUse(wire.utilization, resets_at, wire.status)


@dataclass(frozen=True)
class ScheduledRetry:
    """A turn waiting for capacity: its retry, due at the earliest known reset.

    Keyed by its turn (`turn_ref`, the controller's own name for it; the CLI uses the
    execution id): each waiting turn of an agent keeps its own. The walk never keeps a
    prompt (`request` is the scheduling controller's choice). A retry is claimed in the
    store before it runs (`claimed_until`: the claim's lease); a claim whose controller
    died is re-armed when the lease ends.
    """

    agent: str
    retry_id: str
    due_at: datetime
    assignment_generation: int | None
    turn_ref: str
    scheduled_at: datetime
    claimed_until: datetime | None = None
    request: str | None = None
    """What the controller that scheduled it keeps to run the turn again (`pool serve`:
    the turn's request as JSON, so any instance sharing the store can run it). The walk
    itself leaves it None."""


@dataclass(frozen=True)
class PoolSnapshot:
    """Everything a walk decides on, read from the store at once."""

    assignments: Mapping[str, Assignment] = field(default_factory=dict)
    """By agent."""
    failures: Mapping[str, Mapping[FailureKind, Failure]] = field(default_factory=dict)
    """By credential id: the latest failure of each kind."""
    readings: Mapping[str, Reading] = field(default_factory=dict)
    """By credential id: the latest reading."""
    gateway_until: Mapping[str, datetime] = field(default_factory=dict)
    """By agent: its turns go to the gateway first until then (after the gateway served)."""
    retries: Mapping[str, ScheduledRetry] = field(default_factory=dict)
    """By turn (`turn_ref`): every waiting turn's retry."""
    leases: Mapping[str, tuple[datetime, ...]] = field(default_factory=dict)
    """By credential id: the end of each lease held (its turns in flight). An ended lease
    lingers until the store next prunes it, so count them with `in_flight`."""

    def in_flight(self, credential_id: str, now: datetime | None = None) -> int:
        """The credential's turns in flight: its leases not ended by `now` (None: every
        lease kept)."""
        ends = self.leases.get(credential_id, ())
        return len(ends) if now is None else sum(1 for end in ends if end > now)

    def retries_of(self, agent: str) -> list[ScheduledRetry]:
        """The agent's waiting turns, the earliest due first."""
        return sorted(
            (r for r in self.retries.values() if r.agent == agent), key=lambda r: r.due_at
        )

    def agents_on(self, credential_id: str) -> list[str]:
        """The agents assigned to a credential, sorted."""
        return sorted(
            a.agent for a in self.assignments.values() if a.credential_id == credential_id
        )

    def with_assignment(self, assignment: Assignment) -> PoolSnapshot:
        """This snapshot as the store has it once `assignment` is made."""
        return replace(self, assignments={**self.assignments, assignment.agent: assignment})

    def with_failure(self, failure: Failure) -> PoolSnapshot:
        """This snapshot as the store has it once `failure` is recorded."""
        kept = self.failures.get(failure.credential_id, {})
        older = kept.get(failure.kind)
        if older is not None and older.at >= failure.at:
            return self
        failures = {**self.failures, failure.credential_id: {**kept, failure.kind: failure}}
        return replace(self, failures=failures)

    def with_reading(self, reading: Reading) -> PoolSnapshot:
        """This snapshot as the store has it once `reading` is recorded."""
        older = self.readings.get(reading.credential_id)
        if older is not None and older.at >= reading.at:
            return self
        return replace(self, readings={**self.readings, reading.credential_id: reading})
