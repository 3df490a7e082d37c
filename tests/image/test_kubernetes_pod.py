"""The pod of docker/kubernetes/agent.yaml, as far as docker can play it.

With `fsGroup`, the kubelet hands the pod a volume whose root belongs to that group,
group-writable and setgid (2770), and runs the container as runAsUser:runAsGroup with
fsGroup as a supplementary group. Docker plays the same: such a volume (a lost+found
in it, like a fresh ext4 file system, and no copy of the image's directory), the
manifest's user, groups, capabilities, mount path and literal env, and test values for
the Secret's keys. The server refuses a group-writable state dir, so the rotated token
must land in the manifest's state dir and be in effect after a restart.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from agent_server.credentials.state import fingerprint
from tests.conftest import SecretRegistry
from tests.image.conftest import IMAGE, RUN_LABEL, Containers, Docker

MANIFEST = Path(__file__).resolve().parents[2] / "docker" / "kubernetes" / "agent.yaml"


def pod_template() -> dict[str, Any]:
    """The StatefulSet's pod spec."""
    with MANIFEST.open(encoding="utf-8") as handle:
        objects = [doc for doc in yaml.safe_load_all(handle) if doc]
    (statefulset,) = [o for o in objects if o["kind"] == "StatefulSet"]
    spec: dict[str, Any] = statefulset["spec"]["template"]["spec"]
    return spec


@pytest.mark.timeout(240)
def test_the_manifests_pod_persists_the_rotated_token_across_a_restart(
    containers: Containers, docker: Docker, secret_registry: SecretRegistry
) -> None:
    """reload-token persists 0600 in the manifest's state dir; a restart keeps it in effect."""
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
    state_dir = env["AGENT_SERVER_STATE_DIR"]
    user, group, fs_group = context["runAsUser"], context["runAsGroup"], context["fsGroup"]
    drop = spec["securityContext"]["capabilities"]["drop"]
    run_args = ["--user", f"{user}:{group}", "--group-add", str(fs_group)]
    run_args += [arg for cap in drop for arg in ("--cap-drop", cap)]
    if spec["securityContext"]["allowPrivilegeEscalation"] is False:
        run_args += ["--security-opt", "no-new-privileges"]
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
    assert agent.request("GET", "/health", token="").json()["runtime_available"] is True

    rotated = secret_registry.new("pod_rotated")
    reloaded = agent.request("POST", "/api/credentials/reload-token", json={"token": rotated})
    assert reloaded.status_code == 200, reloaded.text
    token_file = f"{state_dir}/oauth-token"
    assert agent.exec("stat", "-c", "%a %u", token_file).split() == ["600", str(user)]
    mode = int(agent.exec("stat", "-c", "%a", state_dir).strip(), 8)
    assert mode & 0o022 == 0, oct(mode)

    docker.run("restart", "-t", "20", agent.name, timeout=90)
    agent.wait_serving()
    status = agent.request("GET", "/api/credentials/status").json()
    expected = fingerprint(rotated)
    assert status["fingerprint"] == expected, status
    assert status["files"]["override_file"]["exists"] is True, status
