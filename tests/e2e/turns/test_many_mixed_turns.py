"""Chaos: many mixed turns at once against one server, then no orphan and no zombie.

Contract §6, §7.

Fifty turns run concurrently over sixteen slots: normal ones, ones that leave a
grandchild behind, CLIs that SIGKILL themselves, timeouts, and turns stopped through
the terminate route (some ignoring SIGTERM). Every answer must be one the contract
names for that turn (a 409 busy is retried like the controller would), and when the
dust settles no process of any turn survives, alive or as a zombie.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import SecretRegistry
from tests.e2e.conftest import ProcessMark, ProcessProbe, TurnServers
from tests.support.server import FAKE_CLAUDE, ServerProcess

MAX_PARALLEL = 16
CLIENTS = 24
ROUNDS = 10  # x 5 kinds = 50 turns
# A sleep length no other test uses, so a surviving grandchild is recognisable by argv.
GRANDCHILD_S = "30.417"
GRANDCHILD = f"@spawn-grandchild {GRANDCHILD_S}"
BUSY_RETRY_S = 0.2
BUSY_RETRIES = 200


@dataclass(frozen=True)
class Kind:
    """One kind of chaos turn: its prompt, timeout, and the answer the contract gives it."""

    name: str
    message: str
    status: int
    outcome: str  # body status for a 200, detail.error_code otherwise
    timeout_s: int = 60
    terminate: bool = False


KINDS = (
    Kind("normal", "@sleep 0.2\nhello", 200, "success"),
    Kind("grandchild", f"{GRANDCHILD}\n@sleep 0.3", 200, "success"),
    Kind("kill-self", f"{GRANDCHILD}\n@sleep 0.3\n@kill-self", 504, "killed"),
    Kind("timeout", f"{GRANDCHILD}\n@sleep 5", 504, "timeout", timeout_s=1),
    Kind("terminate", f"{GRANDCHILD}\n@sleep 5", 200, "cancelled", terminate=True),
    Kind(
        "terminate-stubborn",
        f"@ignore-sigterm\n{GRANDCHILD}\n@sleep 5",
        200,
        "cancelled",
        terminate=True,
    ),
)


@dataclass
class Answer:
    """The final answer of one turn, and every 409 busy it got before."""

    kind: Kind
    execution_id: str
    status: int
    body: dict[str, Any]
    busy: list[httpx.Response]
    marks: list[ProcessMark]


def post_turn(server: ServerProcess, kind: Kind, execution_id: str) -> httpx.Response:
    """POST one task turn (a client per call: safe from threads)."""
    body = {
        "message": kind.message,
        "execution_id": execution_id,
        "timeout_seconds": kind.timeout_s,
    }
    with server.client(timeout=60) as client:
        return client.post("/api/task", json=body)


def running_ids(server: ServerProcess) -> set[str]:
    """The execution ids the server lists as running."""
    with server.client(timeout=10) as client:
        response = client.get("/api/executions/running")
    assert response.status_code == 200, response.text
    return {e["execution_id"] for e in response.json()["executions"]}


def run_turn(
    server: ServerProcess, processes: ProcessProbe, kind: Kind, execution_id: str
) -> Answer:
    """Run one turn to its final answer, retrying 409 busy; terminate it when its kind says so."""
    busy: list[httpx.Response] = []
    marks: list[ProcessMark] = []
    with ThreadPoolExecutor(1) as inner:
        for _ in range(BUSY_RETRIES):
            turn: Future[httpx.Response] = inner.submit(post_turn, server, kind, execution_id)
            if kind.terminate:
                marks = terminate_when_running(server, processes, execution_id, turn)
            response = turn.result()
            if response.status_code == 409 and response.json()["detail"]["error_code"] == "busy":
                busy.append(response)
                time.sleep(BUSY_RETRY_S)
                continue
            return Answer(kind, execution_id, response.status_code, response.json(), busy, marks)
    msg = f"{execution_id} stayed busy {BUSY_RETRIES} times"
    raise AssertionError(msg)


def terminate_when_running(
    server: ServerProcess,
    processes: ProcessProbe,
    execution_id: str,
    turn: Future[httpx.Response],
) -> list[ProcessMark]:
    """Once the turn runs with its grandchild, terminate it; return the processes seen."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not turn.done():
        if execution_id in running_ids(server):
            marks = processes.wait_for(execution_id, comm="sleep")
            with server.client(timeout=10) as client:
                stop = client.post(f"/api/executions/{execution_id}/terminate")
            assert stop.status_code == 200, stop.text
            assert stop.json() == {"status": "terminated"}, execution_id
            return marks
        time.sleep(0.05)
    return []  # answered before it ran: a 409 busy, retried by the caller


