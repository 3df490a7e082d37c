"""Gemini CLI: `gemini --output-format stream-json [--model m] [--resume id] --yolo`.

It honours `model` (`--model`) and `resume_session_id` (`--resume <session uuid>`);
it has no flag for an appended system prompt, a turn cap or a session kept off disk,
and `--yolo` already allows every tool, so a turn asking for one of those is refused.

With stdin not a terminal and no prompt flag, Gemini CLI runs non-interactively and
reads the prompt from stdin (never argv, where `ps` would show it). Its stream-json
events: `init` (session id, model), `message` (assistant deltas), `error` (a warning
or error text), and the final `result` (`status`, `error: {type, message}`, `stats`).

Its API errors quote Google's JSON bodies, e.g.
`{"error":{"code":429,"message":"…","status":"RESOURCE_EXHAUSTED"}}`: the numeric
code becomes `api_error_status` and the status `api_error_type`, which the classifier
reads as structured facts. Its exit codes 41 (auth) and 53 (turn limit) are hints to
the classifier too.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from agent_server.names import OutcomeKind
from agent_server.runtimes.base import OutcomeHints, StreamParser, TurnSpec
from agent_server.runtimes.events import (
    add_error_text,
    as_float,
    as_int,
    as_model_id,
    as_session_id,
    as_str,
    decode_event,
)
from agent_server.runtimes.stream import TurnStream

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


class GeminiAdapter:
    """Gemini CLI: authenticates with its own key or login; no Claude credential."""

    name = "gemini-cli"
    aliases: tuple[str, ...] = ("gemini",)
    default_command = "gemini"
    # FatalAuthenticationError exits 41, FatalTurnLimitedError 53.
    hints = OutcomeHints(
        label="Gemini CLI", exit_codes={41: OutcomeKind.AUTH, 53: OutcomeKind.MAX_TURNS}
    )
    supports_auth_override = False
    credential_descriptors: Mapping[str, str] = {}
    reports_permission_mode = False
    assigns_session_id = False
    honours = frozenset({"model", "resume_session_id"})

    def argv(self, command: str, turn: TurnSpec) -> list[str]:
        """`gemini --output-format stream-json [--model m] [--resume id] --yolo`; prompt on stdin.

        `--yolo` is the CLI's equivalent of Claude's bypassPermissions: a headless
        turn has no one to approve a tool call.
        """
        argv = [command, "--output-format", "stream-json"]
        if turn.model:
            argv += ["--model", turn.model]
        if turn.resume_session_id:
            argv += ["--resume", turn.resume_session_id]
        argv.append("--yolo")
        return argv

    def stdin(self, turn: TurnSpec) -> bytes:
        """The prompt, UTF-8."""
        return turn.prompt.encode("utf-8")

    def new_parser(self) -> StreamParser:
        """A fresh stream-json parser for one turn."""
        return GeminiStreamParser()
