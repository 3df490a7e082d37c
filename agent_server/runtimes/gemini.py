"""Gemini CLI: `gemini --output-format stream-json [--model m] [--resume id] --yolo --skip-trust`.

It honours `model` (`--model`), `resume_session_id` (`--resume <session uuid>`) and
`system_prompt`, prepended to the prompt: its only system-prompt setting
(`GEMINI_SYSTEM_MD`) replaces the CLI's own instructions, tool rules included, where
Claude Code appends. `--yolo` allows every tool and the CLI keeps every session on
disk, so `allowed_tools` and `persist_session: false` are taken and named as not
enforced; it has no turn cap and takes no images on stdin, so those are refused.

Headless in any workdir (contract §6.3): `--skip-trust` trusts the workdir for that
run only (no trustedFolders.json is written), and a settings file of the server's
(`spawn_files`) turns the CLI's own API retries off (a refusal reaches the controller
at once, not after ten tries over minutes) and its session cleanup off (which would
delete a concurrent turn's session before its first answer), and, when
`GOOGLE_GEMINI_BASE_URL` is set, selects the API-key auth type, without which Gemini
CLI 0.61 exits 41 `Invalid auth method selected.`.

With stdin not a terminal and no prompt flag, Gemini CLI runs non-interactively and
reads the prompt from stdin (never argv, where `ps` would show it). Its stream-json
events: `init` (session id, model), `message` (assistant deltas), `error` (a warning
or error text), and the final `result` (`status`, `error: {type, message}`, `stats`).

Its API errors quote Google's JSON bodies, e.g.
`{"error":{"code":429,"message":"…","status":"RESOURCE_EXHAUSTED"}}`: the numeric
code becomes `api_error_status` and the status `api_error_type`, which the classifier
reads as structured facts. Some (429, 503) it words without the body; it then exits
with the HTTP status mod 256, which `OutcomeHints.exit_statuses` reads back. Its own
exit codes: 41 (no usable auth: a missing key is auth, any other cause the
container's), 53 (turn limit) and 55 (an untrusted workdir).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from agent_server.runtimes.base import OutcomeHints, SpawnHost, StreamParser, TurnSpec
from agent_server.runtimes.error_vocabulary import ERROR_CODES, NOT_FOUND_CODES, TEXT_MARKERS
from agent_server.runtimes.events import (
    add_error_text,
    as_float,
    as_int,
    as_model_id,
    as_session_id,
    as_str,
    decode_event,
)
from agent_server.runtimes.gemini_resets import RESET_PARSERS
from agent_server.runtimes.stream import TurnStream
from agent_server.spawn_env.spawn_files import SpawnFile
from agent_server.wire.names import (
    GEMINI_BASE_URL,
    GEMINI_KEY,
    GEMINI_SWITCHES,
    GOOGLE_KEY,
    Api,
    OutcomeKind,
)

__all__ = ["GeminiAdapter", "GeminiStreamParser", "error_body_facts"]

_ERROR_CODE = re.compile(r'"code"\s*:\s*"?(?P<code>[1-5]\d\d)\b')
_ERROR_STATUS = re.compile(r'"status"\s*:\s*"(?P<status>[A-Z][A-Z_]+)"')
# Errors quoted in prose, e.g. `[API Error: got status: 429 Too Many Requests. …]`.
_STATUS_IN_PROSE = re.compile(r"\bstatus(?: code)?:?\s+(?P<code>[1-5]\d\d)\b", re.IGNORECASE)


def error_body_facts(text: str) -> tuple[int | None, str | None]:
    """The HTTP code and Google status (`RESOURCE_EXHAUSTED`) quoted in an error text."""
    code_match = _ERROR_CODE.search(text) or _STATUS_IN_PROSE.search(text)
    status_match = _ERROR_STATUS.search(text)
    code = int(code_match["code"]) if code_match else None
    return code, status_match["status"] if status_match else None


class GeminiStreamParser:
    """Parses Gemini CLI stream-json, one line at a time, into a `TurnStream`."""

    def __init__(self) -> None:
        self.stream = TurnStream()
        self.last_event: dict[str, Any] | None = None

    def feed(self, line: bytes) -> bool:
        """Parse one stdout line; True for the final `result` event."""
        event = self.last_event = decode_event(line)
        if event is None:
            return False
        stream = self.stream
        kind = event.get("type")
        if kind == "init":
            stream.session_id = as_session_id(event.get("session_id")) or stream.session_id
            stream.model = as_model_id(event.get("model")) or stream.model
        elif kind == "message" and event.get("role") == "assistant":
            # Deltas are fragments of one reply: kept whole, joined for the result text.
            stream.add_assistant_text(as_str(event.get("content")) or "")
        elif kind == "error":
            # `severity: warning` is noise the CLI recovered from; it is kept on the
            # error channel anyway, since it only counts when the turn fails.
            self._error_text(as_str(event.get("message")))
        elif kind == "result":
            self._result(event)
            return True
        return False

    def _error_text(self, text: str | None) -> None:
        if text is None:
            return
        add_error_text(self.stream, text)
        code, status = error_body_facts(text)
        if code is not None:
            self.stream.api_error_status = code
        if status is not None:
            self.stream.api_error_type = status

    def _result(self, event: dict[str, Any]) -> None:
        stream = self.stream
        stream.has_result = True
        stream.is_error = event.get("status") == "error"
        stream.result_text = "".join(stream.assistant_text) or None
        error = event.get("error")
        if isinstance(error, dict):
            stream.is_error = True
            stream.api_error = as_str(error.get("type")) or stream.api_error
            self._error_text(as_str(error.get("message")))
            code = as_int(error.get("code"))
            if code is not None:
                stream.api_error_status = code
        stats = event.get("stats")
        if isinstance(stats, dict):
            stream.input_tokens = as_int(stats.get("input_tokens", stats.get("input")))
            stream.output_tokens = as_int(stats.get("output_tokens"))
            duration = as_float(stats.get("duration_ms"))
            stream.duration_ms = int(duration) if duration is not None else None


def _hints() -> OutcomeHints:
    # FatalAuthenticationError exits 41 (its missing-key text is matched first, as auth),
    # FatalTurnLimitedError 53, an untrusted workdir 55; an API error exits with its status.
    refused = "Gemini CLI refuses to run here: "
    return OutcomeHints(
        label="Gemini CLI",
        exit_codes={
            41: OutcomeKind.CONTAINER_FAULT,
            53: OutcomeKind.MAX_TURNS,
            55: OutcomeKind.CONTAINER_FAULT,
        },
        exit_statuses={status % 256: status for status in API_STATUSES},
        permission_refusals={
            "not running in a trusted directory": refused + "it does not trust the workdir",
            "Invalid auth method selected": refused + "it has no auth method it can use "
            "(Invalid auth method selected)",
        },
        error_markers=(
            ("you must specify the gemini_api_key", OutcomeKind.AUTH),
            ("please set an auth method", OutcomeKind.AUTH),
            ("exceeded your current quota", OutcomeKind.RATE_LIMIT),
            ("exhausted your daily quota", OutcomeKind.RATE_LIMIT),
        ),
        unknown_session_markers=("error resuming session",),
        error_codes=ERROR_CODES,
        not_found_codes=NOT_FOUND_CODES,
        text_markers=TEXT_MARKERS,
        reset_parsers=RESET_PARSERS,
    )


API_STATUSES = (400, 401, 403, 404, 429, 500, 502, 503, 504)
"""The API statuses Gemini CLI may exit with (mod 256: 429 exits 173)."""
SYSTEM_DEFAULTS = "GEMINI_CLI_SYSTEM_DEFAULTS_PATH"
AUTH_SELECTORS = GEMINI_SWITCHES
"""Variables by which the environment already chooses an auth type over an API key."""
CREDENTIAL_VARIABLES = (
    GEMINI_KEY,
    GOOGLE_KEY,
    "GOOGLE_CLOUD_PROJECT",
    "GOOGLE_GENAI_USE_GCA",
    "GEMINI_CLI_USE_COMPUTE_ADC",
    "CLOUD_SHELL",
)
"""Any of these gives Gemini CLI something to authenticate with (contract §8)."""


def headless_settings(env: Mapping[str, str]) -> dict[str, Any]:
    """The settings a spawn with `env` needs to run headless: its own retries off, its
    session cleanup off, and the API-key auth type when a base URL is set and nothing
    else chooses one.

    Gemini CLI 0.61 sweeps its project's chats at every start and deletes each session
    with nothing resumable in it yet: a concurrent turn's, before its model answered.
    That turn's session is then gone, and resuming it fails "Invalid session
    identifier" (seen in the conformance tier, three turns at once in one workdir)."""
    general = {"maxAttempts": 1, "sessionRetention": {"enabled": False}}
    settings: dict[str, Any] = {"general": general}
    if env.get(GEMINI_BASE_URL) and not any(env.get(name) == "true" for name in AUTH_SELECTORS):
        settings["security"] = {"auth": {"selectedType": "gemini-api-key"}}
    return settings


