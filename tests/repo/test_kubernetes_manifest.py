"""docker/kubernetes/agent.yaml: schema-valid offline, and the agent's invariants.

`kubernetes-validate` checks every object against the Kubernetes OpenAPI schemas it
ships (strict: an unknown field fails), for the oldest and the newest version it
knows. Where kubectl exists, `kubectl create --dry-run=client` reads the file too: it
needs an API server for discovery even then, so a loopback stand-in serves only that.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from kubernetes_validate.utils import all_versions

from agent_server.process.spawn_user import REQUIRED_CAPABILITIES
from agent_server.process.timings import STOP_TIMEOUT_MARGIN_S

ROOT = Path(__file__).resolve().parents[2]
MANIFEST = ROOT / "docker" / "kubernetes" / "agent.yaml"
STATE_DIR = "/var/lib/trinity"
PORT = 8000
# contract §1: the server's default AGENT_SERVER_SHUTDOWN_GRACE_S.
DEFAULT_SHUTDOWN_GRACE_S = 30.0
# README "Benchmarks": agent-server's idle RSS; the CLI's measured in the image.
SERVER_IDLE_MIB = 43
CLI_TURN_MIB = 200


def load() -> list[dict[str, Any]]:
    """The manifest's objects (empty documents dropped)."""
    with MANIFEST.open(encoding="utf-8") as handle:
        return [doc for doc in yaml.safe_load_all(handle) if doc]


@pytest.fixture(scope="module")
def objects() -> list[dict[str, Any]]:
    """Every object of the manifest."""
    return load()


@pytest.fixture(scope="module")
def statefulset(objects: list[dict[str, Any]]) -> dict[str, Any]:
    """The agent's StatefulSet."""
    found = [o for o in objects if o["kind"] == "StatefulSet"]
    assert len(found) == 1, [o["kind"] for o in objects]
    return found[0]


