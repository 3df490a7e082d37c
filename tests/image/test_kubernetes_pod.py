"""The pod of docker/kubernetes/agent.yaml, as far as docker can play it.

With `fsGroup`, the kubelet hands the pod a volume whose root belongs to that group,
group-writable and setgid (2770), and runs the container as runAsUser:runAsGroup with
fsGroup as a supplementary group. Docker plays the same: such a volume (a lost+found
in it, like a fresh ext4 file system, and no copy of the image's directory), the
manifest's user, groups, capabilities, no_new_privs (allowPrivilegeEscalation: false),
mount path and literal env, and test values for the Secret's keys. startup.sh must
still become agent-server, whose group is fsGroup, and a turn still run as developer
(the intruder stand-in, mounted with the repository's tests/), which cannot enter the
volume; the server refuses a group-writable state dir, so the rotated token must land
in the manifest's state dir and be in effect after a restart.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml

from agent_server.credentials.state import fingerprint
from tests.conftest import SecretRegistry
from tests.image.conftest import IMAGE, INTRUDER, REPO, RUN_LABEL, TESTS_MOUNT, Containers, Docker
from tests.support.agent_user import SERVER_CAPABILITIES

MANIFEST = REPO / "docker" / "kubernetes" / "agent.yaml"


def pod_template() -> dict[str, Any]:
    """The StatefulSet's pod spec."""
    with MANIFEST.open(encoding="utf-8") as handle:
        objects = [doc for doc in yaml.safe_load_all(handle) if doc]
    (statefulset,) = [o for o in objects if o["kind"] == "StatefulSet"]
    spec: dict[str, Any] = statefulset["spec"]["template"]["spec"]
    return spec


@pytest.mark.timeout(240)
def test_the_manifests_pod_runs_turns_as_developer_and_keeps_the_rotated_token(
    containers: Containers, docker: Docker, secret_registry: SecretRegistry
) -> None:
    """The server is agent-server with four capabilities, a turn developer with none and
    outside the volume; reload-token persists 0600 in the manifest's state dir, and a
    restart keeps it in effect."""
    pod = pod_template()
    context = pod["securityContext"]
    (spec,) = pod["containers"]
    (mount,) = spec["volumeMounts"]
    secret_values = {
        "TRINITY_AGENT_AUTH_TOKEN": secret_registry.new("pod_controller"),
        "CLAUDE_CODE_OAUTH_TOKEN": secret_registry.new("pod_baseline"),
    }
    env = {}
    for entry in spec["env"]:
        if "value" in entry:
            env[entry["name"]] = entry["value"]
        elif "secretKeyRef" in entry["valueFrom"]:
            env[entry["name"]] = secret_values[entry["name"]]
        else:
            env[entry["name"]] = "agent-1-0"  # metadata.name of the StatefulSet's first pod
    env["AGENT_SERVER_RUNTIME_COMMAND"] = INTRUDER
    state_dir = env["AGENT_SERVER_STATE_DIR"]
    user, group, fs_group = context["runAsUser"], context["runAsGroup"], context["fsGroup"]
    capabilities = spec["securityContext"]["capabilities"]
    run_args = ["--user", f"{user}:{group}", "--group-add", str(fs_group)]
    run_args += [arg for cap in capabilities["drop"] for arg in ("--cap-drop", cap)]
    run_args += [arg for cap in capabilities["add"] for arg in ("--cap-add", cap)]
    if spec["securityContext"]["allowPrivilegeEscalation"] is False:
        run_args += ["--security-opt", "no-new-privileges"]
    run_args += ["-v", f"{REPO / 'tests'}:{TESTS_MOUNT}:ro"]
    # No copy of the image's directory into the volume: the kubelet makes none.
    target = f"{mount['mountPath']},volume-nocopy"
    agent = containers.create(env, run_args=run_args, mount=target)

    # What the kubelet makes of a fresh volume for fsGroup.
    docker.run(
        "run", "--rm", "--label", RUN_LABEL, "--user", "0", "--network", "none",
        "--entrypoint", "sh", "--mount", f"type=volume,src={agent.volume},dst=/volume",
        IMAGE, "-c",
        f"mkdir /volume/lost+found && chown 0:{fs_group} /volume && chmod 2770 /volume",
    )  # fmt: skip
    agent.start()

    root = agent.exec("stat", "-c", "%a %g", mount["mountPath"]).split()
    assert root == ["2770", str(fs_group)], root
    server = agent.server_status()
    assert (server["Uid"].split()[0], server["Gid"].split()[0]) == ("999", str(fs_group))
    assert (server["CapEff"], server["CapBnd"]) == (SERVER_CAPABILITIES, SERVER_CAPABILITIES)
    assert server["NoNewPrivs"] == "1"
    prompt = {"attacks": ["whoami", "state_dir"], "state_dir": mount["mountPath"]}
    turn = agent.request("POST", "/api/task", json={"message": json.dumps(prompt)}, timeout=60)
    assert turn.status_code == 200, turn.text
    report = json.loads(turn.json()["response"])
    assert report["whoami"]["Uid"] == ["1000"] * 4, report
    assert report["whoami"]["CapBnd"] == ["0000000000000000"], report
    assert report["state_dir"]["list"] == "denied: PermissionError", report

    rotated = secret_registry.new("pod_rotated")
    reloaded = agent.request("POST", "/api/credentials/reload-token", json={"token": rotated})
    assert reloaded.status_code == 200, reloaded.text
    token_file = f"{state_dir}/oauth-token"
    # Root of this pod holds no CAP_DAC_OVERRIDE: only agent-server enters its state dir.
    stat = agent.exec("stat", "-c", "%a %u", token_file, user="agent-server").split()
    assert stat == ["600", "999"], stat
    mode = int(agent.exec("stat", "-c", "%a", state_dir, user="agent-server").strip(), 8)
    assert mode & 0o077 == 0, oct(mode)

    docker.run("restart", "-t", "20", agent.name, timeout=90)
    agent.wait_serving()
    status = agent.request("GET", "/api/credentials/status").json()
    expected = fingerprint(rotated)
    assert status["fingerprint"] == expected, status
    assert status["files"]["override_file"]["exists"] is True, status
