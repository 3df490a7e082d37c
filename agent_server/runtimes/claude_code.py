"""Claude Code: `claude --print --output-format stream-json`, prompt on stdin.

The stream-json events this reads (see tests/fixtures/claude-code-2.1.328):
`system/init` (session, model, permission mode, `apiKeySource`), `system/api_retry`,
`assistant` (prose, or an API-error message with `error`, `api_error_status`,
`api_error`, `api_error_type`, `api_error_params.rate_limit_info`),
`rate_limit_event` (a rejection classifies the turn; the last reading of any status is
the turn's headroom, `rate_limit.py`), and the final `result`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from agent_server.runtimes.base import (
    TURN_OPTIONS,
    OutcomeHints,
    SpawnHost,
    StreamParser,
    TurnSpec,
)
from agent_server.runtimes.claude_code_resets import RESET_PARSERS
from agent_server.runtimes.error_vocabulary import ERROR_CODES, NOT_FOUND_CODES, TEXT_MARKERS
from agent_server.runtimes.events import (
    add_error_text,
    as_float,
    as_int,
    as_model_id,
    as_session_id,
    as_str,
    decode_event,
    one_of,
)
from agent_server.runtimes.rate_limit import read_rate_limit
from agent_server.runtimes.stream import TurnStream
from agent_server.spawn_env.spawn_files import SpawnFile
from agent_server.wire.names import BYPASS_PERMISSIONS, CLAUDE_DESCRIPTORS, Api, OutcomeKind

__all__ = ["ClaudeCodeAdapter", "ClaudeStreamParser"]

API_KEY_SOURCES = frozenset(
    {"none", "ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "apiKeyHelper", "/login managed key"}
)
"""What init's `apiKeySource` says (anything else is reported as `other`)."""
# The retry events the classifier reads are few; a CLI retrying for minutes is not.
MAX_API_RETRIES = 64
_RETRY_KEYS = ("attempt", "max_retries", "retry_delay_ms", "error_status", "error")
UNRECOGNIZED_MODEL = "[claude-code:unrecognized_model]"
"""Its stderr marker of a model id it does not know (any model a gateway serves, too)."""