@pytest.fixture(scope="module")
def container(statefulset: dict[str, Any]) -> dict[str, Any]:
    """The agent-server container."""
    containers = statefulset["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    found: dict[str, Any] = containers[0]
    return found


def env_of(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The container's env entries by name."""
    return {entry["name"]: entry for entry in container.get("env", [])}


def mebibytes(quantity: str) -> float:
    """A Kubernetes memory quantity in MiB."""
    units = {"Ki": 1 / 1024, "Mi": 1, "Gi": 1024, "Ti": 1024 * 1024}
    for suffix, factor in units.items():
        if quantity.endswith(suffix):
            return float(quantity[: -len(suffix)]) * factor
    return float(quantity) / (1 << 20)


# --- schemas ----------------------------------------------------------------------------

VERSIONS = sorted(set(all_versions()), key=lambda v: tuple(int(p) for p in v.split(".")))


@pytest.mark.parametrize("version", [VERSIONS[0], VERSIONS[-1]])
def test_every_object_is_valid_for_kubernetes(objects: list[dict[str, Any]], version: str) -> None:
    """Strict schema validation: a misspelt or misplaced field fails."""
    assert {o["kind"] for o in objects} == {"Secret", "Service", "StatefulSet"}
    for obj in objects:
        kubernetes_validate.validate(obj, version, strict=True)


def test_the_validator_catches_an_unknown_field(statefulset: dict[str, Any]) -> None:
    """The strict check above would fail on a typo (it is not a no-op)."""
    broken = json.loads(json.dumps(statefulset))
    broken["spec"]["template"]["spec"]["terminationGracePeriod"] = 45
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, VERSIONS[-1], strict=True)


# --- the agent's invariants ----------------------------------------------------------------


def test_the_state_volume_is_a_claim_template_mounted_at_the_state_dir(
    statefulset: dict[str, Any], container: dict[str, Any]
) -> None:
    """The rotated token survives the pod: a PVC per agent, holding the state dir."""
    spec = statefulset["spec"]
    assert spec["replicas"] == 1
    templates = {t["metadata"]["name"]: t for t in spec["volumeClaimTemplates"]}
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert mounts.get("state") == STATE_DIR, mounts
    assert "state" in templates, templates
    assert templates["state"]["spec"]["accessModes"] == ["ReadWriteOnce"]
    # The kubelet makes a volume's root group-writable for fsGroup, which the server
    # refuses for its state dir: the state dir is a directory inside the volume.
    state_dir = env_of(container)["AGENT_SERVER_STATE_DIR"]["value"]
    assert Path(state_dir).parent == Path(STATE_DIR), state_dir


def test_the_controller_token_comes_from_a_secret(
    objects: list[dict[str, Any]], container: dict[str, Any]
) -> None:
    """TRINITY_AGENT_AUTH_TOKEN from a Secret's key, never a literal value."""
    env = env_of(container)
    entry = env["TRINITY_AGENT_AUTH_TOKEN"]
    assert "value" not in entry, entry
    ref = entry["valueFrom"]["secretKeyRef"]
    assert not ref.get("optional", False)
    secrets = {o["metadata"]["name"]: o for o in objects if o["kind"] == "Secret"}
    assert ref["key"] in secrets[ref["name"]]["stringData"]
    for name, item in env.items():
        if any(word in name for word in ("TOKEN", "KEY", "SECRET", "PASSWORD")):
            assert "value" not in item, f"{name} has a literal value"


# agent-server's group (docker/Dockerfile), and what the server keeps (startup.sh).
SERVER_GID = 999
SERVER_CAPABILITIES = {name.removeprefix("CAP_") for name in REQUIRED_CAPABILITIES}


def test_the_pod_starts_as_root_and_keeps_only_the_servers_capabilities(
    statefulset: dict[str, Any], container: dict[str, Any]
) -> None:
    """Root for startup.sh only, every capability dropped but the four the server keeps,
    no escalation, and fsGroup agent-server's group for the state volume."""
    pod = statefulset["spec"]["template"]["spec"]
    context = pod["securityContext"]
    assert (context["runAsUser"], context["runAsNonRoot"]) == (0, False)
    assert context["fsGroup"] == SERVER_GID
    # Without it, the kubelet re-chmods the state dir group-writable at every mount.
    assert context["fsGroupChangePolicy"] == "OnRootMismatch"
    assert context["seccompProfile"] == {"type": "RuntimeDefault"}
    own = container["securityContext"]
    assert own["capabilities"]["drop"] == ["ALL"]
    assert set(own["capabilities"]["add"]) == SERVER_CAPABILITIES
    assert own["allowPrivilegeEscalation"] is False
    assert "runAsUser" not in own


# --- Pod Security Standards (kubernetes.io/docs/concepts/security/pod-security-standards)

BASELINE_CAPABILITIES = {
    "AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD",
    "NET_BIND_SERVICE", "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT",
}  # fmt: skip


def baseline_violations(pod: dict[str, Any]) -> list[str]:
    """What of the pod spec Baseline forbids (the controls this manifest can touch)."""
    found = [f"{key}" for key in ("hostNetwork", "hostPID", "hostIPC") if pod.get(key)]
    found += [f"hostPath volume {v['name']}" for v in pod.get("volumes", []) if "hostPath" in v]
    contexts = [pod.get("securityContext", {})]
    for item in pod["containers"]:
        own = item.get("securityContext", {})
        contexts.append(own)
        if own.get("privileged"):
            found.append("privileged")
        added = set(own.get("capabilities", {}).get("add", [])) - BASELINE_CAPABILITIES
        found += [f"adds {name}" for name in sorted(added)]
        found += ["hostPort" for port in item.get("ports", []) if port.get("hostPort")]
    if any(c.get("seccompProfile", {}).get("type") == "Unconfined" for c in contexts):
        found.append("seccomp Unconfined")
    return found


def restricted_violations(pod: dict[str, Any]) -> list[str]:
    """What of the pod spec Restricted forbids, on top of Baseline."""
    found = baseline_violations(pod)
    context = pod.get("securityContext", {})
    for item in pod["containers"]:
        own = {**context, **item.get("securityContext", {})}
        if own.get("runAsNonRoot") is not True or own.get("runAsUser") == 0:
            found.append("runs as root")
        capabilities = own.get("capabilities", {})
        if "ALL" not in capabilities.get("drop", []):
            found.append("keeps capabilities")
        if set(capabilities.get("add", [])) - {"NET_BIND_SERVICE"}:
            found.append("adds capabilities")
        if own.get("allowPrivilegeEscalation") is not False:
            found.append("allows privilege escalation")
        if own.get("seccompProfile", {}).get("type") not in ("RuntimeDefault", "Localhost"):
            found.append("no seccomp profile")
    return found


@pytest.mark.parametrize(
    ("change", "violation"),
    [
        pytest.param({"hostPID": True}, "hostPID", id="a pod sharing the host's pids"),
        pytest.param(
            {"containers": [{"securityContext": {"privileged": True}}]},
            "privileged",
            id="a privileged container",
        ),
        pytest.param(
            {"containers": [{"securityContext": {"capabilities": {"add": ["SYS_PTRACE"]}}}]},
            "adds SYS_PTRACE",
            id="a capability Baseline does not allow",
        ),
        pytest.param(
            {"securityContext": {"seccompProfile": {"type": "Unconfined"}}},
            "seccomp Unconfined",
            id="no seccomp at all",
        ),
    ],
)
def test_the_baseline_check_finds_what_baseline_forbids(
    change: dict[str, Any], violation: str
) -> None:
    """The check below is not a no-op: each forbidden setting is found."""
    assert baseline_violations({"containers": [{}], **change}) == [violation]


def test_the_pod_meets_baseline_and_not_restricted_only_for_the_privilege_split(
    statefulset: dict[str, Any],
) -> None:
    """Baseline admits the pod; Restricted refuses it only for the root start and the
    four capabilities, the price of running the agent as another user (contract §10)."""
    pod = statefulset["spec"]["template"]["spec"]
    assert baseline_violations(pod) == []
    assert restricted_violations(pod) == ["runs as root", "adds capabilities"]


def test_readiness_and_liveness_probe_health_on_port_8000(container: dict[str, Any]) -> None:
    """Both probes GET /health on the server's port."""
    assert {p["containerPort"] for p in container["ports"]} == {PORT}
    for probe in ("readinessProbe", "livenessProbe"):
        check = container[probe]["httpGet"]
        assert check["path"] == "/health", probe
        assert check["port"] == PORT, probe
        assert container[probe]["timeoutSeconds"] >= 2, probe


def test_termination_grace_is_above_the_servers_shutdown_grace(
    statefulset: dict[str, Any], container: dict[str, Any]
) -> None:
    """The kubelet's SIGKILL comes after the server's grace and its kill of late turns."""
    entry = env_of(container).get("AGENT_SERVER_SHUTDOWN_GRACE_S")
    grace = float(entry["value"]) if entry else DEFAULT_SHUTDOWN_GRACE_S
    termination = statefulset["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert termination > grace + STOP_TIMEOUT_MARGIN_S, (termination, grace)


def test_resources_are_sized_for_the_server_and_its_cli(container: dict[str, Any]) -> None:
    """The request holds the idle server and one CLI turn; the limit, the parallel turns."""
    resources = container["resources"]
    request = mebibytes(resources["requests"]["memory"])
    limit = mebibytes(resources["limits"]["memory"])
    assert request >= SERVER_IDLE_MIB + CLI_TURN_MIB, request
    parallel = int(env_of(container)["AGENT_SERVER_MAX_PARALLEL"]["value"])
    assert limit >= SERVER_IDLE_MIB + parallel * CLI_TURN_MIB, (limit, parallel)
    assert "cpu" in resources["requests"]


# --- kubectl, where it exists ---------------------------------------------------------------


# The legacy discovery documents kubectl asks for, for the kinds of the manifest.
DISCOVERY: dict[str, Any] = {
    "/api": {"kind": "APIVersions", "versions": ["v1"]},
    "/apis": {
        "kind": "APIGroupList",
        "apiVersion": "v1",
        "groups": [
            {
                "name": "apps",
                "versions": [{"groupVersion": "apps/v1", "version": "v1"}],
                "preferredVersion": {"groupVersion": "apps/v1", "version": "v1"},
            }
        ],
    },
    "/api/v1": {
        "kind": "APIResourceList",
        "groupVersion": "v1",
        "resources": [
            {"name": n, "singularName": s, "namespaced": True, "kind": k, "verbs": ["create"]}
            for n, s, k in [("secrets", "secret", "Secret"), ("services", "service", "Service")]
        ],
    },
    "/apis/apps/v1": {
        "kind": "APIResourceList",
        "groupVersion": "apps/v1",
        "resources": [
            {
                "name": "statefulsets",
                "singularName": "statefulset",
                "namespaced": True,
                "kind": "StatefulSet",
                "verbs": ["create"],
            }
        ],
    },
}


class _Discovery(BaseHTTPRequestHandler):
    """Serves DISCOVERY, and 404 for anything else."""

    def do_GET(self) -> None:
        document = DISCOVERY.get(self.path.split("?")[0])
        body = json.dumps(document or {"kind": "Status", "code": 404}).encode()
        self.send_response(200 if document else 404)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet."""


@pytest.fixture
def discovery() -> Iterator[str]:
    """A loopback API server that only answers discovery; its URL."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Discovery)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def test_kubectl_create_dry_run_reads_every_object(tmp_path: Path, discovery: str) -> None:
    """`kubectl create --dry-run=client` maps and decodes each object (no cluster needed)."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed")
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "stub", "cluster": {"server": discovery}}],
                "users": [{"name": "stub", "user": {}}],
                "contexts": [{"name": "stub", "context": {"cluster": "stub", "user": "stub"}}],
                "current-context": "stub",
            }
        )
    )
    result = subprocess.run(
        [
            kubectl,
            "--kubeconfig",
            str(kubeconfig),
            "--cache-dir",
            str(tmp_path / "cache"),
            "create",
            "--dry-run=client",
            "--validate=false",  # the schemas are checked above; the stand-in has none
            "-o",
            "name",
            "-f",
            str(MANIFEST),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        stdin=subprocess.DEVNULL,
    )
    assert result.returncode == 0, result.stderr
    expected = {f"{o['kind'].lower()}/{o['metadata']['name']}" for o in load()}
    assert set(result.stdout.split()) == {
        name.replace("statefulset/", "statefulset.apps/") for name in expected
    }
