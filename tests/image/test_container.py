"""One agent container, run as the README's `docker run` runs it, checked from outside.

The module shares one container (`--init`, a named state volume, the controller token
and a baseline OAuth token, the real Claude Code of the image pointed at the loopback
Messages API stand-in). The tests run in file order: the restart comes after the
checks that need the first boot, and the leak check comes last, over everything the
module's turns, reloads and restart may have written.
"""

from __future__ import annotations

import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agent_server.credentials.state import fingerprint as server_fingerprint
from tests.conftest import SecretRegistry
from tests.image.conftest import (
    STATE_DIR,
    Container,
    Containers,
    Docker,
    find_needles,
)
from tests.support.agent_user import SERVER_CAPABILITIES
from tests.support.messages_api import MessagesApiStandIn, cli_env, fingerprint

OVERRIDE_FILE = f"{STATE_DIR}/oauth-token"
# Values this module hands the container, for the file-system check at its end.
GIVEN: dict[str, str] = {}


@pytest.fixture(scope="module")
def api() -> Iterator[MessagesApiStandIn]:
    """The Messages API stand-in on the host's loopback, which the container shares."""
    with MessagesApiStandIn() as stand_in:
        yield stand_in


@pytest.fixture(scope="module")
def agent(module_containers: Containers, api: MessagesApiStandIn) -> Container:
    """The module's container: healthy probes every second (the image's check command)."""
    quiet_cli = {
        name: value
        for name, value in cli_env(api.base_url, Path("/")).items()
        if name not in {"PATH", "HOME", "IS_SANDBOX"}
    }
    env = module_containers.environ(**quiet_cli)
    GIVEN.update(
        controller=env["TRINITY_AGENT_AUTH_TOKEN"], baseline=env["CLAUDE_CODE_OAUTH_TOKEN"]
    )
    container = module_containers.create(env, run_args=["--init", "--health-interval", "1s"])
    return container.start()


def test_the_server_runs_as_agent_server_and_nothing_of_the_image_as_root(
    agent: Container, image: dict[str, Any]
) -> None:
    """The image starts as root, but only startup.sh does: every process the container's
    init started runs as agent-server (uid 999) holding CAP_KILL, CAP_SETGID, CAP_SETUID
    and CAP_SETPCAP; the spawn user, developer, is uid 1000."""
    assert image["Config"]["User"] in ("", "root", "0")
    assert agent.exec("id", "-u", "developer").strip() == "1000"
    assert agent.exec("id", "-u", "agent-server").strip() == "999"
    listed = agent.processes()
    # Outside the tree: what `docker exec` runs (PPid 0, as the healthcheck's probes) and
    # `--init`'s docker-init, which only reaps and forwards signals.
    ours = [
        (p["Name"], p["Uid"].split()[0], p["CapEff"])
        for p in listed
        if (p["PPid"] != "0" or p["Pid"] == "1") and p["Name"] != "docker-init"
    ]
    assert any(name == "agent-server" for name, _, _ in ours), listed
    assert {(uid, caps) for _, uid, caps in ours} == {("999", SERVER_CAPABILITIES)}, ours


def test_the_healthcheck_turns_healthy(agent: Container, image: dict[str, Any]) -> None:
    """The image's HEALTHCHECK command (run every second here) reports healthy."""
    check = image["Config"].get("Healthcheck") or {}
    assert check.get("Test", [None])[0] == "CMD", check
    assert any("/health" in word for word in check["Test"]), check
    deadline = time.monotonic() + 30
    health: dict[str, Any] = {}
    while time.monotonic() < deadline:
        health = agent.state().get("Health") or {}
        if health.get("Status") == "healthy":
            break
        time.sleep(0.25)
    assert health.get("Status") == "healthy", health
    assert health["Log"][-1]["ExitCode"] == 0, health["Log"][-1]


def test_health_answers_200_with_the_runtime_available(agent: Container) -> None:
    """/health needs no token and finds the image's Claude Code."""
    response = agent.request("GET", "/health", token="")
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["runtime_available"] is True, body
    assert body["status"] == "ok", body
    assert body["auth"] == "token", body


