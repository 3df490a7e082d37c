"""A fake Codex CLI (stdlib only), run through the executable ``fake-codex``.

It takes the argv our adapter builds (``codex exec --json [--model m]
--skip-git-repo-check [--ephemeral] [resume <id>] -``), reads the prompt from stdin (the trailing
``-``), and prints ``exec --json`` events shaped like Codex's: ``thread.started``,
``turn.started``, ``item.completed`` (an ``agent_message``), ``turn.completed`` with
usage, or ``error`` / ``turn.failed`` on a failure. Its reply is a JSON report of what
it received: ``runtime``, ``argv``, ``env_names``, ``fingerprints`` (sha256-12 of the
credential variables it knows, never a value), ``model``, ``resume``, ``ephemeral``,
``prompt``.

Directives, one a line in the prompt, run in order:

- ``@usage-limit``: the ChatGPT plan wall, ``error`` + ``turn.failed`` "You've hit
  your usage limit. … try again at 3:29 PM.", exit 1;
- ``@refresh-expired``: ``error`` + ``turn.failed`` "…your refresh token has
  expired…", exit 1;
- ``@unauthorized``: a reconnect ``error``, then stderr ``ERROR: unexpected status
  401 Unauthorized: …``, exit 1;
- ``@reconnect``: a transient ``error`` (a 503 reconnect) first; the turn then completes;
- ``@stream-error``: ``error`` + ``turn.failed`` "stream disconnected … 500 Internal
  Server Error", exit 1;
- ``@stderr TEXT``: write TEXT to stderr; ``@sleep S``: sleep S seconds;
- ``@exit N``: exit N now, with no ``turn.completed``.
"""

from __future__ import annotations

import json
import os
import sys
import time
import uuid
from typing import Any

from tests.support.fake_cli import die, directives, fingerprint, write_event

DEFAULT_MODEL = "gpt-5-codex"
CREDENTIAL_NAMES = (
    "OPENAI_API_KEY",
    "CODEX_API_KEY",
    "ANTHROPIC_API_KEY",
    "ANTHROPIC_AUTH_TOKEN",
    "CLAUDE_CODE_OAUTH_TOKEN",
    "GEMINI_API_KEY",
)
USAGE_LIMIT = (
    "You've hit your usage limit. Upgrade to Pro (https://chatgpt.com/explore/pro), visit "
    "https://chatgpt.com/codex/settings/usage to purchase more credits or try again at 3:29 PM."
)
REFRESH_EXPIRED = (
    "Your access token could not be refreshed because your refresh token has expired. "
    "Please log out and sign in again."
)
UNAUTHORIZED = (
    'ERROR: unexpected status 401 Unauthorized: {"error":{"message":"Missing bearer or basic '
    'authentication in header","type":"invalid_request_error"}}'
)
STREAM_ERROR = "stream disconnected before completion: unexpected status 500 Internal Server Error"


def parse_argv(argv: list[str]) -> dict[str, Any]:
    """Parse ``exec --json [--model m] [--skip-git-repo-check] [--ephemeral] [resume <id>] -``."""
    if not argv or argv[0] != "exec":
        die("error: this fake only implements `codex exec`", 2)
    parsed: dict[str, Any] = {
        "json": False,
        "model": None,
        "resume": None,
        "ephemeral": False,
        "stdin": False,
    }
    rest = argv[1:]
    index = 0
    while index < len(rest):
        arg = rest[index]
        if arg == "--json":
            parsed["json"] = True
        elif arg in ("--model", "-m"):
            if index + 1 >= len(rest):
                die(f"error: a value is required for '{arg} <MODEL>' but none was supplied", 2)
            index += 1
            parsed["model"] = rest[index]
        elif arg == "--skip-git-repo-check":
            pass
        elif arg == "--ephemeral":
            parsed["ephemeral"] = True
        elif arg == "resume":
            if index + 1 >= len(rest) or rest[index + 1] == "-":
                die("error: `resume` needs a session id (or --last)", 2)
            index += 1
            parsed["resume"] = rest[index]
        elif arg == "-":
            parsed["stdin"] = True
        else:
            die(
                f"error: unexpected argument '{arg}' found\n\nUsage: codex exec [OPTIONS] [PROMPT]",
                2,
            )
        index += 1
    if not parsed["json"]:
        die("error: this fake only speaks --json", 2)
    if not parsed["stdin"]:
        die("error: the prompt must come from stdin (`-`)", 2)
    return parsed


def failed(message: str) -> int:
    """A turn that fails with ``message``: the error event, then turn.failed; exit 1."""
    write_event({"type": "error", "message": message})
    write_event({"type": "turn.failed", "error": {"message": message}})
    return 1


def run(argv: list[str], env: dict[str, str], prompt: str) -> int:
    """Play one ``codex exec --json`` turn; return the exit code."""
    args = parse_argv(argv)
    thread_id = args["resume"] or str(uuid.uuid4())
    write_event({"type": "thread.started", "thread_id": thread_id})
    write_event({"type": "turn.started"})
    for name, arg in directives(prompt):
        match name:
            case "usage-limit":
                return failed(USAGE_LIMIT)
            case "refresh-expired":
                return failed(REFRESH_EXPIRED)
            case "stream-error":
                return failed(STREAM_ERROR)
            case "unauthorized":
                write_event({"type": "error", "message": "Reconnecting... 1/5"})
                die(UNAUTHORIZED, 1)
            case "reconnect":
                write_event(
                    {"type": "error", "message": f"Reconnecting... 1/5 ({STREAM_ERROR[:40]} 503)"}
                )
            case "stderr":
                sys.stderr.write(arg + "\n")
                sys.stderr.flush()
            case "sleep":
                time.sleep(float(arg))
            case "exit":
                return int(arg)
            case _:
                pass
    report = {
        "runtime": "codex",
        "argv": argv,
        "env_names": sorted(env),
        "fingerprints": {name: fingerprint(env[name]) for name in CREDENTIAL_NAMES if name in env},
        "model": args["model"] or DEFAULT_MODEL,
        "resume": args["resume"],
        "ephemeral": args["ephemeral"],
        "prompt": prompt,
    }
    text = json.dumps(report, sort_keys=True)
    write_event(
        {"type": "item.completed", "item": {"id": "item_0", "type": "reasoning", "text": "ok"}}
    )
    write_event(
        {"type": "item.completed", "item": {"id": "item_1", "type": "agent_message", "text": text}}
    )
    write_event(
        {
            "type": "turn.completed",
            "usage": {"input_tokens": 120, "cached_input_tokens": 0, "output_tokens": 7},
        }
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``fake-codex``."""
    arguments = sys.argv[1:] if argv is None else argv
    parse_argv(arguments)  # usage errors before reading stdin, like clap
    return run(arguments, dict(os.environ), sys.stdin.read())


if __name__ == "__main__":
    sys.exit(main())
