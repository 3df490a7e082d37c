"""The privilege split inside the image (contract §10): the agent cannot reach the server.

The module shares one container, started as the README's `docker run` starts it (as
root, `--init`), whose runtime is the intruder stand-in (tests/support/intruder_cli.py,
mounted read-only with the repository's tests/): a turn tries what a hostile agent's
tools would and reports what it got. While one turn holds a per-spawn override, another
signals and reads the server, tries its state dir, scans every environment it can read
and leaves a process behind; the tests read that one report, and what docker sees.
Last, as the previous image's `docker run --user 1000` would: same-uid mode only when
asked for.
"""

from __future__ import annotations

import json
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from tests.conftest import SecretRegistry
from tests.image.conftest import (
    INTRUDER,
    REPO,
    STATE_DIR,
    TESTS_MOUNT,
    TOKEN_HEADER,
    Container,
    Containers,
)
from tests.support.agent_user import SERVER_CAPABILITIES
from tests.support.intruder_cli import fingerprint
from tests.support.server import free_port

ATTACKS = ("whoami", "signal_server", "read_server", "state_dir", "scan_environ",
           "own_environ", "escape")  # fmt: skip
NOTHING = "0000000000000000"
DENIED = "denied: PermissionError"
# The credentials this module hands the container, by label.
GIVEN: dict[str, str] = {}


def attack(agent: Container, *attacks: str, **body: Any) -> dict[str, Any]:
    """One turn of the intruder: what each attack got."""
    prompt = {"attacks": list(attacks), **body.pop("prompt", {})}
    answer = agent.request(
        "POST", "/api/task", json={"message": json.dumps(prompt), **body}, timeout=120
    )
    assert answer.status_code == 200, answer.text
    report: dict[str, Any] = json.loads(answer.json()["response"])
    return report


@pytest.fixture(scope="module")
def agent(module_containers: Containers) -> Container:
    """The module's container: the image's defaults, the intruder as its CLI."""
    env = module_containers.environ(AGENT_SERVER_RUNTIME_COMMAND=INTRUDER)
    GIVEN.update(
        controller=env["TRINITY_AGENT_AUTH_TOKEN"], baseline=env["CLAUDE_CODE_OAUTH_TOKEN"]
    )
    mount = f"{REPO / 'tests'}:{TESTS_MOUNT}:ro"
    return module_containers.create(env, run_args=["--init", "-v", mount]).start()


@pytest.fixture(scope="module")
def before(agent: Container, secret_registry: SecretRegistry) -> dict[str, str]:
    """The server's status before the attacks, with a rotated token in its state dir."""
    GIVEN["rotated"] = secret_registry.new("split_rotated")
    reloaded = agent.request(
        "POST", "/api/credentials/reload-token", json={"token": GIVEN["rotated"]}
    )
    assert reloaded.status_code == 200, reloaded.text
    return agent.server_status()


@pytest.fixture(scope="module")
def report(
    agent: Container, before: dict[str, str], secret_registry: SecretRegistry
) -> dict[str, Any]:
    """Every attack, in a turn that runs while another holds a per-spawn override."""
    GIVEN["override"] = secret_registry.new("split_override")
    with ThreadPoolExecutor(1) as pool:
        holding = pool.submit(
            attack,
            agent,
            "hold",
            prompt={"hold_s": 4},
            auth_override={"oauth_token": GIVEN["override"]},
            execution_id="split-holder",
        )
        agent.wait_running("split-holder")
        time.sleep(1)  # the holder is past its start, its descriptor read
        found = attack(agent, *ATTACKS, prompt={"state_dir": STATE_DIR, "escape_s": 120})
        holding.result(timeout=60)
    return found


def test_a_turn_runs_as_developer_with_nothing_to_gain(
    agent: Container, report: dict[str, Any]
) -> None:
    """uid and gid 1000, no other group, every capability set empty, no_new_privs; /health
    says so."""
    me = report["whoami"]
    assert (me["Uid"], me["Gid"], me["Groups"]) == (["1000"] * 4, ["1000"] * 4, [])
    for capability_set in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
        assert me[capability_set] == [NOTHING], capability_set
    assert me["NoNewPrivs"] == "1"
    health = agent.request("GET", "/health", token="").json()
    assert (health["isolation"], health["spawn_user"]) == ("spawn_user", "developer"), health


def test_the_server_is_agent_server_with_four_capabilities(before: dict[str, str]) -> None:
    """uid and gid 999, no other group, CAP_KILL/SETGID/SETUID/SETPCAP in every set and
    nothing else, no_new_privs."""
    assert (before["Uid"].split(), before["Gid"].split()) == (["999"] * 4, ["999"] * 4)
    assert before["Groups"].split() == []
    for capability_set in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
        assert before[capability_set] == SERVER_CAPABILITIES, capability_set
    assert before["NoNewPrivs"] == "1"