def test_the_api_refuses_a_request_without_the_controller_token(agent: Container) -> None:
    """401 without the token and with a wrong one; 200 with the container's token."""
    assert agent.request("GET", "/api/credentials/status", token="").status_code == 401
    assert agent.request("GET", "/api/credentials/status", token="not-it").status_code == 401
    refused = agent.request(
        "POST", "/api/credentials/reload-token", token="", json={"token": "unused-value"}
    )
    assert refused.status_code == 401
    assert agent.request("GET", "/api/credentials/status").status_code == 200


@pytest.mark.timeout(180)
def test_a_real_turn_runs_the_images_claude_code_with_the_reloaded_token(
    agent: Container, api: MessagesApiStandIn, secret_registry: SecretRegistry
) -> None:
    """The image's own Claude Code serves a turn, authenticated with the reloaded token."""
    token = GIVEN["turn"] = secret_registry.new("image_turn")
    reloaded = agent.request("POST", "/api/credentials/reload-token", json={"token": token})
    assert reloaded.status_code == 200, reloaded.text
    answer = agent.request(
        "POST",
        "/api/task",
        json={"message": "say hello", "execution_id": f"image-turn-{uuid.uuid4().hex[:8]}"},
        timeout=150,
    )
    assert answer.status_code == 200, answer.text
    assert answer.json()["response"].strip() == f"served-by kind=bearer fp={fingerprint(token)}"
    assert api.message_requests, "the CLI never reached the stand-in"


@pytest.mark.timeout(180)
def test_reload_token_persists_in_the_state_volume_and_survives_a_restart(
    agent: Container, docker: Docker, secret_registry: SecretRegistry
) -> None:
    """The rotated token is written 0600, agent-server's, to the volume and is in effect after
    a restart."""
    rotated = GIVEN["rotated"] = secret_registry.new("image_rotated")
    mounts = docker.inspect(agent.name)[0]["Mounts"]
    assert {(m["Type"], m.get("Name"), m["Destination"]) for m in mounts} == {
        ("volume", agent.volume, STATE_DIR)
    }
    before = agent.request("GET", "/api/credentials/status").json()
    assert before["fingerprint"] != server_fingerprint(rotated)

    reloaded = agent.request("POST", "/api/credentials/reload-token", json={"token": rotated})
    assert reloaded.status_code == 200, reloaded.text
    assert reloaded.json()["fingerprint"] == server_fingerprint(rotated)
    assert agent.exec("stat", "-c", "%a %u %g", OVERRIDE_FILE).split() == ["600", "999", "999"]
    assert agent.exec("cat", OVERRIDE_FILE) == rotated

    docker.run("restart", "-t", "20", agent.name, timeout=90)
    agent.wait_serving()
    status = agent.request("GET", "/api/credentials/status")
    assert status.status_code == 200, status.text
    assert status.json()["fingerprint"] == server_fingerprint(rotated), status.json()
    assert status.json()["effective_auth"]["fingerprint"] == server_fingerprint(rotated)
    assert agent.exec("cat", OVERRIDE_FILE) == rotated


@pytest.mark.timeout(300)
def test_no_secret_or_ca_bundle_in_the_logs_or_the_file_system(
    agent: Container, docker: Docker, ca_needles: dict[str, bytes]
) -> None:
    """`docker logs` and `docker export` (image layers and the container's own writes)."""
    secrets = {f"test secret {label}": value.encode() for label, value in GIVEN.items()}
    assert {"test secret controller", "test secret rotated"} <= secrets.keys()
    needles = {**secrets, **ca_needles}

    logs = agent.logs()
    assert logs.strip(), "the container logged nothing"
    assert [label for label, needle in needles.items() if needle.decode() in logs] == []

    export = subprocess.Popen(
        [docker.binary, "export", agent.name], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert export.stdout is not None
    try:
        hits = find_needles(export.stdout, needles)
    finally:
        export.stdout.close()
        _, stderr = export.communicate(timeout=120)
    assert export.returncode == 0, stderr
    assert hits == {}, f"in the container's file system: {hits}"
