"""A fake Claude Code CLI (stdlib only), run through the executable ``fake-claude``.

It takes the real CLI's print-mode argv, reads the prompt from stdin, and prints
stream-json shaped like Claude Code 2.1.328 (init, assistant, result). Its result text
is a JSON report of what it received, with credential VALUES replaced by sha256-12
fingerprints::

    {"served_by": "CLAUDE_CODE_OAUTH_TOKEN", "fp": "feeb305139b8",
     "env_names": [...], "fingerprints": {"CLAUDE_CODE_OAUTH_TOKEN": "..."},
     "descriptors": ["CLAUDE_CODE_OAUTH_TOKEN"],
     "argv": [...], "cwd": "...", "session": {"resume": null, "session_id": "...",
     "persist": true}, "model": "...", "permission_mode": "...", "prompt": "..."}

Directives, one a line in the prompt, run in order (see tests/support/README.md):
``@scenario NAME``, ``@sleep S``, ``@spawn-grandchild S [inherit]``,
``@escape setsid|double-fork S``, ``@read-parent``,
``@print-bytes N``, ``@echo-env NAME``, ``@stderr TEXT``, ``@exit N``,
``@result``, ``@kill-self``, ``@ignore-sigterm``, ``@unknown-session``, ``@root-refusal``,
``@api-retry N``, ``@tool NAME COMMAND``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any, NoReturn

from tests.support.fake_cli import die, directives, fingerprint, write_event

VERSION = "2.1.328"
DEFAULT_MODEL = "claude-sonnet-5-5"
CREDENTIAL_NAMES = (
    "CLAUDE_CODE_OAUTH_TOKEN",
    "ANTHROPIC_API_KEY",
    "ANTHROPIC_AUTH_TOKEN",
    "ANTHROPIC_BASE_URL",
)
# Provider switches beat every credential in the real CLI.
PROVIDER_SWITCHES = ("CLAUDE_CODE_USE_BEDROCK", "CLAUDE_CODE_USE_VERTEX", "CLAUDE_CODE_USE_FOUNDRY")
ROOT_REFUSAL = (
    "--dangerously-skip-permissions cannot be used with root/sudo privileges for security reasons"
)
_HERE = Path(__file__).resolve().parent
FIXTURE_DIRS = (
    _HERE / "../fixtures/claude-code-2.1.328",
    _HERE / "../fixtures/claude-code-2.1.328-captured",
)
_CHUNK = 64 * 1024
USAGE = {
    "input_tokens": 10,
    "cache_creation_input_tokens": 300,
    "cache_read_input_tokens": 1200,
    "output_tokens": 5,
}
"""Every model call's usage: a prompt mostly read from the cache."""
CONTEXT_WINDOW = 1_000_000
"""What 2.1.328 reports in `modelUsage` for its default models."""


DESCRIPTORS = {
    "CLAUDE_CODE_OAUTH_TOKEN_FILE_DESCRIPTOR": "CLAUDE_CODE_OAUTH_TOKEN",
    "CLAUDE_CODE_API_KEY_FILE_DESCRIPTOR": "ANTHROPIC_API_KEY",
}
"""As the real CLI: a credential read from descriptor N (until a newline or the end,
trimmed) counts as that variable, which stays out of the environment."""


def read_descriptor(fd: int) -> str:
    """As the real CLI: open `/proc/self/fd/N`, and where that is refused (a pipe another
    uid made, as a server that runs turns as the spawn user does) read fd N itself."""
    try:
        with open(f"/proc/self/fd/{fd}", encoding="utf-8") as handle:
            return handle.readline().strip()
    except PermissionError:
        with open(fd, encoding="utf-8", closefd=False) as handle:
            return handle.readline().strip()


def credentials(env: dict[str, str]) -> dict[str, str]:
    """The credentials this turn holds: its environment's, and those read from descriptors."""
    found = {name: env[name] for name in CREDENTIAL_NAMES if name in env}
    for variable, name in DESCRIPTORS.items():
        if env.get(variable, "").isdigit():
            value = read_descriptor(int(env[variable]))
            if value:
                found[name] = value
    return found


def served_by(env: dict[str, str]) -> str | None:
    """Return the variable the real CLI would authenticate with, following its precedence."""
    for name in (*PROVIDER_SWITCHES, "ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN"):
        if env.get(name):
            return name
    return "CLAUDE_CODE_OAUTH_TOKEN" if env.get("CLAUDE_CODE_OAUTH_TOKEN") else None