class ClaudeStreamParser:
    """Parses Claude Code's stream-json, one line at a time, into a `TurnStream`."""

    def __init__(self) -> None:
        self.stream = TurnStream()
        self.last_event: dict[str, Any] | None = None

    def feed(self, line: bytes) -> bool:
        """Parse one stdout line; True when it is the final `result` event."""
        event = self.last_event = decode_event(line)
        if event is None:
            return False
        kind = event.get("type")
        if self.stream.session_id is None:
            self.stream.session_id = as_session_id(event.get("session_id"))
        if kind == "system":
            self._system(event)
        elif kind == "assistant":
            self._assistant(event)
        elif kind == "rate_limit_event":
            info = event.get("rate_limit_info")
            self._rate_limit(info, require_rejected=True)
            self.stream.rate_limit = read_rate_limit(info) or self.stream.rate_limit
        elif kind == "result":
            self._result(event)
            return True
        return False

    def _system(self, event: dict[str, Any]) -> None:
        subtype = event.get("subtype")
        if subtype == "init":
            stream = self.stream
            stream.session_id = as_session_id(event.get("session_id")) or stream.session_id
            stream.model = as_model_id(event.get("model")) or stream.model
            stream.permission_mode = as_str(event.get("permissionMode"))
            stream.api_key_source = one_of(event.get("apiKeySource"), API_KEY_SOURCES)
        elif subtype == "api_retry" and len(self.stream.api_retries) < MAX_API_RETRIES:
            self.stream.api_retries.append({k: event[k] for k in _RETRY_KEYS if k in event})

    def _assistant(self, event: dict[str, Any]) -> None:
        texts = _text_blocks(event.get("message"))
        is_api_error = bool(event.get("is_api_error_message")) or event.get("error") is not None
        if not is_api_error:
            for text in texts:
                self.stream.add_assistant_text(text)
            message = event.get("message")
            if isinstance(message, dict) and isinstance(message.get("usage"), dict):
                self._call_usage(message["usage"])
            return
        # An API-error message is the CLI talking about the API, not the model's prose.
        stream = self.stream
        code = as_str(event.get("error"))
        if code is not None and code not in stream.error_codes:
            stream.error_codes.append(code)
        _take_api_error_fields(stream, event)
        for text in texts:
            add_error_text(stream, text)
        params = event.get("api_error_params")
        if isinstance(params, dict):
            self._rate_limit(params.get("rate_limit_info"), require_rejected=False)

    def _call_usage(self, usage: dict[str, Any]) -> None:
        """The last model call's prompt: its input, and what the cache read and wrote."""
        stream = self.stream
        stream.call_input_tokens = as_int(usage.get("input_tokens"))
        stream.cache_read_tokens = as_int(usage.get("cache_read_input_tokens"))
        stream.cache_creation_tokens = as_int(usage.get("cache_creation_input_tokens"))

    def _rate_limit(self, info: object, *, require_rejected: bool) -> None:
        # A rate_limit_event also reports `allowed` windows; only a rejection counts.
        # The info attached to an API error is kept unless it says it was not rejected.
        if not isinstance(info, dict):
            return
        status = info.get("status")
        if status == "rejected" or (not require_rejected and status is None):
            self.stream.rate_limit_info = dict(info)

    def _result(self, event: dict[str, Any]) -> None:
        stream = self.stream
        stream.has_result = True
        stream.is_error = event.get("is_error") is True
        stream.result_text = event.get("result") if isinstance(event.get("result"), str) else None
        stream.subtype = as_str(event.get("subtype"))
        stream.terminal_reason = as_str(event.get("terminal_reason"))
        _take_api_error_fields(stream, event)
        stream.num_turns = as_int(event.get("num_turns"))
        stream.cost_usd = as_float(event.get("total_cost_usd"))
        stream.duration_ms = as_int(event.get("duration_ms"))
        usage = event.get("usage")
        if isinstance(usage, dict):
            stream.input_tokens = as_int(usage.get("input_tokens"))
            stream.output_tokens = as_int(usage.get("output_tokens"))
            if stream.call_input_tokens is None:  # no assistant call reported its own
                self._call_usage(usage)
        stream.context_window = _context_window(event.get("modelUsage"), stream.model)
        if stream.is_error:
            add_error_text(stream, stream.result_text)
            errors = event.get("errors")
            if isinstance(errors, list):
                for item in errors:
                    add_error_text(stream, item if isinstance(item, str) else None)


def _context_window(model_usage: object, model: str | None) -> int | None:
    """`modelUsage`'s `contextWindow` for the turn's model (by key, canonical name, or the
    only entry)."""
    if not isinstance(model_usage, dict) or not model_usage:
        return None
    entries = [e for e in model_usage.values() if isinstance(e, dict)]
    chosen = model_usage.get(model) if model else None
    if not isinstance(chosen, dict):
        canonical = [e for e in entries if model and e.get("canonicalModel") == model]
        chosen = canonical[0] if canonical else (entries[0] if len(entries) == 1 else None)
    window = as_int(chosen.get("contextWindow")) if isinstance(chosen, dict) else None
    return window if window is not None and window > 0 else None


def _take_api_error_fields(stream: TurnStream, event: dict[str, Any]) -> None:
    """Copy the API-error facts an event carries; a null never erases an earlier value."""
    status = as_int(event.get("api_error_status"))
    if status is not None:
        stream.api_error_status = status
    stream.api_error = as_str(event.get("api_error")) or stream.api_error
    stream.api_error_type = as_str(event.get("api_error_type")) or stream.api_error_type


def _text_blocks(message: object) -> list[str]:
    """The text blocks of an assistant message's content."""
    if not isinstance(message, dict):
        return []
    content = message.get("content")
    if isinstance(content, str):
        return [content] if content else []
    if not isinstance(content, list):
        return []
    return [
        block["text"]
        for block in content
        if isinstance(block, dict)
        and block.get("type") == "text"
        and isinstance(block.get("text"), str)
        and block["text"]
    ]


