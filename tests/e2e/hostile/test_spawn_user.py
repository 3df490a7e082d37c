"""Privilege separation (contract §10): the agent as another user cannot reach the server.

A real server runs as root (as CI does) with `AGENT_SERVER_SPAWN_USER` set to a test
user; its runtime is the intruder stand-in (tests/support/intruder_cli.py), which tries
what a hostile agent's tools would: signal or read the server, reach its state dir,
find another turn's credential in any environment, leave a process behind, forge a
callback. Every attempt must fail, and the server must answer as before. One turn runs
the pinned Claude Code as the spawn user instead: it reads its token from the server's
pipe, and its Bash tool finds the token in no environment.
"""

from __future__ import annotations

import json
import os
import pwd
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import SecretRegistry
from tests.e2e.conftest import TurnServers, wait_listed
from tests.support.agent_user import Reachable
from tests.support.callback_receiver import CallbackReceiver
from tests.support.fake_cli import fingerprint
from tests.support.messages_api import QUIET_CLI, MessagesApiStandIn, Scenario, require_real_cli
from tests.support.server import ServerProcess

pytestmark = pytest.mark.timeout(180)

ALL_CAPS_DROPPED = ["0000000000000000"]


def _start(turn_servers: TurnServers, reachable: Reachable, **extra: str) -> ServerProcess:
    """A server as root whose turns run the intruder as the spawn user, in its own workdir."""
    environ = reachable.spawn_environ(reachable.stand_in("intruder-cli"))
    return turn_servers.start(**{**environ, **extra})


def _attack(server: ServerProcess, *attacks: str, **body: Any) -> dict[str, Any]:
    """One turn of the intruder: what each attack got."""
    prompt = {"attacks": list(attacks), **body.pop("prompt", {})}
    with server.client(timeout=120) as client:
        answer = client.post("/api/task", json={"message": json.dumps(prompt), **body})
    assert answer.status_code == 200, answer.text
    report: dict[str, Any] = json.loads(answer.json()["response"])
    return report


def test_a_turn_runs_as_the_spawn_user_with_nothing_to_gain(
    turn_servers: TurnServers, reachable: Reachable, spawn_user: pwd.struct_passwd
) -> None:
    """Its uid and group, no other group, every capability set empty, no_new_privs; and
    /health says so."""
    server = _start(turn_servers, reachable)
    me = _attack(server, "whoami")["whoami"]
    assert me["Uid"] == [str(spawn_user.pw_uid)] * 4
    assert me["Gid"] == [str(spawn_user.pw_gid)] * 4
    assert me["Groups"] == []
    for capability_set in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
        assert me[capability_set] == ALL_CAPS_DROPPED, capability_set
    assert me["NoNewPrivs"] == "1"
    health = server.get("/health").json()
    assert (health["isolation"], health["spawn_user"]) == ("spawn_user", spawn_user.pw_name)


def test_the_agent_can_neither_signal_nor_read_the_server(
    turn_servers: TurnServers, reachable: Reachable, spawn_user: pwd.struct_passwd
) -> None:
    """kill -STOP / -9 $PPID and /proc/$PPID are refused; the server serves on."""
    server = _start(turn_servers, reachable)
    report = _attack(server, "signal_server", "read_server")
    assert report["signal_server"] == {
        "probe": "denied: PermissionError",
        "stop": "denied: PermissionError",
        "kill": "denied: PermissionError",
    }
    assert report["read_server"] == {
        "environ": "denied: PermissionError",
        "mem": "denied: PermissionError",
        "fd": "denied: PermissionError",
    }
    assert server.get("/health").json()["status"] == "ok"


def test_the_state_dir_is_closed_to_the_agent(
    turn_servers: TurnServers,
    reachable: Reachable,
    spawn_user: pwd.struct_passwd,
    secret_registry: SecretRegistry,
) -> None:
    """It can neither list, read nor write the rotated token, the results or the pending
    callbacks; the token the controller rotated in still serves after a restart."""
    server = _start(turn_servers, reachable)
    rotated = secret_registry.new("isolation_rotated")
    assert server.reload({"token": rotated}).status_code == 200
    report = _attack(server, "state_dir", prompt={"state_dir": str(server.state_dir)})
    assert set(report["state_dir"].values()) == {"denied: PermissionError"}, report
    assert (server.state_dir / "oauth-token").read_text() == rotated


@pytest.mark.parametrize("broker", ["0", "1"], ids=["descriptors", "the broker"])
def test_no_turn_finds_another_turns_credential_anywhere(
    turn_servers: TurnServers,
    reachable: Reachable,
    spawn_user: pwd.struct_passwd,
    secret_registry: SecretRegistry,
    broker: str,
) -> None:
    """While turn A runs on its override, turn B scans every environment and descriptor it
    can: no credential of A's, of the baseline or of the controller; nor in its own.
    Through the broker A's override is a gateway's, whose token the CLI would hold in its
    environment: there it is a placeholder."""
    baseline = secret_registry.new(f"isolation_baseline_{broker}")
    server = _start(
        turn_servers, reachable, CLAUDE_CODE_OAUTH_TOKEN=baseline, AGENT_SERVER_BROKER=broker
    )
    override = secret_registry.new(f"isolation_override_{broker}")
    given: dict[str, Any] = {"oauth_token": override}
    if broker == "1":
        given = {"provider": {"base_url": "http://127.0.0.1:9", "auth_token": override}}
    assert server.token is not None
    secrets = {fingerprint(v) for v in (baseline, override, server.token)}
    with ThreadPoolExecutor(1) as pool:
        holding = pool.submit(
            _attack,
            server,
            "hold",
            prompt={"hold_s": 4},
            auth_override=given,
            execution_id="holder",
        )
        wait_listed(server, "holder", timeout=30)
        time.sleep(1)  # the holder's CLI is past its start, as a real one would be
        scan = _attack(server, "scan_environ", "own_environ")
        holding.result(timeout=60)
    assert scan["scan_environ"]["readable"] >= 1  # it did see the holder's environment
    assert not secrets & set(scan["scan_environ"]["fingerprints"])
    assert not secrets & set(scan["scan_environ"]["descriptors"])
    assert not secrets & set(scan["own_environ"]["fingerprints"])
    if broker == "1":  # it found the holder's gateway token: a placeholder
        assert scan["scan_environ"]["fingerprints"]
    names = scan["own_environ"]["names"]
    assert "CLAUDE_CODE_OAUTH_TOKEN" not in names
    assert "CLAUDE_CODE_OAUTH_TOKEN_FILE_DESCRIPTOR" in names