def parse_argv(argv: list[str]) -> argparse.Namespace:
    """Parse the print-mode flags the real CLI takes; unknown flags exit 1 like it does."""
    parser = argparse.ArgumentParser(prog="claude", add_help=False, exit_on_error=False)
    parser.add_argument("-p", "--print", action="store_true")
    parser.add_argument("--output-format", default="text")
    parser.add_argument("--input-format", default="text")
    parser.add_argument("--verbose", action="store_true")
    parser.add_argument("--permission-mode", default="default")
    parser.add_argument("--dangerously-skip-permissions", action="store_true")
    parser.add_argument("--model")
    parser.add_argument("--max-turns", type=int)
    parser.add_argument("--append-system-prompt")
    parser.add_argument("--system-prompt")
    parser.add_argument("--allowedTools", "--allowed-tools", nargs="+", action="append")
    parser.add_argument("--disallowedTools", "--disallowed-tools", nargs="+", action="append")
    parser.add_argument("-r", "--resume")
    parser.add_argument("--session-id")
    parser.add_argument("--no-session-persistence", action="store_true")
    parser.add_argument("prompt", nargs="?")
    try:
        args, unknown = parser.parse_known_args(argv)
    except argparse.ArgumentError as exc:
        die(f"error: {exc}")
    if unknown:
        die(f"error: unknown option '{unknown[0]}'")
    return args


def find_fixture(name: str) -> Path:
    """Return the ``NAME.stdout.jsonl`` of a reference or captured fixture."""
    for folder in FIXTURE_DIRS:
        candidate = folder / f"{name}.stdout.jsonl"
        if candidate.is_file():
            return candidate
    die(f"fake-claude: no fixture named {name!r} in {[str(d) for d in FIXTURE_DIRS]}", 2)


