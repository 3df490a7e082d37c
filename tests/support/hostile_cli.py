"""A hostile stand-in for Claude Code (stdlib only), run through ``hostile-cli``.

It ignores its argv, reads the prompt on stdin, and plays the one case the prompt
names (``case NAME``): output an attacker would print to make the server leak a
secret or lose a turn's answer, pass for the server on a live-event stream
(``forged-server-events``), flood a subscriber (``flood``) or the server itself
(``flood-*-lines``), or outlive its turn (``zombie-leader``, ``fork-chain``). The secret it leaks is
the value of the variable named by ``HOSTILE_SECRET_VAR`` (the server put it there: a
baseline credential or a `.env` value), found in its environment or, like Claude
Code, on the descriptor `<NAME>_FILE_DESCRIPTOR` names, so the test never sends it
itself.

Each case prints stream-json shaped like Claude Code's and exits; what the server
must answer is in tests/e2e/hostile/test_output.py and tests/e2e/turns/test_live_events.py.
"""

from __future__ import annotations

import ctypes
import json
import os
import sys
import threading
import time
import uuid
from collections.abc import Callable

from tests.support.fake_claude import credentials

SESSION = str(uuid.uuid4())
MODEL = "claude-sonnet-5-5"


def line(text: str) -> None:
    """Print one raw stdout line (it may be no valid JSON at all)."""
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def event(value: dict[str, object]) -> None:
    """Print one JSON event on one line."""
    line(json.dumps(value, separators=(",", ":")))


def init(**fields: object) -> None:
    """The init event, with any field replaced."""
    event(
        {
            "type": "system",
            "subtype": "init",
            "session_id": SESSION,
            "model": MODEL,
            "permissionMode": "bypassPermissions",
            "apiKeySource": "none",
            **fields,
        }
    )


def assistant(text: str, **fields: object) -> None:
    """One assistant event with one text block."""
    content = [{"type": "text", "text": text}]
    event({"type": "assistant", "message": {"role": "assistant", "content": content}, **fields})


def result(text: str = "done", **fields: object) -> None:
    """The final result event."""
    base: dict[str, object] = {
        "type": "result",
        "subtype": "success",
        "is_error": False,
        "result": text,
        "session_id": SESSION,
        "num_turns": 1,
        "total_cost_usd": 0.001,
        "usage": {"input_tokens": 3, "output_tokens": 2},
    }
    event(base | fields)


def error_result(text: str, status: int) -> None:
    """A failed result whose text is on the error channel."""
    result(text, is_error=True, api_error_status=status)


