"""`agent-server pool serve` from the agent's image, run as the Kubernetes manifest runs it.

docker/kubernetes/pool-service.yaml starts the image's `agent-server` as `pool serve`,
as uid 999 with a read-only root: the same here (`--entrypoint agent-server`, `--user
999:999`, `--read-only`, a tmpfs for the SQLite store), the pool file and the API token
bind-mounted read-only. The page, the API with and without the bearer, and /metrics
answer; nothing of the secrets reaches the logs.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import SecretRegistry
from tests.image.conftest import IMAGE, RUN_ID, RUN_LABEL, Docker
from tests.support.server import free_port

pytestmark = pytest.mark.timeout(120)


def _pool_dir(root: Path, registry: SecretRegistry) -> tuple[Path, str]:
    """A pool file of one subscription, its secret and the API token, readable by uid 999."""
    root.mkdir(mode=0o755)
    root.chmod(0o755)
    (root / "sub-a").write_text(registry.new("image_pool_sub_a") + "\n")
    token = registry.new("image_pool_api")
    (root / "api-token").write_text(token + "\n")
    (root / "pool.toml").write_text(
        '[[credential]]\nid = "sub-a"\nkind = "subscription"\nsecret_file = "sub-a"\n'
    )
    for path in root.iterdir():
        path.chmod(0o644)
    return root, token


def _serving(url: str, logs: Any) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=2).status_code == 401:
                return
        except httpx.HTTPError:
            time.sleep(0.2)
    pytest.fail(f"pool serve never answered:\n{logs()}")


def test_pool_serve_runs_from_the_image_as_agent_server(
    docker: Docker, image: dict[str, Any], tmp_path: Path, secret_registry: SecretRegistry
) -> None:
    """The page at /, 401 without the bearer, the pool with it, /metrics parses."""
    pool_dir, token = _pool_dir(tmp_path / "pool", secret_registry)
    port = free_port()
    name = f"agent-pool-test-{RUN_ID}"
    docker.run(
        "run", "-d", "--name", name, "--label", RUN_LABEL, "--network", "host",
        "--user", "999:999", "--read-only", "--tmpfs", "/tmp", "--cap-drop", "ALL",
        "-v", f"{pool_dir}:/etc/agent-pool:ro", "--entrypoint", "agent-server", IMAGE,
        "pool", "serve", "--pool", "/etc/agent-pool/pool.toml",
        "--store", "sqlite:////tmp/pool.sqlite3", "--listen", f"127.0.0.1:{port}",
        "--token-file", "/etc/agent-pool/api-token",
    )  # fmt: skip

    def logs() -> str:
        found = docker.run("logs", name, check=False)
        return found.stdout + found.stderr

    base = f"http://127.0.0.1:{port}"
    try:
        _serving(f"{base}/v1/pool", logs)
        page = httpx.get(f"{base}/", timeout=10)
        assert page.status_code == 200
        assert "<title>agent pool</title>" in page.text
        bearer = {"Authorization": f"Bearer {token}"}
        pool = httpx.get(f"{base}/v1/pool", headers=bearer, timeout=10).json()
        assert [c["credential"] for c in pool["credentials"]] == ["sub-a"]
        metrics = httpx.get(f"{base}/metrics", headers=bearer, timeout=10).text
        names = {family.name for family in text_string_to_metric_families(metrics)}
        assert "agent_pool_waiting_turns" in names, sorted(names)
        user = docker.run("exec", name, "id", "-u").stdout.strip()
        assert user == "999"
    finally:
        text = logs()
        docker.run("rm", "-f", name, check=False)
    assert not secret_registry.leaks([text])