class Turn:
    """One invocation: argv, environment, prompt, and the session it runs in."""

    def __init__(self, argv: list[str], env: dict[str, str], prompt: str) -> None:
        self.argv = argv
        self.args = parse_argv(argv)
        self.env = env
        self.credentials = credentials(env)
        """The environment as the CLI sees its credentials (descriptors read)."""
        self.descriptors = sorted(DESCRIPTORS[v] for v in DESCRIPTORS if v in env)
        self.prompt = prompt
        self.images: list[dict[str, str]] = []
        if self.args.input_format == "stream-json":
            self.prompt = self.read_user_message(prompt)
        self.model = self.args.model or DEFAULT_MODEL
        self.session_id = self.args.resume or self.args.session_id or str(uuid.uuid4())
        self.started = time.monotonic()

    def read_user_message(self, stdin: str) -> str:
        """Take a stream-json user message: its text blocks are the prompt; images are kept
        as media type and fingerprint."""
        texts = []
        for line in stdin.splitlines():
            if not line.strip():
                continue
            event = json.loads(line)
            if event.get("type") != "user":
                die(f"error: expected a user message on stdin, got {event.get('type')!r}")
            for block in event["message"]["content"]:
                if block["type"] == "text":
                    texts.append(block["text"])
                elif block["type"] == "image":
                    source = block["source"]
                    self.images.append(
                        {"media_type": source["media_type"], "fp": fingerprint(source["data"])}
                    )
        return "\n".join(texts)

    def report(self) -> dict[str, Any]:
        """Return what this turn received, with fingerprints instead of credential values."""
        seen = {**self.env, **self.credentials}
        by = served_by(seen)
        value = seen.get(by) if by else None
        return {
            "served_by": by,
            "fp": fingerprint(value) if value else None,
            "env_names": sorted(self.env),
            "fingerprints": {name: fingerprint(v) for name, v in self.credentials.items()},
            "descriptors": self.descriptors,
            "argv": self.argv,
            "cwd": os.getcwd(),
            "session": {
                "resume": self.args.resume,
                "session_id": self.args.session_id,
                "effective": self.session_id,
                "persist": not self.args.no_session_persistence,
            },
            "model": self.model,
            "permission_mode": self.args.permission_mode,
            "max_turns": self.args.max_turns,
            "allowed_tools": [t for group in self.args.allowedTools or [] for t in group],
            "append_system_prompt": self.args.append_system_prompt,
            "prompt": self.prompt,
            "images": self.images,
        }

    def init_event(self) -> dict[str, Any]:
        """Return the ``system/init`` event (``apiKeySource`` computed like the real CLI)."""
        return {
            "type": "system",
            "subtype": "init",
            "cwd": os.getcwd(),
            "session_id": self.session_id,
            "tools": ["Task", "Bash", "Edit", "Read", "Write"],
            "mcp_servers": [],
            "model": self.model,
            "permissionMode": self.args.permission_mode,
            "slash_commands": [],
            "apiKeySource": "ANTHROPIC_API_KEY"
            if self.credentials.get("ANTHROPIC_API_KEY")
            else "none",
            "claude_code_version": VERSION,
            "output_style": "default",
            "agents": [],
            "skills": [],
            "plugins": [],
            "uuid": str(uuid.uuid4()),
            "fast_mode_state": "off",
        }

    def tool_use(self, name: str, command: str) -> dict[str, Any]:
        """Return an assistant event calling tool ``name`` with ``command`` as its input."""
        event = self.assistant("")
        block = {"type": "tool_use", "id": "toolu_fake", "name": name,
                 "input": {"command": command}}  # fmt: skip
        event["message"]["content"] = [block]
        return event

    def assistant(self, text: str) -> dict[str, Any]:
        """Return an assistant event holding ``text``."""
        return {
            "type": "assistant",
            "message": {
                "id": "msg_fake",
                "type": "message",
                "role": "assistant",
                "model": self.model,
                "content": [{"type": "text", "text": text}],
                "stop_reason": None,
                "stop_sequence": None,
                "usage": dict(USAGE, output_tokens=1),
            },
            "parent_tool_use_id": None,
            "session_id": self.session_id,
            "uuid": str(uuid.uuid4()),
        }

    def result(self, text: str) -> dict[str, Any]:
        """Return a successful result event, shaped like success_oauth's."""
        return {
            "type": "result",
            "subtype": "success",
            "is_error": False,
            "api_error_status": None,
            "duration_ms": int((time.monotonic() - self.started) * 1000),
            "duration_api_ms": 1,
            "num_turns": 1,
            "result": text,
            "stop_reason": "end_turn",
            "terminal_reason": "completed",
            "session_id": self.session_id,
            "total_cost_usd": 0.00007,
            "usage": USAGE,
            "modelUsage": {
                self.model: {
                    "inputTokens": 10,
                    "outputTokens": 5,
                    "cacheReadInputTokens": USAGE["cache_read_input_tokens"],
                    "cacheCreationInputTokens": USAGE["cache_creation_input_tokens"],
                    "costUSD": 0.00007,
                    "contextWindow": CONTEXT_WINDOW,
                }
            },
            "permission_denials": [],
            "uuid": str(uuid.uuid4()),
        }

    def unknown_session(self) -> NoReturn:
        """Behave like 2.1.328 given ``--resume <unknown uuid>``: one error result, exit 1."""
        message = f"No conversation found with session ID: {self.args.resume}"
        write_event(
            {
                "type": "result",
                "subtype": "error_during_execution",
                "duration_ms": 0,
                "duration_api_ms": 0,
                "is_error": True,
                "num_turns": 0,
                "stop_reason": None,
                "session_id": self.args.resume,
                "total_cost_usd": 0,
                "usage": {"input_tokens": 0, "output_tokens": 0},
                "modelUsage": {},
                "permission_denials": [],
                "uuid": str(uuid.uuid4()),
                "errors": [message],
                "result_index": 0,
            }
        )
        die(message)

    def replay(self, name: str) -> NoReturn:
        """Print a fixture's stdout (session ids rewritten to ours) and stderr; exit its code."""
        stdout_path = find_fixture(name)
        base = stdout_path.name.removesuffix(".stdout.jsonl")
        meta = json.loads((stdout_path.parent / f"{base}.json").read_text())
        with stdout_path.open() as lines:
            for line in lines:
                if not line.strip():
                    continue
                event = json.loads(line)
                if "session_id" in event:
                    event["session_id"] = self.session_id
                write_event(event)
        stderr_path = stdout_path.parent / f"{base}.stderr.txt"
        if stderr_path.is_file():
            sys.stderr.write(stderr_path.read_text())
            sys.stderr.flush()
        sys.exit(int(meta["exit_code"]))

    def print_bytes(self, total: int) -> None:
        """Stream about ``total`` bytes of assistant events, never holding more than one chunk."""
        printed = 0
        while printed < total:
            text = "x" * min(_CHUNK, total - printed)
            line = json.dumps(self.assistant(text), separators=(",", ":")) + "\n"
            sys.stdout.write(line)
            printed += len(line)
        sys.stdout.flush()


def spawn_grandchild(seconds: float, inherit_output: bool) -> int:
    """Start a ``sleep`` in our process group (not a new session) and return its pid."""
    sleep = shutil.which("sleep") or "/bin/sleep"
    command = [sleep, str(seconds)]
    output = None if inherit_output else subprocess.DEVNULL
    child = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=output, stderr=output)
    return child.pid