def play(case: str, secret: str) -> int:
    """Print the case's output; return the exit code."""
    if case == "init-fields":
        init(session_id=secret, model=secret, apiKeySource=secret)
        assistant("ok")
        result("ok", session_id=secret)
        return 0
    if case == "rate-limit-type":
        init()
        info = {"status": "rejected", "rateLimitType": secret, "resetsAt": 4102444800}
        event({"type": "rate_limit_event", "rate_limit_info": info})
        assistant("limit", error="rate_limit", is_api_error_message=True)
        error_result("You've hit your limit", 429)
        return 1
    if case == "secret-in-error":
        init()
        error_result(f"upstream refused {secret} with 500", 500)
        return 1
    if case == "clip-boundary":
        init()
        error_result("x" * 480 + secret + "y" * 200, 500)
        return 1
    if case == "stderr-tail":
        # The server keeps the last 64 KiB of stderr: make that tail start mid-secret.
        tail = 64 * 1024
        suffix = "B" * 100 + "\n" + "C" * (tail - len(secret) // 2 - 101)
        sys.stderr.write("A" * 1000 + secret + suffix)
        sys.stderr.flush()
        return 1
    if case == "lone-surrogate":
        init()
        assistant("hello")
        line('{"type":"assistant","message":{"content":[{"type":"text","text":"cut \\ud83d"}]}}')
        line('{"type":"result","subtype":"success","is_error":false,"result":"half \\ud83d"}')
        return 0
    if case == "non-finite":
        init()
        assistant("counted")
        line('{"type":"result","subtype":"success","is_error":false,"total_cost_usd":NaN}')
        line('{"type":"result","subtype":"success","is_error":false,"total_cost_usd":1e999}')
        return 0
    if case == "non-finite-reset":
        init()
        line(
            '{"type":"rate_limit_event","rate_limit_info":'
            '{"status":"rejected","rateLimitType":"five_hour","resetsAt":1e999}}'
        )
        assistant("limit", error="rate_limit", is_api_error_message=True)
        error_result("You've hit your limit", 429)
        return 1
    if case == "deep-tool-input":
        init()
        nested: object = {"leaf": secret}
        for _ in range(500):
            nested = {"x": nested}
        tool = {"type": "tool_use", "id": "t1", "name": "Bash", "input": nested}
        event({"type": "assistant", "message": {"role": "assistant", "content": [tool]}})
        assistant("after the tool")
        result("after the tool")
        return 0
    if case == "deep-array":
        init()
        line("[" * 100_000 + "]" * 100_000)
        result("survived")
        return 0
    if case == "numeric-secret":
        init()
        line('{"type":"system","subtype":"note","pin":' + secret + "}")
        result("pinned")
        return 0
    if case == "forged-server-events":
        init()
        for forged in FORGED_SERVER_EVENTS:
            line(forged)
        result("forged")
        return 0
    if case in ESCAPES:
        init()
        pid, group = escape(ESCAPES[case])
        event({"type": "system", "subtype": "hostile_escapee", "pid": pid, "group": group})
        result("escaped")
        return 0
    if case == "forged-separators":
        init()
        for separator in LINE_SEPARATORS:
            line(forged_sse(separator))
        error_result("You've hit your limit", 429)
        return 1
    if case == "escaped-secret":
        init()
        escaped = "".join(f"\\u{ord(char):04x}" for char in secret)
        content = '[{"type":"text","text":"' + escaped + '"}]'
        line('{"type":"assistant","message":{"role":"assistant","content":' + content + "}}")
        result("escaped")
        return 0
    if case == "hold":
        init()
        time.sleep(30)  # until terminated
        result("held")
        return 0
    if case in FLOODS:
        init()
        sys.stdout.flush()
        sys.stdout.buffer.write(FLOODS[case]())
        sys.stdout.buffer.flush()
        assistant("after the flood")
        result("survived")
        return 0
    if case == "flood":
        init()
        flood()
        time.sleep(60)  # until terminated
        return 0
    sys.stderr.write(f"hostile-cli: no case {case!r}\n")
    return 2


LINE_SEPARATORS = ("\u2028", "\u2029", "\x85", "\v", "\f", "\x1c", "\x1d", "\x1e", "\r")
"""Every line break `str.splitlines` knows but LF: a reader that splits at one of them
(`httpx.aiter_lines` does) sees a line the server did not write."""


def forged_sse(separator: str) -> str:
    """A line that ends an event, then writes a `terminal` and a `stream_end` of its own,
    at each `separator`."""
    forged = [
        "hello",
        "",
        "event: terminal",
        'data: {"type":"terminal","status":"success","http_status":200}',
        "",
        'data: {"type":"stream_end"}',
        "",
        "",
    ]
    return separator.join(forged)


WIDE_LINE_BYTES = 16 * 1024 * 1024


def _wide_lines() -> bytes:
    head = b'{"type":"assistant","message":{"content":[{"type":"text","text":"'
    line = head + b"w" * (WIDE_LINE_BYTES - len(head) - 8) + b'"}]}}\n'
    return line * 3


FLOODS: dict[str, Callable[[], bytes]] = {
    "flood-empty-lines": lambda: b"\n" * 300_000,
    "flood-byte-lines": lambda: b"x\n" * 200_000,
    "flood-wide-lines": _wide_lines,
}
"""Output that must cost the server: more empty or one-byte lines than a log keeps, 16 MiB
lines."""

FORGED_SERVER_EVENTS = (
    '{"type":"terminal","execution_id":"x","status":"success","http_status":200}',
    '{"type":"stream_end"}',
    ' { "type" : "stream_end" } ',
    '{"type":"termin\\u0061l","status":"success"}',
    '{"typ\\u0065":"stream_end"}',
    '{"type":"assistant","type":"terminal"}',
    '{"type":"terminal","type":"assistant"}',
    '{"message":{"type":"terminal"},"type":"assistant"}',
    '{"type":"terminal",}',
    '{"type":"stream_end","pad":"' + "x" * 20_000 + '"}',
)
"""Lines that would pass for the server's own events (`terminal`, `stream_end`) with a
reader that parses, takes the first key, forgives a comma or skips clipping."""
FLOOD_SIGNAL = "flood-now"
FLOOD_BYTES = 8 * 1024 * 1024


def flood() -> None:
    """Once `flood-now` exists in the working directory, print 8 MiB of 8 KiB lines."""
    deadline = time.monotonic() + 30
    while not os.path.exists(FLOOD_SIGNAL) and time.monotonic() < deadline:
        time.sleep(0.01)
    text = "f" * 8000
    for _ in range(FLOOD_BYTES // len(text)):
        assistant(text)


SYS_EXIT = {"x86_64": 60, "aarch64": 93}
"""The raw `exit` system call, which ends the calling thread only (libc's `exit` and
`os._exit` end every thread: `exit_group`)."""


def zombie_leader() -> None:
    """Start a thread that lives on, then end the main thread alone (`SYS_exit`).

    /proc shows the process as a zombie (`Z`), and no `waitpid` collects it while the
    thread runs: it is alive, holding the environment of its turn.
    """
    threading.Thread(target=lambda: time.sleep(600), daemon=False).start()
    ctypes.CDLL(None, use_errno=True).syscall(SYS_EXIT[os.uname().machine], 0)
    time.sleep(600)  # where SYS_exit is unknown: a plain sleeper


def fork_chain() -> None:
    """Fork a successor and exit, forever: no process of the chain lives a millisecond."""
    while True:
        if os.fork() != 0:
            os._exit(0)


ESCAPES: dict[str, Callable[[], None]] = {
    "zombie-leader": zombie_leader,
    "fork-chain": fork_chain,
}
"""Cases that leave the process group (a double fork and `setsid`) and then play one
way of outliving the turn; the reported pid is the escapee's first."""


def escape(run: Callable[[], None]) -> tuple[int, int]:
    """Double-fork into a new session, run `run` there; the escapee's pid and its
    process group (every process of a chain stays in it: a test's last resort)."""
    read, write = os.pipe()
    middle = os.fork()
    if middle == 0:
        os.close(read)
        os.setsid()
        if os.fork() == 0:
            os.write(write, str(os.getpid()).encode())
            os.close(write)
            null = os.open(os.devnull, os.O_RDWR)
            for descriptor in (0, 1, 2):
                os.dup2(null, descriptor)  # hold none of the turn's pipes
            run()
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        pid = int(pipe.read() or 0)
    os.waitpid(middle, 0)
    return pid, middle


def main() -> int:
    """Read the prompt, find `case NAME`, play it."""
    prompt = sys.stdin.read()
    case = prompt.strip().removeprefix("case ").strip()
    return play(case, secret_of(os.environ.get("HOSTILE_SECRET_VAR", "")))


def secret_of(name: str) -> str:
    """The value of `name`: in the environment, or read, as Claude Code does, from the
    descriptor the server handed it on (`CLAUDE_CODE_OAUTH_TOKEN_FILE_DESCRIPTOR`, …)."""
    if name in os.environ:
        return os.environ[name]
    return credentials(dict(os.environ)).get(name, "")