@pytest.mark.realcli
def test_the_real_cli_as_the_spawn_user_reads_its_descriptor_and_its_tools_find_nothing(
    turn_servers: TurnServers,
    reachable: Reachable,
    spawn_user: pwd.struct_passwd,
    secret_registry: SecretRegistry,
) -> None:
    """The pinned Claude Code as the spawn user reads the token from a pipe the server
    made (another uid's), so the turn is served by it; its Bash tool finds the token in
    no environment of the turn, the CLI's included."""
    cli = reachable.program(require_real_cli())
    baseline = secret_registry.new("isolation_real_baseline")
    with MessagesApiStandIn() as api:
        api.on(baseline, Scenario.BASH_TOOL)
        server = _start(
            turn_servers,
            reachable,
            AGENT_SERVER_RUNTIME_COMMAND=str(cli),
            ANTHROPIC_BASE_URL=api.base_url,
            CLAUDE_CODE_OAUTH_TOKEN=baseline,
            **QUIET_CLI,
        )
        with server.client(timeout=120) as client:
            answer = client.post("/api/task", json={"message": "run it"})
        outputs = api.tool_outputs
    assert answer.status_code == 200, answer.text
    assert answer.json()["response"].strip() == (
        f"served-by kind=bearer fp={fingerprint(baseline)}"
    )
    (output,) = outputs  # never printed: it would hold what leaked
    as_the_agent = f"USER={spawn_user.pw_name}\n" in output
    assert as_the_agent, "the tool did not run as the spawn user"
    read_the_turns = output.count("== /proc/") >= 2  # the CLI and the tool's own shell
    assert read_the_turns, "the tool read no environment of the turn's processes"
    leaked = baseline in output
    assert not leaked, "the token is in an environment of the turn"
    named = "CLAUDE_CODE_OAUTH_TOKEN_FILE_DESCRIPTOR=" in output
    assert named, "the CLI's environment does not name the descriptor"


def test_a_process_that_escapes_dies_with_its_turn_across_the_uid_boundary(
    turn_servers: TurnServers, reachable: Reachable, spawn_user: pwd.struct_passwd
) -> None:
    """A double-forked, setsid sleeper of the spawn user is found and killed at the end."""
    server = _start(turn_servers, reachable)
    sleeper = _attack(server, "escape", prompt={"escape_s": 120})["escape"]
    assert sleeper > 0
    deadline = time.monotonic() + 10
    while Path(f"/proc/{sleeper}").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not Path(f"/proc/{sleeper}").exists()


def test_a_dotenv_pointing_at_the_servers_files_is_read_as_the_agent(
    turn_servers: TurnServers,
    reachable: Reachable,
    spawn_user: pwd.struct_passwd,
    secret_registry: SecretRegistry,
) -> None:
    """`.env` is the agent's: a symlink to the server's token is opened as the agent, so
    refused; the status says why, and nothing of the file reaches a spawn."""
    server = _start(turn_servers, reachable)
    rotated = secret_registry.new("isolation_dotenv_target")
    assert server.reload({"token": rotated}).status_code == 200
    env_file = server.env_file
    env_file.symlink_to(server.state_dir / "oauth-token")
    os.lchown(env_file, spawn_user.pw_uid, spawn_user.pw_gid)
    report = _attack(server, "own_environ")
    assert fingerprint(rotated) not in report["own_environ"]["fingerprints"]
    problem = server.status()["files"]["env_file_problem"]
    assert problem is not None and "Permission denied" in problem


def test_the_controller_tells_the_servers_callback_from_the_agents(
    turn_servers: TurnServers, reachable: Reachable, spawn_user: pwd.struct_passwd
) -> None:
    """The agent POSTs an envelope with the callback key it holds: it carries no valid
    signature, the server's own does."""
    key = "isolation-callback-key-0123456789"
    with CallbackReceiver(key, controller_token=None) as receiver:
        server = _start(
            turn_servers,
            reachable,
            **receiver.environ(),
        )
        assert server.token is not None
        receiver.controller_token = server.token
        with server.client() as client:
            accepted = client.post(
                "/api/task",
                json={
                    "message": json.dumps(
                        {"attacks": ["post_callback"], "execution_id": "async-1"}
                    ),
                    "execution_id": "async-1",
                    "async_result": True,
                },
            )
        assert accepted.status_code == 202, accepted.text
        receiver.wait_for(2)
    by_sender = {d.body.get("response") == "forged by the agent": d for d in receiver.deliveries}
    assert by_sender[True].signed is False or by_sender[True].signed is None
    assert by_sender[False].signed is True
