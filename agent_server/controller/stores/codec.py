"""How both stores write a record: JSON, every instant as integer microseconds (UTC).

One codec keeps SQLite and Redis reading the same values back; no instant is ever
kept or compared as text.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import replace
from datetime import datetime
from typing import Any, cast

from agent_server.controller.clock import from_micros, to_micros
from agent_server.controller.pool.state import (
    FAILURE_KINDS,
    Assignment,
    Failure,
    FailureKind,
    Reading,
    ScheduledRetry,
    WindowUse,
)


def micros(instant: datetime | None) -> int | None:
    """An optional instant as microseconds."""
    return None if instant is None else to_micros(instant)


def instant(value: object) -> datetime | None:
    """Microseconds back to an instant (anything else: None)."""
    return from_micros(value) if isinstance(value, int) and not isinstance(value, bool) else None


def decode_assignment(agent: str, text: str) -> Assignment:
    """An assignment back from the Redis script's JSON (SQLite keeps it in columns)."""
    data = json.loads(text)
    return Assignment(
        agent, data["credential_id"], int(data["generation"]), from_micros(data["assigned_at"])
    )


def encode_failure(failure: Failure) -> str:
    """A failure as the stores keep it."""
    return json.dumps(
        {
            "kind": failure.kind,
            "at": to_micros(failure.at),
            "resets_at": micros(failure.resets_at),
            "agent": failure.agent,
        }
    )


def decode_failure(credential_id: str, text: str) -> Failure | None:
    """A failure back, or None for a kind this version does not know."""
    data = json.loads(text)
    if data.get("kind") not in FAILURE_KINDS:
        return None
    return Failure(
        credential_id,
        cast(FailureKind, data["kind"]),
        from_micros(data["at"]),
        instant(data.get("resets_at")),
        data.get("agent"),
    )


def decode_failures(rows: Iterable[tuple[str, str]]) -> dict[str, dict[FailureKind, Failure]]:
    """(credential id, failure) rows by credential and kind, as a snapshot holds them."""
    by_credential: dict[str, dict[FailureKind, Failure]] = {}
    for credential_id, text in rows:
        failure = decode_failure(credential_id, text)
        if failure is not None:
            by_credential.setdefault(credential_id, {})[failure.kind] = failure
    return by_credential


def _window(window: WindowUse | None) -> dict[str, Any] | None:
    if window is None:
        return None
    return {
        "utilization": window.utilization,
        "resets_at": micros(window.resets_at),
        "status": window.status,
    }


def _window_back(data: object) -> WindowUse | None:
    if not isinstance(data, dict):
        return None
    return WindowUse(data.get("utilization"), instant(data.get("resets_at")), data.get("status"))


def encode_reading(reading: Reading) -> str:
    """A reading as the stores keep it."""
    return json.dumps(
        {
            "at": to_micros(reading.at),
            "status": reading.status,
            "resets_at": micros(reading.resets_at),
            "five_hour": _window(reading.five_hour),
            "seven_day": _window(reading.seven_day),
        }
    )


def decode_reading(credential_id: str, text: str) -> Reading:
    """A reading back from `encode_reading`."""
    data = json.loads(text)
    return Reading(
        credential_id,
        from_micros(data["at"]),
        data.get("status"),
        instant(data.get("resets_at")),
        _window_back(data.get("five_hour")),
        _window_back(data.get("seven_day")),
    )


def encode_retry(retry: ScheduledRetry) -> str:
    """A scheduled retry as the stores keep it."""
    return json.dumps(
        {
            "agent": retry.agent,
            "retry_id": retry.retry_id,
            "due_at": to_micros(retry.due_at),
            "assignment_generation": retry.assignment_generation,
            "turn_ref": retry.turn_ref,
            "scheduled_at": to_micros(retry.scheduled_at),
        }
        | ({} if retry.request is None else {"request": retry.request})
    )


def with_claim(retry: ScheduledRetry, claimed_us: int | None) -> ScheduledRetry:
    """`retry` with the claim a store keeps beside it (microseconds, or none)."""
    return replace(retry, claimed_until=instant(claimed_us))


def decode_retry(text: str) -> ScheduledRetry:
    """A scheduled retry back from `encode_retry`."""
    data = json.loads(text)
    return ScheduledRetry(
        data["agent"],
        data["retry_id"],
        from_micros(data["due_at"]),
        data.get("assignment_generation"),
        data["turn_ref"],
        from_micros(data["scheduled_at"]),
        request=data.get("request"),
    )
