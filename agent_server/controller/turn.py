"""What one walk is asked to do: the agent, the prompt, and how much time it has."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class WalkTurn:
    """One turn for the walk: the agent, the prompt, and how much time it has in all."""

    agent: str
    message: str
    interactive: bool = False
    """A person waits for it: a last resort may be any skipped subscription."""
    execution_id: str | None = None
    """Re-issued unchanged on every rung; generated when None."""
    timeout_s: float = 900.0
    """The whole walk's time; each attempt gets what is left (less a settle margin)."""
    model: str | None = None
    system_prompt: str | None = None
