"""The contract §8 metrics: one registry per app, and every reload answer counted by result."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from starlette.types import ASGIApp

from agent_server.app import create_app
from agent_server.config import Settings
from agent_server.metrics import Metrics
from agent_server.services import Services

TOKEN = "unit-controller-token-0123456789"
HEADERS = {"X-Trinity-Agent-Token": TOKEN}
RELOAD = "/api/credentials/reload-token"


class AppClient:
    """Requests to an ASGI app in-process, on one event loop (no server, no lifespan)."""

    def __init__(self, app: ASGIApp) -> None:
        self._runner = asyncio.Runner()
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        self._client = httpx.AsyncClient(
            transport=transport, base_url="http://agent.test", headers=HEADERS
        )

    def post(self, path: str, **kwargs: Any) -> httpx.Response:
        """POST `path` with the controller token."""
        return self._runner.run(self._client.post(path, **kwargs))

    def close(self) -> None:
        """Close the client and its loop."""
        self._runner.run(self._client.aclose())
        self._runner.close()


def _families(metrics: Metrics) -> dict[str, str]:
    """Metric family name -> type, from the rendered exposition."""
    text = metrics.render().decode()
    return {family.name: family.type for family in text_string_to_metric_families(text)}


def test_every_spec_metric_is_exposed_with_its_type() -> None:
    """The exposition names the contract §8 metrics with the right Prometheus types."""
    families = _families(Metrics())
    assert families["agent_server_turns"] == "counter"
    assert families["agent_server_turn_seconds"] == "histogram"
    assert families["agent_server_active_turns"] == "gauge"
    assert families["agent_server_credential_reloads"] == "counter"
    assert families["agent_server_credential_generation"] == "gauge"
    assert families["agent_server_spawn_suppressed_keys"] == "counter"


def test_two_apps_never_share_a_counter() -> None:
    """Each Metrics has its own registry, so one server's turns do not show in another's."""
    first, second = Metrics(), Metrics()
    first.turns.labels(outcome="success", auth_route="baseline").inc()
    labels = {"outcome": "success", "auth_route": "baseline"}
    assert first.registry.get_sample_value("agent_server_turns_total", labels) == 1
    assert second.registry.get_sample_value("agent_server_turns_total", labels) is None


@pytest.fixture
def app_services(environ: dict[str, str]) -> Services:
    """Services of a Claude agent with a baseline OAuth token and a controller token."""
    settings = Settings.from_environ(
        {
            **environ,
            "CLAUDE_CODE_OAUTH_TOKEN": "unit-baseline-oauth-0123456789",
            "TRINITY_AGENT_AUTH_TOKEN": TOKEN,
        }
    )
    return Services.build(settings)


@pytest.fixture
def client(app_services: Services) -> Iterator[AppClient]:
    """An in-process client of the app over `app_services`."""
    client = AppClient(create_app(app_services.settings, app_services))
    yield client
    client.close()


def _reloads(services: Services) -> dict[str, float]:
    samples = {}
    for family in text_string_to_metric_families(services.metrics.render().decode()):
        if family.name == "agent_server_credential_reloads":
            for sample in family.samples:
                if sample.name.endswith("_total"):
                    samples[sample.labels["result"]] = sample.value
    return samples


def test_every_reload_answer_is_counted_by_result(
    app_services: Services, client: AppClient
) -> None:
    """changed, unchanged, and each error code (400s, 409, 422, 500) count once per answer."""
    token = {"token": "unit-rotated-oauth-0123456789"}
    assert client.post(RELOAD, json=token).status_code == 200
    assert client.post(RELOAD, json=token).status_code == 200
    assert client.post(RELOAD, json={"token": "  "}).status_code == 400
    assert client.post(RELOAD, json={**token, "expected_generation": 1}).status_code == 409
    assert client.post(RELOAD, json={"token": "has space"}).status_code == 400
    assert client.post(RELOAD, json={**token, "surprise": 1}).status_code == 422
    state_dir = app_services.settings.state_dir
    state_dir.chmod(0o777)  # an open state dir is refused: persist_failed, nothing changes
    try:
        failed = client.post(RELOAD, json={"token": "unit-second-oauth-0123456789"})
    finally:
        state_dir.chmod(0o700)
    assert failed.status_code == 500, failed.text
    assert _reloads(app_services) == {
        "changed": 1,
        "unchanged": 1,
        "token_required": 1,
        "token_invalid": 1,
        "generation_mismatch": 1,
        "validation_failed": 1,
        "persist_failed": 1,
    }


def test_an_unexpected_reload_failure_counts_as_internal_error(
    app_services: Services, client: AppClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reload that crashes still counts (as internal_error) and still answers 500."""

    async def crash(*_args: object, **_kwargs: object) -> None:
        msg = "disk on fire"
        raise RuntimeError(msg)

    monkeypatch.setattr(app_services.store, "reload", crash)
    response = client.post(RELOAD, json={"token": "unit-rotated-oauth-0123456789"})
    assert response.status_code == 500
    assert response.json()["detail"]["error_code"] == "internal_error"
    assert _reloads(app_services) == {"internal_error": 1}


def test_the_generation_gauge_follows_the_credential_state(
    app_services: Services, client: AppClient
) -> None:
    """agent_server_credential_generation is the store's generation, before and after a reload."""
    registry = app_services.metrics.registry
    gauge = "agent_server_credential_generation"
    assert registry.get_sample_value(gauge) == app_services.store.current.generation
    body = client.post(RELOAD, json={"token": "unit-rotated-oauth-0123456789"}).json()
    assert registry.get_sample_value(gauge) == body["generation"]
    assert body["generation"] == app_services.store.current.generation
