"""Codex: `codex exec --json … -`, prompt on stdin.

It honours `model` (`--model`), `system_prompt` (Codex's `developer_instructions`, a
developer message after its own instructions, as Claude Code appends one),
`resume_session_id` (`resume <id>`) and `persist_session: false` (`--ephemeral`). It
has no tool allow-list: `allowed_tools` is taken and named as not enforced. It has no
turn cap and takes images only from files, so `max_turns` and `images` are refused.
The permission mode `bypassPermissions` runs it with
`--dangerously-bypass-approvals-and-sandbox`: Codex's own sandbox is read-only by
default, and a headless turn has no one to approve a write.

`codex exec -` reads the prompt from stdin (never argv, where `ps` would show it).
Its JSONL events (tests/fixtures/codex): `thread.started` (the session id),
`item.completed` (an `agent_message` is the model's reply; an `error` item is a
warning Codex recovered from, even on success), `turn.completed` (usage: the turn
served), `error` (a failure, or `Reconnecting... 2/5 (…)` while Codex retries) and
`turn.failed`, whose message is the failure's own text.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from agent_server.runtimes.base import OutcomeHints, SpawnHost, StreamParser, TurnSpec
from agent_server.runtimes.codex_resets import RESET_PARSERS
from agent_server.runtimes.error_vocabulary import ERROR_CODES, NOT_FOUND_CODES, TEXT_MARKERS
from agent_server.runtimes.events import (
    add_error_text,
    as_int,
    as_session_id,
    as_str,
    decode_event,
)
from agent_server.runtimes.stream import TurnStream
from agent_server.spawn_env.spawn_files import SpawnFile
from agent_server.wire.names import BYPASS_PERMISSIONS, CODEX_KEY, OPENAI_KEY, Api, OutcomeKind

__all__ = ["CodexAdapter", "CodexStreamParser", "toml_string"]

# Older Codex builds named the reply item `assistant_message` and the field `item_type`.
_MESSAGE_ITEM_TYPES = frozenset({"agent_message", "assistant_message"})
KEY_VARIABLES = (OPENAI_KEY, CODEX_KEY)
"""Where Codex reads an API key (the first is its providers' usual `env_key`)."""
BROKER_PROVIDER = "agent_server_broker"
"""The model provider a brokered turn runs on: the broker's URL, the placeholder's key.
Codex 0.171 takes no base URL from its environment (`OPENAI_BASE_URL` is not read),
so it is a provider on argv, whose `-c` outranks every `config.toml` the agent writes."""

# Codex's own failure texts (0.171.0), as tests/fixtures/codex records them: an
# upstream 5xx is "We\u2019re currently experiencing high demand" with no status in it
ERROR_MARKERS: tuple[tuple[str, OutcomeKind], ...] = (
    ("does not exist or you do not have access to it", OutcomeKind.MODEL_UNSUPPORTED),
    ("hit your usage limit", OutcomeKind.RATE_LIMIT),
    ("quota exceeded. check your plan and billing details", OutcomeKind.BILLING),
    ("missing environment variable:", OutcomeKind.AUTH),
    ("currently experiencing high demand", OutcomeKind.UPSTREAM_UNAVAILABLE),
)


class CodexStreamParser:
    """Parses `codex exec --json` events, one line at a time, into a `TurnStream`."""

    def __init__(self) -> None:
        self.stream = TurnStream()
        self.last_event: dict[str, Any] | None = None

    def feed(self, line: bytes) -> bool:
        """Parse one stdout line; True on `turn.completed` or `turn.failed`."""
        event = self.last_event = decode_event(line)
        if event is None:
            return False
        stream = self.stream
        kind = event.get("type")
        if kind == "thread.started":
            stream.session_id = as_session_id(event.get("thread_id")) or stream.session_id
        elif kind == "item.completed":
            self._item(event.get("item"))
        elif kind == "turn.completed":
            # A turn that completes after a transient `error` event (a reconnect) served.
            stream.has_result = True
            stream.is_error = False
            usage = event.get("usage")
            if isinstance(usage, dict):
                stream.input_tokens = as_int(usage.get("input_tokens"))
                stream.output_tokens = as_int(usage.get("output_tokens"))
                # OpenAI counts cached input inside input_tokens: nothing to add to it.
                stream.call_input_tokens = stream.input_tokens
            return True
        elif kind == "turn.failed":
            stream.has_result = True
            stream.is_error = True
            error = event.get("error")
            # The failure's own text leads: it is the answer's message.
            add_error_text(stream, _message(error) if isinstance(error, dict) else None, first=True)
            return True
        elif kind == "error":
            # Not final: Codex also reports reconnect attempts this way before a
            # `turn.completed`; if nothing follows, the turn failed with this text.
            stream.has_result = True
            stream.is_error = True
            add_error_text(stream, _message(event))
        return False

    def _item(self, item: object) -> None:
        if not isinstance(item, dict):
            return
        item_type = item.get("type", item.get("item_type"))
        text = as_str(item.get("text"))
        # An `error` item is a warning (`Model metadata for … not found`), never the failure.
        if item_type in _MESSAGE_ITEM_TYPES and text is not None:
            self.stream.result_text = text
            self.stream.add_assistant_text(text)


def _message(payload: dict[str, Any]) -> str | None:
    return as_str(payload.get("message"))


def toml_string(text: str) -> str:
    """`text` as a TOML basic string: what `-c key=<value>` parses back to exactly `text`."""
    escaped = []
    for char in text:
        if char in ('"', "\\"):
            escaped.append("\\" + char)
        elif char < " " or char == "\x7f":  # TOML allows no raw control character here
            escaped.append(f"\\u{ord(char):04x}")
        else:
            escaped.append(char)
    return '"' + "".join(escaped) + '"'


def broker_provider(api_base: str) -> list[str]:
    """The `-c` flags that run a turn on `BROKER_PROVIDER`: the Responses API at the
    broker's `api_base`, with the key of `OPENAI_API_KEY` as `Authorization: Bearer`."""
    table = f"model_providers.{BROKER_PROVIDER}"
    settings = {
        "model_provider": BROKER_PROVIDER,
        f"{table}.name": BROKER_PROVIDER,
        f"{table}.base_url": api_base,
        f"{table}.env_key": OPENAI_KEY,
        f"{table}.wire_api": "responses",
    }
    argv = []
    for key, value in settings.items():
        argv += ["-c", f"{key}={toml_string(value)}"]
    return argv


class CodexAdapter:
    """Codex: authenticates with its own key or login; takes no Claude credential override."""

    name = "codex"
    aliases: tuple[str, ...] = ()
    default_command = "codex"
    hints = OutcomeHints(
        label="Codex",
        error_markers=ERROR_MARKERS,
        error_codes=ERROR_CODES,
        not_found_codes=NOT_FOUND_CODES,
        text_markers=TEXT_MARKERS,
        reset_parsers=RESET_PARSERS,
    )
    supports_auth_override = False
    brokered = True
    api: Api = "openai"
    credential_descriptors: Mapping[str, str] = {}
    reports_permission_mode = False
    assigns_session_id = False
    honours = frozenset({"model", "system_prompt", "resume_session_id", "persist_session"})
    not_enforced = frozenset({"allowed_tools"})

    def argv(self, command: str, turn: TurnSpec) -> list[str]:
        """`codex exec --json [--model m] --skip-git-repo-check [--dangerously-bypass-approvals-
        and-sandbox] [--ephemeral] [-c developer_instructions=<s>] [-c <the broker's
        provider>…] [resume <id>] -`.

        The exec flags go before the `resume` subcommand; the trailing `-` makes
        Codex read the prompt from stdin in both forms.
        """
        argv = [command, "exec", "--json"]
        if turn.model:
            argv += ["--model", turn.model]
        argv.append("--skip-git-repo-check")
        if turn.permission_mode == BYPASS_PERMISSIONS:
            argv.append("--dangerously-bypass-approvals-and-sandbox")
        if not turn.persist_session:
            argv.append("--ephemeral")
        if turn.system_prompt:
            argv += ["-c", f"developer_instructions={toml_string(turn.system_prompt)}"]
        if turn.api_base:
            argv += broker_provider(turn.api_base)
        if turn.resume_session_id:
            argv += ["resume", turn.resume_session_id]
        argv.append("-")
        return argv

    def stdin(self, turn: TurnSpec) -> bytes:
        """The prompt, UTF-8."""
        return turn.prompt.encode("utf-8")

    def new_parser(self) -> StreamParser:
        """A fresh `exec --json` parser for one turn."""
        return CodexStreamParser()

    def spawn_files(self, env: Mapping[str, str]) -> tuple[SpawnFile, ...]:
        """None: Codex runs headless with its flags alone."""
        return ()

    def readiness_problems(self, env: Mapping[str, str], host: SpawnHost) -> list[str]:
        """No API key, no login and no configuration of its own: no turn can authenticate.

        A `config.toml` may name a provider that needs no key (a local model), so its
        presence is given the benefit of the doubt.
        """
        if any(env.get(name) for name in KEY_VARIABLES):
            return []
        home = Path(env.get("CODEX_HOME") or os.path.join(env.get("HOME", "/"), ".codex"))
        if host.present(home / "auth.json") or host.present(home / "config.toml"):
            return []
        return [
            "codex has no credential: neither OPENAI_API_KEY nor CODEX_API_KEY is set, and "
            "CODEX_HOME holds no login (auth.json) or config.toml"
        ]
