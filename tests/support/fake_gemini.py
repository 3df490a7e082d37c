"""A fake Gemini CLI (stdlib only), run through the executable ``fake-gemini``.

It takes the argv our adapter builds (``gemini --output-format stream-json [--model m]
[--resume id] --yolo --skip-trust``), reads the prompt from stdin (no prompt flag:
non-interactive), and prints stream-json shaped like Gemini CLI's: ``init``, the user
``message``, assistant ``message`` deltas, and the final ``result`` with ``stats``. API
failures quote Google's JSON error body on stderr and exit with the HTTP status mod
256, as the real CLI does. Its reply is a JSON report of what it received:
``runtime``, ``argv``, ``env_names``, ``fingerprints`` (sha256-12 of known credential
variables, never a value), ``model``, ``resume``, ``skip_trust``, ``settings`` (the
system defaults file the server handed it, parsed), ``prompt``.

Directives, one a line in the prompt, run in order:

- ``@resource-exhausted``: 429 RESOURCE_EXHAUSTED "… Your quota will reset after
  1h49m8s." (Code Assist's words): an error event, an error result, the JSON body on
  stderr, exit 173;
- ``@api-key-invalid``: 400 INVALID_ARGUMENT "API key not valid…": an error result
  quoting the body, exit 144;
- ``@unavailable``: 503 UNAVAILABLE "The model is overloaded…": an error result, the
  body on stderr, exit 247;
- ``@exit N``: exit N now; 41 prints the CLI's missing-key text, 42 an input error,
  53 the turn-limit text;
- ``@stderr TEXT``: write TEXT to stderr; ``@sleep S``: sleep S seconds.
"""

from __future__ import annotations

import json
import os
import sys
import time
import uuid
from datetime import UTC, datetime
from typing import Any

from tests.support.fake_cli import die, directives, fingerprint, write_event

DEFAULT_MODEL = "gemini-2.5-pro"
CREDENTIAL_NAMES = (
    "GEMINI_API_KEY",
    "GOOGLE_API_KEY",
    "OPENAI_API_KEY",
    "ANTHROPIC_API_KEY",
    "ANTHROPIC_AUTH_TOKEN",
    "CLAUDE_CODE_OAUTH_TOKEN",
)
EXHAUSTED = "You have exhausted your capacity on this model. Your quota will reset after 1h49m8s."
KEY_INVALID = "API key not valid. Please pass a valid API key."
UNAVAILABLE = "The model is overloaded. Please try again later."
EXIT_TEXTS = {
    41: "When using Gemini API, you must specify the GEMINI_API_KEY environment variable.\n"
    "Update your environment and try again (no reload needed if using .env)!",
    42: "No input provided via stdin. Input can be provided by piping data into gemini.",
    53: "Reached max session turns for this session. Increase the number of turns by "
    "specifying maxSessionTurns in settings.json.",
}


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def emit(event: dict[str, Any]) -> None:
    """Print one stream-json event (with a timestamp) and flush."""
    event = {"type": event["type"], "timestamp": _now(), **event}
    write_event(event)


def error_body(code: int, message: str, status: str) -> str:
    """Google's JSON error body, as the CLI quotes it."""
    return json.dumps({"error": {"code": code, "message": message, "status": status}})


def parse_argv(argv: list[str]) -> dict[str, Any]:
    """Parse ``--output-format stream-json [--model m] [--resume id] --yolo [--skip-trust]``;
    else exit 1."""
    parsed: dict[str, Any] = {
        "format": "text",
        "model": None,
        "resume": None,
        "yolo": False,
        "skip_trust": False,
    }
    keys = {"--output-format": "format", "-o": "format", "--model": "model", "-m": "model"}
    keys |= {"--resume": "resume", "-r": "resume"}
    index = 0
    while index < len(argv):
        arg = argv[index]
        if arg in keys:
            if index + 1 >= len(argv):
                die(f"Not enough arguments following: {arg.lstrip('-')}")
            index += 1
            parsed[keys[arg]] = argv[index]
        elif arg in ("--yolo", "-y"):
            parsed["yolo"] = True
        elif arg == "--skip-trust":
            parsed["skip_trust"] = True
        else:
            die(f"Unknown argument: {arg.lstrip('-')}")
        index += 1
    if parsed["format"] != "stream-json":
        die("this fake only speaks --output-format stream-json")
    return parsed