def escape(how: str, seconds: float) -> int:
    """Start a ``sleep`` that leaves our process group, and return its pid.

    ``setsid``: a child in a new session (still our child). ``double-fork``: a
    daemon, whose parent exits at once, so it is nobody's child in the turn.
    Neither holds our pipes.
    """
    sleep = shutil.which("sleep") or "/bin/sleep"
    quiet = {
        "stdin": subprocess.DEVNULL,
        "stdout": subprocess.DEVNULL,
        "stderr": subprocess.DEVNULL,
    }
    if how == "setsid":
        return subprocess.Popen([sleep, str(seconds)], start_new_session=True, **quiet).pid
    read_end, write_end = os.pipe()
    middle = os.fork()
    if middle == 0:  # the middle process: a new session, one more fork, then gone
        os.close(read_end)
        os.setsid()
        daemon = subprocess.Popen([sleep, str(seconds)], **quiet)
        os.write(write_end, str(daemon.pid).encode())
        os._exit(0)
    os.close(write_end)
    pid = int(os.read(read_end, 32))
    os.close(read_end)
    os.waitpid(middle, 0)
    return pid


def read_parent() -> dict[str, str]:
    """Try to read the server (our parent) as an agent would: its environ and its memory.

    Opening `mem` is the access check itself (ptrace rights); `environ` is read too,
    and only the names in it are reported, never a value.
    """
    parent = os.getppid()
    found: dict[str, str] = {}
    try:
        with open(f"/proc/{parent}/environ", "rb") as handle:
            names = [
                e.partition(b"=")[0].decode(errors="replace") for e in handle.read().split(b"\0")
            ]
        found["environ"] = "read"
        found["environ_names"] = ",".join(name for name in names if name)
    except OSError as exc:
        found["environ"] = f"denied: {type(exc).__name__}"
    try:
        with open(f"/proc/{parent}/mem", "rb"):
            found["mem"] = "opened"
    except OSError as exc:
        found["mem"] = f"denied: {type(exc).__name__}"
    return found


def run(turn: Turn) -> int:
    """Run the prompt's directives in order, then answer with the report; return the exit code."""
    steps = directives(turn.prompt)
    names = {name for name, _ in steps}
    if "root-refusal" in names:
        die(ROOT_REFUSAL)
    if "unknown-session" in names and turn.args.resume:
        turn.unknown_session()
    if "scenario" not in names:  # a replayed fixture brings its own init event
        write_event(turn.init_event())
    answered = False
    for name, arg in steps:
        match name:
            case "scenario":
                turn.replay(arg)
            case "sleep":
                time.sleep(float(arg))
            case "spawn-grandchild":
                seconds, _, mode = arg.partition(" ")
                pid = spawn_grandchild(float(seconds or 60), mode.strip() == "inherit")
                write_event({"type": "system", "subtype": "fake_grandchild", "pid": pid})
            case "escape":
                how, _, seconds = arg.partition(" ")
                pid = escape(how, float(seconds or 60))
                write_event({"type": "system", "subtype": "fake_escapee", "pid": pid})
            case "read-parent":
                write_event({"type": "system", "subtype": "fake_parent", **read_parent()})
            case "api-retry":  # as the real CLI reports a retry of its own: 2.1.328's shape
                retry = {"attempt": int(arg or 1), "max_retries": 10, "retry_delay_ms": 500,
                         "error_status": 529, "error": "overloaded_error"}  # fmt: skip
                write_event({"type": "system", "subtype": "api_retry", **retry,
                             "session_id": turn.session_id})  # fmt: skip
            case "tool":  # an assistant line calling a tool, as the CLI streams one
                tool, _, command = arg.partition(" ")
                write_event(turn.tool_use(tool, command))
            case "print-bytes":
                turn.print_bytes(int(arg))
            case "echo-env":
                # A credential the CLI read from a descriptor is in its memory all the same.
                held = turn.env.get(arg) or turn.credentials.get(arg)
                write_event(turn.assistant(held or "<unset>"))
            case "stderr":
                sys.stderr.write(arg + "\n")
                sys.stderr.flush()
            case "exit":
                sys.stdout.flush()
                return int(arg)
            case "kill-self":
                sys.stdout.flush()
                os.kill(os.getpid(), signal.SIGKILL)
            case "result":  # the result now; what follows runs after it
                answer(turn)
                answered = True
            case "ignore-sigterm":
                signal.signal(signal.SIGTERM, signal.SIG_IGN)
            case _:
                pass  # "unknown-session" without --resume, or prose that starts with "@"
    if not answered:
        answer(turn)
    return 0


def answer(turn: Turn) -> None:
    """Print the report as the model's text and as the success result."""
    text = json.dumps(turn.report(), sort_keys=True)
    write_event(turn.assistant(text))
    write_event(turn.result(text))


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``fake-claude``."""
    turn = Turn(sys.argv[1:] if argv is None else argv, dict(os.environ), sys.stdin.read())
    if turn.args.prompt and not turn.prompt:
        turn.prompt = turn.args.prompt
    return run(turn)


if __name__ == "__main__":
    sys.exit(main())
