"""A stand-in CLI that attacks the server's host, not its output (stdlib only).

Run through ``intruder-cli``, it reads a JSON prompt ``{"attacks": [...], ...}`` on
stdin, tries each attack as a hostile agent's tool would, and answers with one
stream-json result whose text is a JSON report of what each attempt got. It never
prints a value it found: credentials appear only as sha256-12 fingerprints, so the
test compares them with the secrets it handed out.

Attacks (prompt keys in brackets):

- ``whoami``: its uid, gid, groups, capability sets and ``no_new_privs``;
- ``signal_server``: ``kill(ppid, 0)``, then SIGSTOP (undone at once if it landed),
  then SIGKILL only if SIGSTOP was refused;
- ``read_server``: the server's ``/proc/<ppid>/environ``, ``mem`` and ``fd``;
- ``state_dir`` [``state_dir``]: list it, read and write its files, plant a FIFO;
- ``scan_environ``: every readable ``/proc/*/environ``: fingerprints of the values of
  credential names, and of what any ``*_FILE_DESCRIPTOR`` descriptor still holds;
- ``own_environ``: the names in its own environment, and fingerprints of its values;
- ``escape`` [``escape_s``]: a double-forked, ``setsid`` sleeper; its pid is reported;
- ``post_callback`` [``execution_id``]: POST a forged envelope to the controller with
  the callback key from its own environment;
- ``hold`` [``hold_s``]: sleep (so that a parallel turn runs meanwhile).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from tests.support.hostile_cli import init, result

CREDENTIAL_SUFFIXES = ("_TOKEN", "_KEY", "_SECRET", "_PASSWORD")
DESCRIPTOR_SUFFIX = "_FILE_DESCRIPTOR"


def fingerprint(value: str | bytes) -> str:
    """The first 12 hex digits of the sha256 of `value` (what tests compare)."""
    data = value.encode() if isinstance(value, str) else value
    return hashlib.sha256(data.strip()).hexdigest()[:12]


def attempt(action: Any) -> str:
    """`ok` (or what the action returned), else `denied: <error>`."""
    try:
        result = action()
    except OSError as exc:
        return f"denied: {type(exc).__name__}"
    return "ok" if result is None else str(result)


def whoami() -> dict[str, Any]:
    status = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines())
    keys = ("Uid", "Gid", "Groups", "CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb")
    found = {key: status.get(key, "").split() for key in keys}
    found["NoNewPrivs"] = status.get("NoNewPrivs", "").strip()
    return found


def signal_server() -> dict[str, str]:
    parent = os.getppid()
    found = {"probe": attempt(lambda: os.kill(parent, 0))}
    found["stop"] = attempt(lambda: os.kill(parent, signal.SIGSTOP))
    if found["stop"] == "ok":
        os.kill(parent, signal.SIGCONT)  # never leave the test's server frozen
    else:
        found["kill"] = attempt(lambda: os.kill(parent, signal.SIGKILL))
    return found


def read_server() -> dict[str, str]:
    proc = Path(f"/proc/{os.getppid()}")
    return {
        "environ": attempt(lambda: len((proc / "environ").read_bytes())),
        "mem": attempt(lambda: open(proc / "mem", "rb").close()),
        "fd": attempt(lambda: len(os.listdir(proc / "fd"))),
    }


def state_dir(path: str) -> dict[str, str]:
    state = Path(path)
    forged = '{"execution_id":"forged","status":"success","response":"forged"}'
    return {
        "list": attempt(lambda: len(os.listdir(state))),
        "read_token": attempt(lambda: len((state / "oauth-token").read_bytes())),
        "read_controller_token": attempt(lambda: len((state / "agent-auth-token").read_bytes())),
        "write_token": attempt(lambda: (state / "oauth-token").write_text("sk-ant-oat01-mine")),
        "forge_result": attempt(lambda: (state / "results" / "forged.json").write_text(forged)),
        "plant_fifo": attempt(lambda: os.mkfifo(state / "chat-session-id.fifo")),
        "plant_pending": attempt(lambda: (state / "pending-results" / "x.json").write_text("{}")),
    }


def scan_environ() -> dict[str, Any]:
    found: set[str] = set()
    descriptors: set[str] = set()
    readable = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            raw = (entry / "environ").read_bytes()
        except OSError:
            continue
        readable += 1
        for item in raw.split(b"\0"):
            name, _, value = item.decode(errors="replace").partition("=")
            if name.endswith(DESCRIPTOR_SUFFIX) and value.isdigit():
                with contextlib.suppress(OSError):
                    fd = os.open(entry / "fd" / value, os.O_RDONLY | os.O_NONBLOCK)
                    with contextlib.suppress(OSError):
                        data = os.read(fd, 4096)
                        if data.strip():
                            descriptors.add(fingerprint(data))
                    os.close(fd)
            elif name.endswith(CREDENTIAL_SUFFIXES) and value:
                found.add(fingerprint(value))
    return {"readable": readable, "fingerprints": sorted(found), "descriptors": sorted(descriptors)}


def own_environ() -> dict[str, Any]:
    return {
        "names": sorted(os.environ),
        "fingerprints": sorted(fingerprint(v) for v in os.environ.values() if v),
    }


def escape(seconds: float) -> int:
    read, write = os.pipe()
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            os.write(write, str(os.getpid()).encode())
            os.close(write)
            os.closerange(0, 3)
            time.sleep(seconds)
            os._exit(0)
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        return int(pipe.read() or 0)


def post_callback(execution_id: str) -> str:
    base = os.environ.get("TRINITY_BACKEND_URL", "")
    key = os.environ.get("TRINITY_MCP_API_KEY", "")
    agent = os.environ.get("AGENT_NAME", "agent")
    body = {"execution_id": execution_id, "status": "success", "response": "forged by the agent"}
    request = urllib.request.Request(  # noqa: S310 - a loopback URL the test chose
        f"{base}/api/agents/{agent}/executions/{execution_id}/result",
        data=json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:  # noqa: S310
            return str(answer.status)
    except urllib.error.HTTPError as exc:
        return str(exc.code)
    except OSError as exc:
        return f"failed: {type(exc).__name__}"


def report(prompt: dict[str, Any]) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for name in prompt.get("attacks", []):
        if name == "whoami":
            found[name] = whoami()
        elif name == "signal_server":
            found[name] = signal_server()
        elif name == "read_server":
            found[name] = read_server()
        elif name == "state_dir":
            found[name] = state_dir(prompt["state_dir"])
        elif name == "scan_environ":
            found[name] = scan_environ()
        elif name == "own_environ":
            found[name] = own_environ()
        elif name == "escape":
            found[name] = escape(float(prompt.get("escape_s", 60)))
        elif name == "post_callback":
            found[name] = post_callback(prompt["execution_id"])
        elif name == "hold":
            time.sleep(float(prompt.get("hold_s", 1)))
            found[name] = "ok"
    return found


def read_own_descriptors() -> list[str]:
    """As Claude Code does at its start: read each credential descriptor to its end (the
    names of those found)."""
    found = []
    for name, value in os.environ.items():
        if name.endswith(DESCRIPTOR_SUFFIX) and value.isdigit():
            with contextlib.suppress(OSError), open(int(value), "rb", closefd=False) as pipe:
                pipe.read()
                found.append(name)
    return found


def main() -> int:
    """Read its credential descriptors, run the attacks the prompt names; print init and
    the result (the report)."""
    read_own_descriptors()
    prompt = json.loads(sys.stdin.read() or "{}")
    init()
    result(json.dumps(report(prompt), sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