def fake_cli_processes(id_prefix: str) -> dict[int, str]:
    """Live processes (any parent) of this test's turns: the fake CLI or the grandchild.

    Other suites may run fake CLIs on this machine at the same time: only processes
    whose environment carries one of this test's execution ids count.
    """
    found = {}
    needles = (str(FAKE_CLAUDE).encode(), f"sleep\0{GRANDCHILD_S}".encode())
    ours = f"TRINITY_EXECUTION_ID={id_prefix}".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        if ours in environ and any(needle in cmdline for needle in needles):
            found[int(entry.name)] = cmdline.replace(b"\0", b" ").decode(errors="replace")
    return found


def zombie_children(parent: int) -> list[int]:
    """Children of `parent` in state Z (exited but never reaped)."""
    zombies = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            raw = (entry / "stat").read_bytes()
        except OSError:
            continue
        fields = raw.rpartition(b")")[2].split()
        if fields[0] == b"Z" and int(fields[1]) == parent:
            zombies.append(int(entry.name))
    return zombies


def settle(probe: Callable[[], Any], within: float) -> Any:
    """`probe()` once it is empty, or its last value after `within` seconds."""
    deadline = time.monotonic() + within
    while True:
        value = probe()
        if not value or time.monotonic() >= deadline:
            return value
        time.sleep(0.05)


@pytest.fixture
def server(turn_servers: TurnServers, secret_registry: SecretRegistry) -> ServerProcess:
    """One server with the fake CLI and sixteen turn slots."""
    return turn_servers.start(
        CLAUDE_CODE_OAUTH_TOKEN=secret_registry.new("chaos"),
        AGENT_SERVER_MAX_PARALLEL=str(MAX_PARALLEL),
    )


def test_mixed_chaos_answers_by_contract_and_leaves_no_process(
    server: ServerProcess, processes: ProcessProbe
) -> None:
    """Every turn gets its contract answer; afterwards no orphan and no zombie remains."""
    id_prefix = f"chaos{secrets.token_hex(4)}-"
    plan = [
        (kind, f"{id_prefix}{kind.name}-{round_no}")
        for round_no in range(ROUNDS)
        for kind in KINDS[: 5 if round_no % 2 else 6]
    ]
    assert len(plan) >= 48
    with ThreadPoolExecutor(CLIENTS) as pool:
        futures = [pool.submit(run_turn, server, processes, kind, eid) for kind, eid in plan]
        answers = [future.result() for future in futures]

    wrong = []
    for answer in answers:
        kind, body = answer.kind, answer.body
        got = body.get("status") if answer.status == 200 else body["detail"]["error_code"]
        if (answer.status, got) != (kind.status, kind.outcome):
            wrong.append((answer.execution_id, answer.status, got))
        if answer.status != 200:
            assert body["detail"]["execution_id"] == answer.execution_id
            assert body["detail"]["retryable"] is False
            assert body["detail"]["switch_credential"] is False
        for refused in answer.busy:
            assert refused.json()["detail"]["retryable"] is True
            assert int(refused.headers["Retry-After"]) >= 1
    assert wrong == [], f"answers outside the contract: {wrong}"
    assert sum(len(a.busy) for a in answers) > 0, "the slots never ran out: no chaos"
    assert all(a.status in (200, 504) for a in answers)  # never a 500 internal error

    assert settle(lambda: running_ids(server), within=10) == set()
    marks = [mark for answer in answers for mark in answer.marks]
    assert len(marks) >= 2 * ROUNDS, "the probe never saw the terminated turns' processes"
    assert processes.survivors(marks, within=5) == {}
    assert settle(lambda: fake_cli_processes(id_prefix), within=5) == {}, (
        "a turn's process outlived it"
    )
    process = server.process
    assert process is not None
    assert settle(lambda: zombie_children(process.pid), within=5) == []
    assert process.poll() is None, "the server died under chaos"
    with server.client() as client:
        health = client.get("/health").json()
    assert health["active_executions"] == 0
