"""A fake Codex CLI (stdlib only), run through the executable ``fake-codex``.

It takes the argv our adapter builds (``codex exec --json [--model m]
--skip-git-repo-check [--dangerously-bypass-approvals-and-sandbox] [--ephemeral]
[-c key=value] [resume <id>] -``), reads the prompt from stdin (the trailing ``-``), and
prints ``exec --json`` events shaped like Codex 0.171.0's (tests/fixtures/codex-*):
``thread.started``, a warning ``item.completed`` of type ``error`` (the real CLI's
model-metadata warning, even on success), ``turn.started``, ``item.completed`` (an
``agent_message``), ``turn.completed`` with usage, or ``error`` / ``turn.failed`` on a
failure. Its reply is a JSON report of what it received: ``runtime``, ``argv``,
``env_names``, ``fingerprints`` (sha256-12 of the credential variables it knows,
never a value), ``model``, ``resume``, ``ephemeral``, ``bypass_sandbox``, ``config``
(the ``-c`` values, as given), ``prompt``.

Directives, one a line in the prompt, run in order:

- ``@usage-limit``: the ChatGPT plan wall, ``error`` + ``turn.failed`` "You\u2019ve hit
  your usage limit. … try again at 3:29 PM." (a curly apostrophe), exit 1;
- ``@refresh-expired``: ``error`` + ``turn.failed`` "…your refresh token has
  expired…", exit 1;
- ``@unauthorized``: five reconnect ``error``s, then ``error`` + ``turn.failed``
  ``unexpected status 401 Unauthorized: …``, exit 1;
- ``@reconnect``: a transient ``error`` (a 503 reconnect) first; the turn then completes;
- ``@stream-error``: reconnects, then ``error`` + ``turn.failed`` "We\u2019re currently
  experiencing high demand…" (an upstream 500), exit 1;
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
    "You\u2019ve hit your usage limit. Upgrade to Pro (https://chatgpt.com/explore/pro), visit "
    "https://chatgpt.com/settings/usage to purchase more credits or try again at 3:29 PM."
)
REFRESH_EXPIRED = (
    "Your access token could not be refreshed because your refresh token has expired. "
    "Please log out and sign in again."
)
UNAUTHORIZED = (
    "unexpected status 401 Unauthorized: Incorrect API key provided. You can find your API "
    "key at https://platform.openai.com/account/api-keys., request id: req_mock"
)
HIGH_DEMAND = "We\u2019re currently experiencing high demand, which may cause temporary errors."
WARNING = (
    "Model metadata for `{model}` not found. Defaulting to fallback metadata; this can "
    "degrade performance and cause issues."
)


def parse_argv(argv: list[str]) -> dict[str, Any]:
    """Parse ``exec --json [--model m] [--skip-git-repo-check] [--ephemeral] [resume <id>] -``."""
    if not argv or argv[0] != "exec":
        die("error: this fake only implements `codex exec`", 2)
    parsed: dict[str, Any] = {
        "json": False,
        "model": None,
        "resume": None,
        "ephemeral": False,
        "bypass_sandbox": False,
        "config": {},
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
        elif arg == "--dangerously-bypass-approvals-and-sandbox":
            parsed["bypass_sandbox"] = True
        elif arg in ("-c", "--config"):
            if index + 1 >= len(rest) or "=" not in rest[index + 1]:
                die(f"error: a value is required for '{arg} <key=value>'", 2)
            index += 1
            key, _, value = rest[index].partition("=")
            parsed["config"][key] = value
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


def reconnects(message: str) -> None:
    """Codex's five reconnect attempts before it gives up."""
    for attempt in range(1, 6):
        write_event({"type": "error", "message": f"Reconnecting... {attempt}/5 ({message})"})


def run(argv: list[str], env: dict[str, str], prompt: str) -> int:
    """Play one ``codex exec --json`` turn; return the exit code."""
    args = parse_argv(argv)
    thread_id = args["resume"] or str(uuid.uuid4())
    model = args["model"] or DEFAULT_MODEL
    write_event({"type": "thread.started", "thread_id": thread_id})
    warning = {"id": "item_w", "type": "error", "message": WARNING.format(model=model)}
    write_event({"type": "item.completed", "item": warning})
    write_event({"type": "turn.started"})
    for name, arg in directives(prompt):
        match name:
            case "usage-limit":
                return failed(USAGE_LIMIT)
            case "refresh-expired":
                return failed(REFRESH_EXPIRED)
            case "stream-error":
                reconnects(HIGH_DEMAND)
                return failed(HIGH_DEMAND)
            case "unauthorized":
                reconnects(UNAUTHORIZED)
                return failed(UNAUTHORIZED)
            case "reconnect":
                write_event({"type": "error", "message": "Reconnecting... 1/5 (503 overloaded)"})
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
        "model": model,
        "resume": args["resume"],
        "ephemeral": args["ephemeral"],
        "bypass_sandbox": args["bypass_sandbox"],
        "config": args["config"],
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
            "usage": {
                "input_tokens": 120,
                "cached_input_tokens": 0,
                "cache_write_input_tokens": 0,
                "output_tokens": 7,
                "reasoning_output_tokens": 0,
            },
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
