"""The runtime adapter protocol: how one agent CLI is spawned and read.

An adapter knows three things about its CLI: the argv of one turn (the prompt goes
on stdin, never argv), how to parse its stdout stream into a `TurnStream`, and
whether it can take a Claude credential override. Everything else (process groups,
env layering, classification, HTTP) is shared.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from agent_server.execution.stream import TurnStream


@dataclass(frozen=True)
class TurnSpec:
    """One turn as the adapter needs it to build argv and stdin."""

    prompt: str
    permission_mode: str
    model: str | None = None
    system_prompt: str | None = None
    allowed_tools: tuple[str, ...] | None = None
    max_turns: int | None = None
    resume_session_id: str | None = None
    """Continue this session (`--resume`)."""
    new_session_id: str | None = None
    """Start a session with this id (`--session-id`), when not resuming."""
    persist_session: bool = True


class StreamParser(Protocol):
    """Parses one turn's stdout incrementally, line by line, into `stream`."""

    stream: TurnStream

    def feed(self, line: bytes) -> bool:
        """Parse one stdout line (no newline); return True when it is the final result."""
        ...


class RuntimeAdapter(Protocol):
    """One agent CLI: its argv, its stream parser, and what it supports."""

    name: str
    """The canonical runtime name: `claude-code`, `codex` or `gemini-cli`."""
    label: str
    """Human name used in messages, e.g. `Claude Code`."""
    supports_auth_override: bool
    reports_permission_mode: bool
    """True when the CLI's init event reports the permission mode it runs under."""

    def argv(self, command: str, turn: TurnSpec) -> list[str]:
        """The full argv of one turn (the prompt is never in it)."""
        ...

    def stdin(self, turn: TurnSpec) -> bytes:
        """What the turn writes to the CLI's stdin."""
        ...

    def new_parser(self) -> StreamParser:
        """A fresh parser for one turn's stdout."""
        ...