class GeminiAdapter:
    """Gemini CLI: authenticates with its own key or login; no Claude credential."""

    name = "gemini-cli"
    aliases: tuple[str, ...] = ("gemini",)
    default_command = "gemini"
    hints = _hints()
    supports_auth_override = False
    brokered = True
    api: Api = "gemini"
    credential_descriptors: Mapping[str, str] = {}
    reports_permission_mode = False
    assigns_session_id = False
    honours = frozenset({"model", "system_prompt", "resume_session_id"})
    not_enforced = frozenset({"allowed_tools", "persist_session"})

    def argv(self, command: str, turn: TurnSpec) -> list[str]:
        """`gemini --output-format stream-json [--model m] [--resume id] --yolo --skip-trust`.

        `--yolo` is the CLI's equivalent of Claude's bypassPermissions: a headless
        turn has no one to approve a tool call. `--skip-trust` is a flag, not the
        environment variable, so a release that drops it fails loudly (exit 1).
        """
        argv = [command, "--output-format", "stream-json"]
        if turn.model:
            argv += ["--model", turn.model]
        if turn.resume_session_id:
            argv += ["--resume", turn.resume_session_id]
        argv += ["--yolo", "--skip-trust"]
        return argv

    def stdin(self, turn: TurnSpec) -> bytes:
        """The prompt, UTF-8, after the system prompt when there is one."""
        if not turn.system_prompt:
            return turn.prompt.encode("utf-8")
        return f"{turn.system_prompt}\n\n---\n\n{turn.prompt}".encode()

    def new_parser(self) -> StreamParser:
        """A fresh stream-json parser for one turn."""
        return GeminiStreamParser()

    def spawn_files(self, env: Mapping[str, str]) -> tuple[SpawnFile, ...]:
        """Gemini's system defaults, the lowest settings layer: the agent's own
        `~/.gemini/settings.json` and its workspace settings still win over them.

        Gemini CLI reads a system file only when root owns it and every directory
        above it, so only a server running as root can hand it one.
        """
        content = json.dumps(headless_settings(env), sort_keys=True).encode()
        return (SpawnFile(SYSTEM_DEFAULTS, "gemini-system-defaults.json", content),)

    def readiness_problems(self, env: Mapping[str, str], host: SpawnHost) -> list[str]:
        """Restricted mode (no flag overrides it), or no credential at all."""
        problems = []
        if env.get("GEMINI_RESTRICTED_MODE") == "true":
            problems.append(
                "gemini-cli runs in restricted mode (GEMINI_RESTRICTED_MODE=true): it trusts "
                "no workdir and refuses every headless turn"
            )
        home = Path(env.get("GEMINI_CLI_HOME") or env.get("HOME") or os.sep)
        login = home / ".gemini" / "oauth_creds.json"
        if not any(env.get(name) for name in CREDENTIAL_VARIABLES) and not host.present(login):
            problems.append(
                "gemini-cli has no credential: no GEMINI_API_KEY, GOOGLE_API_KEY, Vertex AI "
                "project or Google login (~/.gemini/oauth_creds.json)"
            )
        return problems