def api_failure(code: int, message: str, status: str, started: float) -> int:
    """An API error mid-turn: the error event, an error result, the body on stderr; the
    exit status is the HTTP status, as the real CLI's (the OS keeps it mod 256)."""
    body = error_body(code, message, status)
    emit({"type": "error", "severity": "error", "message": f"[API Error: {body}]"})
    emit(
        {
            "type": "result",
            "status": "error",
            "error": {"type": "ApiError", "message": message},
            "stats": stats(0, 0, started),
        }
    )
    sys.stderr.write(body + "\n")
    sys.stderr.flush()
    return code % 256


def stats(input_tokens: int, output_tokens: int, started: float) -> dict[str, int]:
    """The result's stats block."""
    return {
        "total_tokens": input_tokens + output_tokens,
        "input_tokens": input_tokens,
        "output_tokens": output_tokens,
        "duration_ms": int((time.monotonic() - started) * 1000),
        "tool_calls": 0,
    }


def system_defaults(env: dict[str, str]) -> Any:
    """The settings file `GEMINI_CLI_SYSTEM_DEFAULTS_PATH` names, parsed, or None."""
    path = env.get("GEMINI_CLI_SYSTEM_DEFAULTS_PATH")
    if not path:
        return None
    with open(path, encoding="utf-8") as file:
        return json.load(file)


def run(argv: list[str], env: dict[str, str], prompt: str) -> int:
    """Play one non-interactive stream-json turn; return the exit code."""
    started = time.monotonic()
    args = parse_argv(argv)
    steps = directives(prompt)
    if any(name == "api-key-invalid" for name, _ in steps):
        # An error result quoting the body, a report path on stderr, exit 400 mod 256.
        message = f"[API Error: {error_body(400, KEY_INVALID, 'INVALID_ARGUMENT')}]"
        emit(
            {"type": "result", "status": "error", "error": {"type": "unknown", "message": message}}
        )
        die(
            "Error when talking to Gemini API Full report available at: "
            "/tmp/gemini-client-error-Turn.run-sendMessageStream.json",
            400 % 256,
        )
    model = args["model"] or DEFAULT_MODEL
    # A resumed session keeps its id, as the CLI's own session files do.
    emit({"type": "init", "session_id": args["resume"] or str(uuid.uuid4()), "model": model})
    emit({"type": "message", "role": "user", "content": prompt})
    for name, arg in steps:
        match name:
            case "resource-exhausted":
                return api_failure(429, EXHAUSTED, "RESOURCE_EXHAUSTED", started)
            case "unavailable":
                return api_failure(503, UNAVAILABLE, "UNAVAILABLE", started)
            case "exit":
                code = int(arg)
                if code in EXIT_TEXTS:
                    sys.stderr.write(EXIT_TEXTS[code] + "\n")
                    sys.stderr.flush()
                return code
            case "stderr":
                sys.stderr.write(arg + "\n")
                sys.stderr.flush()
            case "sleep":
                time.sleep(float(arg))
            case _:
                pass
    report = {
        "runtime": "gemini-cli",
        "argv": argv,
        "env_names": sorted(env),
        "fingerprints": {name: fingerprint(env[name]) for name in CREDENTIAL_NAMES if name in env},
        "model": model,
        "resume": args["resume"],
        "skip_trust": args["skip_trust"],
        "settings": system_defaults(env),
        "prompt": prompt,
    }
    text = json.dumps(report, sort_keys=True)
    half = len(text) // 2  # two deltas, as the CLI streams them
    for chunk in (text[:half], text[half:]):
        emit({"type": "message", "role": "assistant", "content": chunk, "delta": True})
    emit({"type": "result", "status": "success", "stats": stats(1410, 122, started)})
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``fake-gemini``."""
    arguments = sys.argv[1:] if argv is None else argv
    parse_argv(arguments)  # usage errors before reading stdin
    return run(arguments, dict(os.environ), sys.stdin.read())


if __name__ == "__main__":
    sys.exit(main())