def test_the_agent_can_neither_signal_nor_read_the_server(
    agent: Container, before: dict[str, str], report: dict[str, Any]
) -> None:
    """kill -0, -STOP and -9 of its parent (the server) and /proc/<server>/environ, mem
    and fd are refused; the same server process serves on, not stopped."""
    assert report["signal_server"] == {"probe": DENIED, "stop": DENIED, "kill": DENIED}
    assert report["read_server"] == {"environ": DENIED, "mem": DENIED, "fd": DENIED}
    after = agent.server_status()
    assert after["Pid"] == before["Pid"]
    assert not after["State"].startswith("T"), after["State"]
    assert agent.request("GET", "/health", token="").json()["status"] == "ok"


def test_the_state_dir_is_closed_to_the_agent(agent: Container, report: dict[str, Any]) -> None:
    """It can neither list, read nor write the rotated token, the results or the pending
    callbacks: nothing it tried is there, and the rotated token is intact."""
    assert set(report["state_dir"].values()) == {DENIED}, report["state_dir"]
    assert agent.exec("stat", "-c", "%a %U", STATE_DIR).split() == ["700", "agent-server"]
    assert agent.exec("cat", f"{STATE_DIR}/oauth-token") == GIVEN["rotated"]
    planted = agent.exec("find", STATE_DIR, "-name", "forged.json", "-o", "-name", "*.fifo")
    assert planted == ""


def test_no_credential_is_in_any_environment_the_agent_can_read(report: dict[str, Any]) -> None:
    """While another turn runs on its override, no value of the baseline, the override,
    the rotated token or the controller token is in an environment or a descriptor it can
    read, nor in its own environment."""
    secrets = {
        fingerprint(GIVEN[label]) for label in ("baseline", "override", "rotated", "controller")
    }
    scan = report["scan_environ"]
    assert scan["readable"] >= 1  # it did read the holder's environment
    assert not secrets & set(scan["fingerprints"])
    assert not secrets & set(scan["descriptors"])
    assert not secrets & set(report["own_environ"]["fingerprints"])
    assert "CLAUDE_CODE_OAUTH_TOKEN_FILE_DESCRIPTOR" in report["own_environ"]["names"]


def test_a_process_that_escapes_dies_with_its_turn(
    agent: Container, report: dict[str, Any]
) -> None:
    """A double-forked, setsid sleeper of developer's is found and killed across the uid
    boundary, by the capabilities the server kept."""
    assert report["escape"] > 0
    sleeper = str(report["escape"])
    deadline = time.monotonic() + 10
    while sleeper in {p["Pid"] for p in agent.processes()} and time.monotonic() < deadline:
        time.sleep(0.2)
    assert sleeper not in {p["Pid"] for p in agent.processes()}


# --- as the agent's user: the previous image's `docker run --user 1000` -----------------
# Run by `docker exec` in the module's container (a container of its own costs seconds
# of copying on some storage drivers): the same image, environment and entry point.
# Last in the module: a second server would be a second `agent-server` process.


def serves(base_url: str) -> bool:
    """True when /health answers 200 at `base_url`."""
    try:
        return httpx.get(f"{base_url}/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def startup_as_developer(agent: Container, *options: str) -> subprocess.CompletedProcess[str]:
    """`docker exec --user 1000 OPTIONS <container> startup.sh`, not checked."""
    return agent.docker.run(
        "exec", "--user", "1000", *options, agent.name, "/usr/local/bin/startup.sh", check=False
    )


def test_as_the_agents_user_it_refuses_to_start_until_same_uid_is_asked_for(
    agent: Container,
) -> None:
    """One line that says how to ask for same-uid mode, and exit 2."""
    refused = startup_as_developer(agent)
    assert refused.returncode == 2, refused
    (line,) = refused.stderr.splitlines()
    assert "AGENT_SERVER_SPAWN_USER=developer is the server's own user" in line, line
    assert "AGENT_SERVER_SPAWN_USER=," in line, line


def test_same_uid_mode_serves_as_the_agents_user_with_a_state_dir_it_owns(
    agent: Container, secret_registry: SecretRegistry
) -> None:
    """Asked for (`AGENT_SERVER_SPAWN_USER=`) with a state dir under developer's home, the
    server serves as developer, /health says `same_uid`, and a rotated token persists."""
    port = free_port()
    started = startup_as_developer(
        agent, "-d",
        "-e", "AGENT_SERVER_SPAWN_USER=",
        "-e", "AGENT_SERVER_STATE_DIR=/home/developer/.local/state/agent-server",
        "-e", f"AGENT_SERVER_PORT={port}",
    )  # fmt: skip
    assert started.returncode == 0, started
    base_url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while not serves(base_url) and time.monotonic() < deadline:
        time.sleep(0.1)
    health = httpx.get(f"{base_url}/health", timeout=10).json()
    assert (health["isolation"], health["spawn_user"]) == ("same_uid", None), health
    reloaded = httpx.post(
        f"{base_url}/api/credentials/reload-token",
        json={"token": secret_registry.new("split_same_uid")},
        headers={TOKEN_HEADER: agent.token or ""},
        timeout=10,
    )
    assert reloaded.status_code == 200, reloaded.text
    owner = agent.exec("stat", "-c", "%U", "/home/developer/.local/state/agent-server/oauth-token")
    assert owner.strip() == "developer"
