"""The runtime adapter protocol: how one agent CLI is spawned and read.

An adapter owns every fact about its CLI: its names and default command, the argv
of one turn (the prompt goes on stdin, never argv), which optional turn fields it
honours and which it takes without being able to enforce them, how to parse its
stdout into a `TurnStream`, whether it can take a Claude credential, what its errors
look like (`OutcomeHints`: the codes, markers, exit codes and reset wordings the outcome
table reads, which spells none of its own), the files it needs to run headless
(`SpawnFile`), and why it could not run a turn here at all (`readiness_problems`).
Everything else (process groups, env layering, classification, HTTP) is shared.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol

from agent_server.runtimes.stream import TurnStream
from agent_server.spawn_env.spawn_files import SpawnFile
from agent_server.wire.names import AUTH_OVERRIDE_KINDS, Api, AuthOverrideKind, OutcomeKind

TURN_OPTIONS = (
    "model",
    "system_prompt",
    "allowed_tools",
    "max_turns",
    "resume_session_id",
    "persist_session",
    "images",
)
"""The optional turn fields a runtime may honour (contract §6.1)."""


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
    """Continue this session."""
    new_session_id: str | None = None
    """Start a session with this id, when not resuming (only `assigns_session_id` CLIs)."""
    persist_session: bool = True
    images: tuple[tuple[str, str], ...] = ()
    """(media type, base64 data) of each image sent with the prompt."""
    setting_sources: tuple[str, ...] | None = None
    """The settings files a CLI that can restrict them loads (None: its default)."""
    api_base: str | None = None
    """The broker's base URL when it holds the turn's credential (contract §4.8): a CLI
    that takes its API's base on argv only (Codex) is given it there."""


ResetParser = Callable[[str, datetime], datetime | None]
"""Reads the instant a rate limit resets in one error text (given `now`), or None."""


@dataclass(frozen=True)
class OutcomeHints:
    """What the outcome table must know about one CLI to read its stream, its error texts
    and its exit: every code, marker and wording is the CLI's (or its API's), never the
    table's."""

    label: str
    """Human name used in messages, e.g. `Claude Code`."""
    exit_codes: Mapping[int, OutcomeKind] = field(default_factory=dict)
    """Exit statuses that name a cause by themselves."""
    permission_refusals: Mapping[str, str] = field(default_factory=dict)
    """stderr marker -> what it means: the CLI refused the permission mode (row 1)."""
    model_rejection_markers: Mapping[str, str] = field(default_factory=dict)
    """stderr marker of an unknown model id, believed only when nothing was used (row 5)
    -> how a message of another outcome spells it (the controller reads the marker)."""
    unknown_session_markers: tuple[str, ...] = ()
    """Error text (lower case) saying the session to resume does not exist."""
    error_markers: tuple[tuple[str, OutcomeKind], ...] = ()
    """The CLI's own error texts (lower case) -> their outcome, read on error channels
    before its exit status and the shared markers (rows 5-10)."""
    exit_statuses: Mapping[int, int] = field(default_factory=dict)
    """Exit statuses that carry the API's HTTP status (Gemini CLI exits with it, mod 256)."""
    error_codes: Mapping[str, OutcomeKind] = field(default_factory=dict)
    """Structured error codes (lower case) of the stream -> the row they name (rows 5-9)."""
    not_found_codes: frozenset[str] = frozenset()
    """Error types that, with a 404, say the model is unknown (row 5)."""
    max_turn_reasons: frozenset[str] = frozenset()
    """A result's terminal reason or subtype that says it stopped at its turn cap (row 10)."""
    text_markers: tuple[tuple[re.Pattern[str], OutcomeKind], ...] = ()
    """Patterns of error texts -> their row, read on error channels after everything else."""
    reset_parsers: tuple[ResetParser, ...] = ()
    """Readers of the CLI's reset wordings, most explicit first (`outcome.resets`)."""

    def session_unknown(self, texts: Sequence[str]) -> bool:
        """True when one of these error texts says the session to resume does not exist."""
        markers = self.unknown_session_markers
        return any(marker in text.lower() for text in texts for marker in markers)


@dataclass(frozen=True)
class SpawnHost:
    """Where a spawn would run: what `readiness_problems` reads besides its environment."""

    uid: int
    """The uid the spawn runs as."""
    permission_mode: str
    present: Callable[[Path], bool]
    """Whether a file exists (the CLI's own login, say); the only I/O, handed in."""


class StreamParser(Protocol):
    """Parses one turn's stdout incrementally, line by line, into `stream`."""

    stream: TurnStream
    last_event: dict[str, Any] | None
    """The JSON object the last line fed held, or None (the transcript keeps it)."""

    def feed(self, line: bytes) -> bool:
        """Parse one stdout line (no newline); return True when it is the final result."""
        ...


class RuntimeAdapter(Protocol):
    """One agent CLI: its names, argv, stream parser, and what it supports."""

    name: str
    """The canonical runtime name: `claude-code`, `codex` or `gemini-cli`."""
    aliases: tuple[str, ...]
    """Other spellings `AGENT_RUNTIME` accepts."""
    default_command: str
    """The executable when `AGENT_SERVER_RUNTIME_COMMAND` is unset."""
    hints: OutcomeHints
    supports_auth_override: bool
    """True when the CLI authenticates with Claude credentials (and so takes an override)."""
    brokered: bool
    """True when the broker can stand in for its credential (contract §4.8)."""
    api: Api
    """The API its CLI talks to: how the broker places its credential."""
    credential_descriptors: Mapping[str, str]
    """Credential variable -> the variable that hands it on a descriptor instead (§4.7)."""
    reports_permission_mode: bool
    """True when the CLI's init event reports the permission mode it runs under."""
    assigns_session_id: bool
    """True when a new session's id is chosen by us and passed on argv."""
    honours: frozenset[str]
    """The optional turn fields (of `TURN_OPTIONS`) this CLI takes."""
    not_enforced: frozenset[str]
    """Turn fields it accepts without being able to enforce them: the turn runs, logs a
    WARNING, and its answer names them in `metadata.not_enforced` (contract §6.1)."""

    def argv(self, command: str, turn: TurnSpec) -> list[str]:
        """The full argv of one turn (the prompt is never in it)."""
        ...

    def stdin(self, turn: TurnSpec) -> bytes:
        """What the turn writes to the CLI's stdin."""
        ...

    def new_parser(self) -> StreamParser:
        """A fresh parser for one turn's stdout."""
        ...

    def spawn_files(self, env: Mapping[str, str]) -> tuple[SpawnFile, ...]:
        """The files a spawn with `env` needs the server to write for it (pure)."""
        ...

    def readiness_problems(self, env: Mapping[str, str], host: SpawnHost) -> list[str]:
        """Why a turn could not run with `env` on `host`: one sentence each, names only,
        never a value (pure but for `host.present`)."""
        ...


KEY_OVERRIDE_KINDS: tuple[AuthOverrideKind, ...] = ("api_key", "provider")
"""What a CLI of a key-only API takes per turn: a key, or a gateway's URL and token."""


def override_kinds(adapter: RuntimeAdapter, brokered: bool) -> tuple[AuthOverrideKind, ...]:
    """The `auth_override` kinds a turn of `adapter` takes (contract §6.2): every kind for
    a CLI of Claude credentials; a key or a provider for another, with the broker only
    (without it, the CLI's own configuration would choose where the key goes)."""
    if adapter.supports_auth_override:
        return AUTH_OVERRIDE_KINDS
    return KEY_OVERRIDE_KINDS if brokered and adapter.brokered else ()
