"""What the walk tells the controller as it goes: one event a phase, to a hook and the log.

An event names credentials by id only: never a secret, a prompt, a response or a
transcript, so a hook may forward it anywhere (a dashboard, a chat channel).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

from agent_server.controller.clock import Clock
from agent_server.wire.instants import format_instant

logger = logging.getLogger("agent_server.controller")


class WalkPhase(StrEnum):
    """The phases of a walk, and of the retries and assignments around it."""

    STARTED = "started"
    CANDIDATE_SELECTED = "candidate_selected"
    ATTEMPT_FAILED = "attempt_failed"
    SERVED = "served"
    COMMITTED = "committed"
    COMMIT_LOST = "commit_lost"
    WAITING_FOR_CAPACITY = "waiting_for_capacity"
    RETRY_DUE = "retry_due"
    SUPERSEDED = "superseded"
    SWITCHED_BACK = "switched_back"
    ASSIGNED = "assigned"
    SWITCH_STARTED = "switch_started"
    """The walk left the agent's assignment for another credential."""
    STABILIZING = "stabilizing"
    """A newly committed credential: a refusal now is an `immediate_hard_limit`."""
    STABILIZED = "stabilized"
    """A turn that started after the commit was served on it."""
    CLEARED = "cleared"
    """An operator forgot a credential's failures (a rotated token)."""
    UNATTRIBUTED = "unattributed"
    """The server ran a credential the pool does not know: nothing was blamed."""
    AT_CEILING = "at_ceiling"
    """A credential had its ceiling of turns in flight: the walk passed it over."""
    PROBE_SPACED = "probe_spaced"
    """A failed credential was probed too recently: the walk passed it over."""


@dataclass(frozen=True)
class WalkEvent:
    """One phase of one agent's walk."""

    phase: WalkPhase
    agent: str
    at: datetime
    credential_id: str | None = None
    error_code: str | None = None
    resets_at: datetime | None = None
    note: str | None = None
    """A few words of ours (the rung's reason, the trail): never text from the turn."""

    def as_json(self) -> dict[str, str | None]:
        """The event as JSON (the schema in docs/controller.md, "Events"): every value a
        string or null, instants as `format_instant` writes them; never a secret."""
        return {
            "phase": self.phase.value,
            "agent": self.agent,
            "at": format_instant(self.at),
            "credential": self.credential_id,
            "error_code": self.error_code,
            "resets_at": format_instant(self.resets_at),
            "note": self.note,
        }

    def line(self) -> str:
        """The event as one log line."""
        parts = [f"walk {self.phase.value}: agent {self.agent}"]
        if self.credential_id is not None:
            parts.append(f"credential {self.credential_id}")
        if self.error_code is not None:
            parts.append(f"error {self.error_code}")
        if self.resets_at is not None:
            parts.append(f"resets {format_instant(self.resets_at)}")
        if self.note:
            parts.append(self.note)
        return ", ".join(parts)


EventHook = Callable[[WalkEvent], None]


def emit(hook: EventHook | None, event: WalkEvent) -> None:
    """Log `event` and hand it to the hook (a failing hook is logged, never raised)."""
    logger.info("%s", event.line())
    if hook is None:
        return
    try:
        hook(event)
    except Exception:
        logger.exception("the walk's event hook failed on %s", event.phase.value)


@dataclass(frozen=True)
class Announcer:
    """Stamps and emits the events of one walker (and of each walk it runs)."""

    hook: EventHook | None
    clock: Clock

    def __call__(
        self,
        phase: WalkPhase,
        agent: str,
        credential_id: str | None = None,
        *,
        error_code: str | None = None,
        resets_at: datetime | None = None,
        note: str | None = None,
    ) -> WalkEvent:
        """Emit one event, stamped now; the event is returned for tests and callers."""
        event = WalkEvent(phase, agent, self.clock(), credential_id, error_code, resets_at, note)
        emit(self.hook, event)
        return event
