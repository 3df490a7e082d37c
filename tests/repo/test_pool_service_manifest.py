"""docker/kubernetes/pool-service.yaml: schema-valid offline, and the pool service's wiring.

The service's arguments point at what the file defines (the pool file's ConfigMap, the
token's Secret, Redis's Service), the pool file in the ConfigMap loads with the
Secret's values as its files, and every pod meets Pod Security Standard Restricted
(nothing here runs a turn, so nothing needs root or a capability).
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import urlsplit

import kubernetes_validate
import pytest
import yaml

from agent_server.controller.pool.file import load_pool
from tests.repo.test_kubernetes_manifest import VERSIONS, restricted_violations

ROOT = Path(__file__).resolve().parents[2]
MANIFEST = ROOT / "docker" / "kubernetes" / "pool-service.yaml"


def load() -> list[dict[str, Any]]:
    """The manifest's objects (empty documents dropped)."""
    with MANIFEST.open(encoding="utf-8") as handle:
        return [doc for doc in yaml.safe_load_all(handle) if doc]


@pytest.fixture(scope="module")
def objects() -> list[dict[str, Any]]:
    """Every object of the manifest."""
    return load()


def one(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    """The object of that kind and name."""
    found = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(found) == 1, (kind, name, [(o["kind"], o["metadata"]["name"]) for o in objects])
    return found[0]


def flags(args: list[str]) -> dict[str, str]:
    """`--name value` pairs of a container's args."""
    assert len(args) % 2 == 0, args
    return {args[i]: args[i + 1] for i in range(0, len(args), 2)}


@pytest.fixture(scope="module")
def service(objects: list[dict[str, Any]]) -> dict[str, Any]:
    """The pool service's container."""
    deployment = one(objects, "Deployment", "agent-pool")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    found: dict[str, Any] = container
    return found


@pytest.mark.parametrize("version", [VERSIONS[0], VERSIONS[-1]])
def test_every_object_is_valid_for_kubernetes(objects: list[dict[str, Any]], version: str) -> None:
    """Strict schema validation: a misspelt or misplaced field fails."""
    assert sorted(o["kind"] for o in objects) == [
        "ConfigMap", "Deployment", "NetworkPolicy", "Secret", "Service", "Service", "StatefulSet",
    ]  # fmt: skip
    for obj in objects:
        kubernetes_validate.validate(obj, version, strict=True)


def test_every_pod_meets_restricted(objects: list[dict[str, Any]]) -> None:
    """The service and its Redis run as a non-root user with no capability at all."""
    workloads = [o for o in objects if o["kind"] in ("Deployment", "StatefulSet")]
    pods = [o["spec"]["template"]["spec"] for o in workloads]
    assert len(pods) == 2
    for pod in pods:
        assert restricted_violations(pod) == []
        assert pod["automountServiceAccountToken"] is False


def test_the_service_runs_the_images_entry_point_as_pool_serve(
    objects: list[dict[str, Any]], service: dict[str, Any]
) -> None:
    """`agent-server pool serve` on one port, the one its container and Service name."""
    assert service["command"] == ["agent-server", "pool", "serve"]
    given = flags(service["args"])
    assert set(given) == {"--pool", "--store", "--listen", "--token-file"}
    port = int(given["--listen"].rpartition(":")[2])
    assert [p["containerPort"] for p in service["ports"]] == [port]
    front = one(objects, "Service", "agent-pool")["spec"]["ports"]
    assert [p["targetPort"] for p in front] == [port]
    for probe in ("readinessProbe", "livenessProbe"):
        assert service[probe]["tcpSocket"]["port"] == port


def test_the_store_is_the_manifests_redis(
    objects: list[dict[str, Any]], service: dict[str, Any]
) -> None:
    """`--store` names Redis's Service and port; only the service's pods may reach it."""
    store = urlsplit(flags(service["args"])["--store"])
    assert store.scheme == "redis"
    redis = one(objects, "Service", "agent-pool-redis")
    assert store.hostname == redis["metadata"]["name"]
    assert store.port in [p["port"] for p in redis["spec"]["ports"]]
    policy = one(objects, "NetworkPolicy", "agent-pool-redis")["spec"]
    assert policy["podSelector"]["matchLabels"] == redis["spec"]["selector"]
    (allowed,) = policy["ingress"]
    pods = one(objects, "Deployment", "agent-pool")["spec"]["template"]["metadata"]["labels"]
    assert [f["podSelector"]["matchLabels"] for f in allowed["from"]] == [pods]


def _mounted(
    objects: list[dict[str, Any]], service: dict[str, Any]
) -> dict[PurePosixPath, dict[str, str]]:
    """Each mount path of the service's container: the keys and values mounted there."""
    pod = one(objects, "Deployment", "agent-pool")["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounted: dict[PurePosixPath, dict[str, str]] = {}
    for mount in service["volumeMounts"]:
        volume = volumes[mount["name"]]
        if "configMap" in volume:
            data = one(objects, "ConfigMap", volume["configMap"]["name"])["data"]
        elif "secret" in volume:
            data = one(objects, "Secret", volume["secret"]["secretName"])["stringData"]
        else:
            continue
        mounted[PurePosixPath(mount["mountPath"])] = data
    return mounted


def test_the_pool_file_and_every_secret_it_names_are_mounted(
    objects: list[dict[str, Any]], service: dict[str, Any], tmp_path: Path
) -> None:
    """The ConfigMap's pool file loads (each secret_file and token_file is a key of the
    mounted Secret), and the API token is one too; no secret is a literal env value."""
    mounted = _mounted(objects, service)
    for directory, data in mounted.items():
        local = tmp_path / directory.relative_to("/")
        local.mkdir(parents=True)
        for key, value in data.items():
            (local / key).write_text(value, encoding="utf-8")
    given = flags(service["args"])
    for flag in ("--pool", "--token-file"):
        path = PurePosixPath(given[flag])
        assert path.name in mounted[path.parent], flag
    text = (tmp_path / given["--pool"].lstrip("/")).read_text(encoding="utf-8")
    for directory in mounted:
        text = text.replace(f'"{directory}/', f'"{tmp_path}{directory}/')
    local_pool = tmp_path / "pool.toml"
    local_pool.write_text(text, encoding="utf-8")
    pool = load_pool(local_pool, environ={})
    assert [c.id for c in pool.credentials] == ["sub-a", "sub-b"]
    assert list(pool.agents) == ["agent-1"]
    assert pool.max_concurrent_turns == 2
    for entry in service.get("env", []):
        assert not any(w in entry["name"] for w in ("TOKEN", "KEY", "SECRET")), entry
