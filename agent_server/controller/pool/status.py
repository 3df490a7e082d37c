"""The pool as an operator reads it (pure): one row a credential, the assignments, the
waiting turns and the cooldowns, as a table or as JSON (`pool status --json`)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from agent_server.controller.pool.rungs import PoolView
from agent_server.controller.pool.standing import (
    USABLE_READING,
    Standing,
    blocking_reset,
    failed_recently,
    fresh,
    refusing,
    throttled,
    window_use,
)
from agent_server.controller.pool.state import (
    CredentialInfo,
    Failure,
    FailureKind,
    PoolSnapshot,
    Reading,
)
from agent_server.wire.instants import format_instant

CredentialState = Literal["available", "throttled", "failed"]
"""throttled: its window is full now; failed: refused in the skip window (auth,
billing, or a rate limit with no reset known), not readmitted; available: neither."""


@dataclass(frozen=True)
class CredentialRow:
    """One credential of `pool status`."""

    credential: str
    kind: str
    state: CredentialState
    resets_at: datetime | None
    five_hour_use: float | None
    seven_day_use: float | None
    last_failure: Failure | None
    assigned_agents: list[str]
    failures: Mapping[FailureKind, Failure] = field(default_factory=dict)
    """Its latest failure of each kind (recent or not: the operator judges)."""
    reading: Reading | None = None
    """Its latest reading, with its instant (its age)."""
    in_flight: int = 0
    """Its turns in flight across the fleet now (its live leases)."""

    def as_json(self) -> dict[str, Any]:
        """The row as `pool status --json` prints it."""
        failure = self.last_failure
        return {
            "credential": self.credential,
            "kind": self.kind,
            "state": self.state,
            "resets_at": format_instant(self.resets_at),
            "five_hour_use": self.five_hour_use,
            "seven_day_use": self.seven_day_use,
            "last_failure": None
            if failure is None
            else {"kind": failure.kind, "at": format_instant(failure.at)},
            "assigned_agents": self.assigned_agents,
            "failures": {
                kind: {"at": format_instant(f.at), "resets_at": format_instant(f.resets_at)}
                for kind, f in sorted(self.failures.items())
            },
            "reading": None if self.reading is None else _reading_json(self.reading),
            "in_flight": self.in_flight,
        }


def pool_rows(
    infos: Iterable[CredentialInfo], snapshot: PoolSnapshot, now: datetime
) -> list[CredentialRow]:
    """One row a credential, in pool-file order."""
    view = PoolView.of(infos, snapshot, agent="", now=now)
    return [_row(standing, snapshot, now) for standing in view.standings]


def _row(standing: Standing, snapshot: PoolSnapshot, now: datetime) -> CredentialRow:
    state: CredentialState = "available"
    if throttled(standing, now):
        state = "throttled"
    elif failed_recently(standing, now):
        state = "failed"
    reading = standing.reading
    usable = reading is not None and now - reading.at <= USABLE_READING
    return CredentialRow(
        credential=standing.info.id,
        kind=standing.info.kind,
        state=state,
        resets_at=_resets_at(standing, now) if state == "throttled" else None,
        five_hour_use=window_use(reading.five_hour if usable and reading else None, now),
        seven_day_use=window_use(reading.seven_day if usable and reading else None, now),
        last_failure=standing.last_failure,
        assigned_agents=snapshot.agents_on(standing.info.id),
        failures=dict(standing.failures),
        reading=reading,
        in_flight=standing.in_flight,
    )


def _resets_at(standing: Standing, now: datetime) -> datetime | None:
    reading = fresh(standing.reading, now)
    if reading is not None and refusing(reading, now):
        return reading.resets_at
    limit = standing.failures.get("rate_limit")
    return blocking_reset(standing, limit) if limit is not None else None


def pool_status(
    infos: Iterable[CredentialInfo], snapshot: PoolSnapshot, now: datetime
) -> dict[str, Any]:
    """What `pool status --json` prints: every credential's row, every assignment, every
    waiting turn with its due time, and every gateway cooldown (never a secret)."""
    return {
        "at": format_instant(now),
        "credentials": [row.as_json() for row in pool_rows(infos, snapshot, now)],
        "assignments": [
            {
                "agent": a.agent,
                "credential": a.credential_id,
                "generation": a.generation,
                "assigned_at": format_instant(a.assigned_at),
            }
            for a in sorted(snapshot.assignments.values(), key=lambda a: a.agent)
        ],
        "waiting": [
            {
                "agent": r.agent,
                "turn": r.turn_ref,
                "due_at": format_instant(r.due_at),
                "scheduled_at": format_instant(r.scheduled_at),
                "claimed_until": format_instant(r.claimed_until),
            }
            for r in sorted(snapshot.retries.values(), key=lambda r: (r.due_at, r.turn_ref))
        ],
        "cooldowns": [
            {"agent": agent, "gateway_until": format_instant(until)}
            for agent, until in sorted(snapshot.gateway_until.items())
        ],
    }


def _reading_json(reading: Reading) -> dict[str, Any]:
    windows = {"five_hour": reading.five_hour, "seven_day": reading.seven_day}
    return {
        "at": format_instant(reading.at),
        "status": reading.status,
        "resets_at": format_instant(reading.resets_at),
        **{
            name: None
            if w is None
            else {
                "utilization": w.utilization,
                "resets_at": format_instant(w.resets_at),
                "status": w.status,
            }
            for name, w in windows.items()
        },
    }


def render_table(rows: list[CredentialRow], snapshot: PoolSnapshot) -> str:
    """The rows as a table, then the agents waiting for capacity."""
    header = ("CREDENTIAL", "KIND", "STATE", "RESETS AT", "5H", "7D", "LAST FAILURE", "AGENTS")
    table = [header]
    for row in rows:
        failure = row.last_failure
        table.append(
            (
                row.credential,
                row.kind,
                row.state,
                format_instant(row.resets_at) or "-",
                _percent(row.five_hour_use),
                _percent(row.seven_day_use),
                f"{failure.kind} {format_instant(failure.at)}" if failure else "-",
                ",".join(row.assigned_agents) or "-",
            )
        )
    widths = [max(len(cells[i]) for cells in table) for i in range(len(header))]
    lines = [
        "  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip()
        for cells in table
    ]
    for retry in sorted(snapshot.retries.values(), key=lambda r: (r.agent, r.due_at)):
        due = format_instant(retry.due_at)
        lines.append(f"{retry.agent}: turn {retry.turn_ref} waiting for capacity, retry at {due}")
    return "\n".join(lines)


def _percent(use: float | None) -> str:
    return "-" if use is None else f"{use:.0%}"
