"""Codex: `codex exec --json … -`, prompt on stdin.

It honours `model` (`--model`), `resume_session_id` (`resume <id>`) and
`persist_session: false` (`--ephemeral`); Codex has no flag for an appended system
prompt, a tool allow-list or a turn cap, so a turn asking for one is refused.


`codex exec -` reads the prompt from stdin (never argv, where `ps` would show it).
Its JSONL events: `thread.started` (the session id), `item.completed` (an
`agent_message` is the model's reply), `turn.completed` (usage: the turn served),
`turn.failed` and `error` (the failure text, e.g. `You've hit your usage limit. …
try again at 3:29 PM.` or an expired refresh token), which the classifier reads
through its text markers on error channels.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agent_server.runtimes.base import OutcomeHints, StreamParser, TurnSpec
from agent_server.runtimes.events import (
    add_error_text,
    as_int,
    as_session_id,
    as_str,
    decode_event,
)
from agent_server.runtimes.stream import TurnStream

__all__ = ["CodexAdapter", "CodexStreamParser"]

# Older Codex builds named the reply item `assistant_message` and the field `item_type`.
_MESSAGE_ITEM_TYPES = frozenset({"agent_message", "assistant_message"})


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
            add_error_text(stream, _message(error) if isinstance(error, dict) else None)
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
        if item_type in _MESSAGE_ITEM_TYPES and text is not None:
            self.stream.result_text = text
            self.stream.add_assistant_text(text)
        elif item_type == "error":
            add_error_text(self.stream, _message(item))


def _message(payload: dict[str, Any]) -> str | None:
    return as_str(payload.get("message"))


class CodexAdapter:
    """Codex: authenticates with its own login; takes no Claude credential override."""

    name = "codex"
    aliases: tuple[str, ...] = ()
    default_command = "codex"
    hints = OutcomeHints(label="Codex")
    supports_auth_override = False
    credential_descriptors: Mapping[str, str] = {}
    reports_permission_mode = False
    assigns_session_id = False
    honours = frozenset({"model", "resume_session_id", "persist_session"})

    def argv(self, command: str, turn: TurnSpec) -> list[str]:
        """`codex exec --json [--model m] --skip-git-repo-check [--ephemeral] [resume <id>] -`.

        The exec flags go before the `resume` subcommand; the trailing `-` makes
        Codex read the prompt from stdin in both forms.
        """
        argv = [command, "exec", "--json"]
        if turn.model:
            argv += ["--model", turn.model]
        argv.append("--skip-git-repo-check")
        if not turn.persist_session:
            argv.append("--ephemeral")
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
