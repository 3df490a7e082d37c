"""A minimal stand-in for Claude Code's print mode (stdlib only), for benchmarks.

It reads the prompt on stdin and prints init, assistant and result events shaped like
tests/fixtures/claude-code-2.1.328/success_oauth.stdout.jsonl, with the session id
taken from `--session-id`. Unlike tests/support/fake-claude it parses no flags and
imports almost nothing, so the CLI's own cost stays small and steady and the figures
show the server. Directives, one a line in the prompt, run in order after init:

    @sleep S                 sleep S seconds
    @print-bytes N           about N bytes of assistant events, 64 KiB of text each
    @stream S LINE_BYTES T   assistant events of about LINE_BYTES, one every T s, for S s
    @flood KIND S            for S s, as fast as the pipe takes them: `empty` lines,
                             `byte` lines (one byte each) or `wide` 16 MiB lines
    @stream-api S LINE_BYTES T  the same, each one a chunk streamed from
                             `$ANTHROPIC_BASE_URL/stream` with the turn's OAuth credential
                             (from its descriptor): the API's traffic, through the broker

`install_standin(directory)` writes it as an executable with an absolute shebang
(`python -IS`: no site, no environment), so no PATH lookup or shim is timed.
"""

from __future__ import annotations

import http.client
import json
import os
import sys
import time
import uuid
from pathlib import Path
from urllib.parse import urlsplit

MODEL = "claude-sonnet-5-5"
_CHUNK = 64 * 1024


def install_standin(directory: Path) -> Path:
    """Write this file as an executable `claude` stand-in in `directory`; return its path."""
    source = Path(__file__).read_text(encoding="utf-8")
    target = directory / "standin-claude"
    target.write_text(f"#!{sys.executable} -IS\n{source}", encoding="utf-8")
    target.chmod(0o755)
    return target


def _emit(event: dict[str, object]) -> None:
    sys.stdout.write(json.dumps(event, separators=(",", ":")) + "\n")
    sys.stdout.flush()


def _assistant(session_id: str, text: str) -> dict[str, object]:
    return {
        "type": "assistant",
        "message": {
            "id": "msg_bench",
            "type": "message",
            "role": "assistant",
            "model": MODEL,
            "content": [{"type": "text", "text": text}],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": 10, "output_tokens": 1},
        },
        "parent_tool_use_id": None,
        "session_id": session_id,
        "uuid": str(uuid.uuid4()),
    }


def _print_bytes(session_id: str, total: int) -> None:
    printed = 0
    while printed < total:
        line = json.dumps(_assistant(session_id, "x" * min(_CHUNK, total - printed)))
        sys.stdout.write(line + "\n")
        printed += len(line) + 1
    sys.stdout.flush()


def _stream(session_id: str, seconds: float, line_bytes: int, interval: float) -> None:
    text = "y" * max(line_bytes - 400, 1)  # the event's envelope is about 400 bytes
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        _emit(_assistant(session_id, text))
        time.sleep(interval)


FLOODS = {"empty": b"\n" * _CHUNK, "byte": b"x\n" * (_CHUNK // 2)}
WIDE_LINE_BYTES = 16 * 1024 * 1024


def _flood(kind: str, seconds: float) -> None:
    """Print `kind` lines for `seconds` (a hostile CLI: every line must cost the server)."""
    if kind == "wide":
        head = b'{"type":"assistant","message":{"content":[{"type":"text","text":"'
        chunk = head + b"w" * (WIDE_LINE_BYTES - len(head) - 8) + b'"}]}}\n'
    else:
        chunk = FLOODS[kind]
    out = sys.stdout.buffer
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        out.write(chunk)
    out.flush()


def _credential() -> str:
    """The OAuth credential as Claude Code takes it: its descriptor, else its variable."""
    fd = os.environ.get("CLAUDE_CODE_OAUTH_TOKEN_FILE_DESCRIPTOR")
    if fd is not None:
        return os.read(int(fd), 65536).decode().strip()
    return os.environ.get("CLAUDE_CODE_OAUTH_TOKEN", "")


def _stream_api(session_id: str, seconds: float, line_bytes: int, interval: float) -> None:
    base = urlsplit(os.environ["ANTHROPIC_BASE_URL"])
    connection = http.client.HTTPConnection(base.hostname or "127.0.0.1", base.port, timeout=60)
    query = f"seconds={seconds}&bytes={line_bytes}&interval={interval}"
    connection.request(
        "POST", f"/stream?{query}", body=b"{}", headers={"authorization": f"Bearer {_credential()}"}
    )
    response = connection.getresponse()
    while chunk := response.read1(65536):
        _emit(_assistant(session_id, chunk.decode(errors="replace")))


def main(argv: list[str]) -> int:
    """Run one turn: init, the prompt's directives, a final assistant event and result.

    The result event also carries `bench_clock_ns`: CLOCK_MONOTONIC (shared by every
    process of the machine) when `main` started, before the first event was written,
    and before the result event was written, for the timeline (bench/timeline.py).
    """
    main_ns = time.monotonic_ns()
    started = time.monotonic()
    session_id = argv[argv.index("--session-id") + 1] if "--session-id" in argv else "bench"
    prompt = sys.stdin.read()
    first_ns = time.monotonic_ns()
    _emit(
        {
            "type": "system",
            "subtype": "init",
            "cwd": str(Path.cwd()),
            "session_id": session_id,
            "tools": ["Task", "Bash", "Edit", "Read", "Write"],
            "mcp_servers": [],
            "model": MODEL,
            "permissionMode": "bypassPermissions",
            "apiKeySource": "none",
            "claude_code_version": "2.1.328",
            "output_style": "default",
            "uuid": str(uuid.uuid4()),
        }
    )
    for line in prompt.splitlines():
        word, *args = line.split() or [""]
        if word == "@sleep":
            time.sleep(float(args[0]))
        elif word == "@print-bytes":
            _print_bytes(session_id, int(args[0]))
        elif word == "@stream":
            _stream(session_id, float(args[0]), int(args[1]), float(args[2]))
        elif word == "@flood":
            _flood(args[0], float(args[1]))
        elif word == "@stream-api":
            _stream_api(session_id, float(args[0]), int(args[1]), float(args[2]))
    _emit(_assistant(session_id, "bench ok"))
    duration_ms = int((time.monotonic() - started) * 1000)
    last_ns = time.monotonic_ns()
    _emit(
        {
            "type": "result",
            "subtype": "success",
            "is_error": False,
            "api_error_status": None,
            "duration_ms": duration_ms,
            "duration_api_ms": 0,
            "num_turns": 1,
            "result": "bench ok",
            "stop_reason": "end_turn",
            "session_id": session_id,
            "total_cost_usd": 0.00007,
            "usage": {"input_tokens": 10, "output_tokens": 5},
            "permission_denials": [],
            "terminal_reason": "completed",
            "uuid": str(uuid.uuid4()),
            "bench_clock_ns": [main_ns, first_ns, last_ns],
        }
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