class ClaudeCodeAdapter:
    """Claude Code: takes a per-spawn Claude credential and reports its permission mode."""

    name = "claude-code"
    aliases: tuple[str, ...] = ("claude",)
    default_command = "claude"
    hints = OutcomeHints(
        label="Claude Code",
        # As root without IS_SANDBOX=1 it refuses to skip permission prompts, exit 1.
        permission_refusals={
            "cannot be used with root/sudo privileges": "Claude Code refuses to skip permission "
            "prompts as root (run as a non-root user or set IS_SANDBOX=1)"
        },
        # Elsewhere the marker would read as a rejection to the controller: unmarked there.
        model_rejection_markers={UNRECOGNIZED_MODEL: "[unrecognized model]"},
        unknown_session_markers=("no conversation found with session id",),
        error_codes={**ERROR_CODES, "claude_code_version_too_old": OutcomeKind.MODEL_UNSUPPORTED},
        not_found_codes=NOT_FOUND_CODES,
        max_turn_reasons=frozenset({"max_turns", "error_max_turns"}),
        text_markers=TEXT_MARKERS,
        reset_parsers=RESET_PARSERS,
    )
    supports_auth_override = True
    brokered = True
    api: Api = "anthropic"
    credential_descriptors: Mapping[str, str] = CLAUDE_DESCRIPTORS
    reports_permission_mode = True
    assigns_session_id = True
    honours = frozenset(TURN_OPTIONS)
    not_enforced: frozenset[str] = frozenset()

    def argv(self, command: str, turn: TurnSpec) -> list[str]:
        """`claude --print --output-format stream-json --verbose --permission-mode …` (§6.3)."""
        argv = [
            command,
            "--print",
            "--output-format",
            "stream-json",
            # stream-json in --print mode requires --verbose.
            "--verbose",
            "--permission-mode",
            turn.permission_mode,
        ]
        if turn.model:
            argv += ["--model", turn.model]
        if turn.max_turns is not None:
            argv += ["--max-turns", str(turn.max_turns)]
        if turn.system_prompt:
            # One token: a prompt that starts with "-" must not read as an option.
            argv.append(f"--append-system-prompt={turn.system_prompt}")
        if turn.allowed_tools:
            argv += ["--allowedTools", ",".join(turn.allowed_tools)]
        if turn.resume_session_id:
            argv += ["--resume", turn.resume_session_id]
        elif turn.new_session_id:
            argv += ["--session-id", turn.new_session_id]
        if not turn.persist_session:
            argv.append("--no-session-persistence")
        if turn.setting_sources is not None:
            # The agent's own settings files it loads; managed settings always apply.
            argv += ["--setting-sources", ",".join(turn.setting_sources)]
        if turn.images:
            argv += ["--input-format", "stream-json"]
        return argv

    def stdin(self, turn: TurnSpec) -> bytes:
        """The prompt, UTF-8: never argv, where `ps` would show it.

        With images, one stream-json user message: an image block per image, then the
        prompt as a text block.
        """
        if not turn.images:
            return turn.prompt.encode("utf-8")
        content: list[dict[str, Any]] = [
            {"type": "image", "source": {"type": "base64", "media_type": media, "data": data}}
            for media, data in turn.images
        ]
        content.append({"type": "text", "text": turn.prompt})
        message = {"type": "user", "message": {"role": "user", "content": content}}
        return json.dumps(message).encode("utf-8") + b"\n"

    def new_parser(self) -> StreamParser:
        """A fresh stream-json parser for one turn."""
        return ClaudeStreamParser()

    def spawn_files(self, env: Mapping[str, str]) -> tuple[SpawnFile, ...]:
        """None: Claude Code runs headless with its flags alone."""
        return ()

    def readiness_problems(self, env: Mapping[str, str], host: SpawnHost) -> list[str]:
        """As root, Claude Code refuses bypassPermissions unless IS_SANDBOX=1 (or its
        bubblewrap sandbox) says the machine is a sandbox: every turn would fail.

        A missing credential is no problem here: the controller sends one per turn.
        """
        if (
            host.permission_mode == BYPASS_PERMISSIONS
            and host.uid == 0
            and env.get("IS_SANDBOX") != "1"
            and not env.get("CLAUDE_CODE_BUBBLEWRAP")
        ):
            return [
                "claude-code refuses bypassPermissions as root without IS_SANDBOX=1 in the "
                "spawn environment: run as a non-root user or set IS_SANDBOX=1"
            ]
        return []
