"""Load: mixed requests at concurrency 32, every turn on ONE coherent credential (contract §4, §6).

Turns with and without an auth override run while reload-token flips the rotated
token back and forth and status, health and the running list are polled. The fake
CLI reports the fingerprint of the credential its spawn really carried: a baseline
turn's must be the token of the generation in its metadata, an override turn's its
own override. Nothing answers 5xx.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from tests.conftest import SecretRegistry
from tests.e2e.conftest import TurnServers
from tests.support.fake_cli import fingerprint
from tests.support.server import CONTROLLER_TOKEN, ServerProcess

CONCURRENCY = 32
REQUESTS = 168
OVERRIDE_HEADER = "X-Trinity-Auth-Override"
OAUTH = "CLAUDE_CODE_OAUTH_TOKEN"
API_KEY = "ANTHROPIC_API_KEY"


@dataclass(frozen=True)
class Sent:
    """One request of the mix: what it was and the answer it got."""

    kind: str
    secret: str | None
    response: httpx.Response


@dataclass(frozen=True)
class Tokens:
    """The credentials of the load server."""

    baseline: str
    stale_env_key: str
    rotated: tuple[str, str]


@pytest.fixture
def tokens(secret_registry: SecretRegistry) -> Tokens:
    """The baseline token, a stale `.env` API key, and the two tokens reload flips between."""
    return Tokens(
        secret_registry.new("load_baseline"),
        secret_registry.new("load_stale_key"),
        (secret_registry.new("load_rot_a"), secret_registry.new("load_rot_b")),
    )


@pytest.fixture
def server(turn_servers: TurnServers, tokens: Tokens) -> ServerProcess:
    """32 turn slots; `.env` carries a stale API key the boot guard must keep out."""
    home = turn_servers.home("load")
    (home / ".env").write_text(f"{API_KEY}={tokens.stale_env_key}\n")
    return turn_servers.start(
        home, CLAUDE_CODE_OAUTH_TOKEN=tokens.baseline, AGENT_SERVER_MAX_PARALLEL=str(CONCURRENCY)
    )


def plan(index: int, tokens: Tokens, registry: SecretRegistry) -> tuple[str, str, Any, str | None]:
    """The index-th request of the mix: (kind, method+path, JSON body, its secret)."""
    slot = index % 8
    message = f"load {index}\n@sleep 0.1" if index % 3 == 0 else f"load {index}"
    if slot in (0, 1, 2):
        return "baseline", "POST /api/task", {"message": message}, None
    if slot == 3:
        token = registry.new(f"load_ov{index}")
        body = {"message": message, "auth_override": {"oauth_token": token}}
        return "oauth_token", "POST /api/task", body, token
    if slot == 4:
        key = registry.new(f"load_key{index}")
        return (
            "api_key",
            "POST /api/task",
            {"message": message, "auth_override": {"api_key": key}},
            key,
        )
    if slot == 5:
        token = tokens.rotated[(index // 8) % 2]
        return "reload", "POST /api/credentials/reload-token", {"token": token}, token
    if slot == 6:
        return "status", "GET /api/credentials/status", None, None
    if index % 16 == 7:
        return "health", "GET /health", None, None
    return "running", "GET /api/executions/running", None, None


def test_mixed_load_keeps_every_turn_on_one_coherent_credential(
    server: ServerProcess, tokens: Tokens, secret_registry: SecretRegistry
) -> None:
    """No 5xx; each turn's spawn carried exactly the credential its generation or override names."""
    with server.client(timeout=10) as client:
        boot = client.get("/api/credentials/status").json()
    generations: dict[int, str] = {int(boot["generation"]): tokens.baseline}
    mix = [plan(i, tokens, secret_registry) for i in range(REQUESTS)]

    def send(client: httpx.Client) -> Callable[[tuple[str, str, Any, str | None]], Sent]:
        def one(item: tuple[str, str, Any, str | None]) -> Sent:
            kind, route, body, secret = item
            method, path = route.split(" ")
            return Sent(kind, secret, client.request(method, path, json=body))

        return one

    limits = httpx.Limits(max_connections=CONCURRENCY, max_keepalive_connections=CONCURRENCY)
    with (
        httpx.Client(
            base_url=server.base_url,
            headers={"X-Trinity-Agent-Token": CONTROLLER_TOKEN},
            timeout=60,
            limits=limits,
        ) as client,
        ThreadPoolExecutor(CONCURRENCY) as pool,
    ):
        answers = list(pool.map(send(client), mix))

    failed = [(a.kind, a.response.status_code, a.response.text[:300]) for a in answers]
    failed = [f for f in failed if f[1] != 200]
    assert failed == [], f"non-200 answers under load: {failed}"

    for answer in (a for a in answers if a.kind == "reload"):
        body = answer.response.json()
        assert answer.secret is not None
        assert body["fingerprint"] == "sha256:" + fingerprint(answer.secret)
        known = generations.setdefault(int(body["generation"]), answer.secret)
        assert known == answer.secret, f"generation {body['generation']} names two tokens"
    assert len(generations) >= 3, "the reloads never changed the credential"

    baseline_generations = set()
    for answer in answers:
        body = answer.response.json()
        if answer.kind == "status":
            # A status snapshot is coherent too: its fingerprint is its generation's token.
            assert body["fingerprint"] == "sha256:" + fingerprint(
                generations[int(body["generation"])]
            )
            continue
        if answer.kind not in ("baseline", "oauth_token", "api_key"):
            continue
        report = json.loads(body["response"])
        metadata = body["metadata"]
        if answer.kind == "baseline":
            generation = int(metadata["generation"])
            baseline_generations.add(generation)
            expected, variable = generations[generation], OAUTH
            assert metadata["auth_route"] == "baseline"
            assert OVERRIDE_HEADER not in answer.response.headers
            assert API_KEY not in report["env_names"], "the stale .env key reached a spawn"
        else:
            assert answer.secret is not None
            expected = answer.secret
            variable = OAUTH if answer.kind == "oauth_token" else API_KEY
            assert metadata["auth_route"] == answer.kind
            assert answer.response.headers[OVERRIDE_HEADER] == answer.kind
        assert (report["served_by"], report["fp"]) == (variable, fingerprint(expected)), answer.kind
        assert metadata["fingerprint"] == "sha256:" + fingerprint(expected)
        # One credential only: no second credential variable rode along.
        assert set(report["fingerprints"]) == {variable}, report["fingerprints"]
    assert len(baseline_generations) >= 2, "no baseline turn ran across a reload"
