"""The service's HTTP API over in-process agents: auth, turns, the pool, heartbeats, metrics."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from pydantic import SecretStr

from agent_server.controller.client import AgentClient
from agent_server.controller.service import route_table
from agent_server.controller.service.openapi import openapi_document
from tests.support.mock_agent import MockAgent, Verdict
from tests.unit.controller.service.conftest import AGENT_TOKEN, BEARER, NOW, TOKEN, A, serving

pytestmark = pytest.mark.anyio
OPERATOR_ROUTES = [
    ("GET", "/v1/openapi.json"),
    ("GET", "/v1/pool"),
    ("POST", "/v1/agents/a1/turns"),
    ("GET", "/v1/turns/x"),
    ("POST", "/v1/agents/a1/assign"),
    ("POST", "/v1/agents/a1/stop"),
    ("DELETE", "/v1/credentials/a/failures"),
    ("GET", "/v1/events"),
    ("GET", "/metrics"),
]


@pytest.mark.parametrize(("method", "path"), OPERATOR_ROUTES)
@pytest.mark.parametrize("header", [None, "Bearer wrong-token", TOKEN, f"Basic {TOKEN}"])
async def test_every_operator_route_takes_the_bearer(
    store_url: str, method: str, path: str, header: str | None
) -> None:
    """No header, a wrong token, the token without `Bearer `: 401 JSON, nothing run."""
    agent = MockAgent({})
    async with serving(store_url, {"a1": agent.client()}) as served:
        headers = {"Authorization": header} if header else {}
        served.http.headers.clear()
        answer = await served.http.request(method, path, headers=headers, json={"message": "hi"})
    assert answer.status_code == 401
    assert answer.json()["error"] == "unauthorized"
    assert TOKEN not in answer.text
    assert agent.turns == []


def test_the_openapi_document_names_every_route() -> None:
    """The document and the routes table agree, path and method."""
    documented = {
        (method.upper(), path)
        for path, item in openapi_document()["paths"].items()
        for method in item
    }
    routed = {
        (method, route.path)
        for route in route_table(SecretStr(TOKEN))
        for method in (route.methods or ()) - {"HEAD"}
    }
    assert documented == routed


async def test_a_turn_walks_and_answers_the_walk_result(store_url: str) -> None:
    """a refuses (429), b serves: the walk's result, b committed; the metrics count it."""
    agent = MockAgent({A: Verdict("rate_limit", NOW + timedelta(hours=1))})
    async with serving(store_url, {"a1": agent.client()}) as served:
        await served.store.compare_and_set_assignment(
            "a1", "a", expected_generation=None, at=NOW - timedelta(days=1)
        )
        answer = await served.http.post(
            "/v1/agents/a1/turns", json={"message": "fix it", "execution_id": "t-1"}
        )
        metrics = (await served.http.get("/metrics")).text
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert (body["outcome"], body["served_by"], body["execution_id"]) == ("served", "b", "t-1")
    assert _sample(metrics, "agent_pool_walks_total", outcome="served") == 1
    assert _sample(metrics, "agent_pool_refusals_total", credential="a", kind="rate_limit") == 1
    assert _sample(metrics, "agent_pool_walk_rungs_count") == 1


@pytest.mark.parametrize(
    ("body", "status"),
    [
        pytest.param({"message": ""}, 422, id="an empty message"),
        pytest.param({"message": "x", "colour": 1}, 422, id="an unknown key"),
        pytest.param({"message": "x", "execution_id": "a b"}, 422, id="a bad execution id"),
        pytest.param({"message": "x", "timeout_s": 0}, 422, id="no time"),
        pytest.param({"message": "x", "async": "soon"}, 422, id="async not a bool"),
        pytest.param(["x"], 422, id="not an object"),
        pytest.param(b"{not json", 400, id="not JSON"),
        pytest.param(b"{" + b" " * 5_000_000 + b"}", 413, id="too large"),
    ],
)
async def test_a_bad_turn_is_a_4xx_and_changes_nothing(
    store_url: str, body: Any, status: int
) -> None:
    """Nothing is sent to the agent and the store has no assignment."""
    agent = MockAgent({})
    async with serving(store_url, {"a1": agent.client()}) as served:
        kwargs: dict[str, Any] = {"content": body} if isinstance(body, bytes) else {"json": body}
        answer = await served.http.post("/v1/agents/a1/turns", **kwargs)
        snapshot = await served.store.snapshot()
    assert answer.status_code == status, answer.text
    assert set(answer.json()) == {"error", "message"}
    assert agent.turns == []
    assert snapshot.assignments == {}


async def test_an_unknown_agent_is_404(store_url: str) -> None:
    """An agent the pool file does not name with a url: 404, nothing run."""
    async with serving(store_url, {}) as served:
        answer = await served.http.post("/v1/agents/ghost/turns", json={"message": "x"})
    assert (answer.status_code, answer.json()["error"]) == (404, "unknown_agent")


async def test_an_async_turn_is_read_back(store_url: str) -> None:
    """202 at once; `GET /v1/turns/{id}` is 202 running, then 200 with the result; an
    unknown id is 404."""
    gate = asyncio.Event()
    agent = MockAgent({})
    client = agent.client()
    sent = client.task

    async def held(*args: Any, **kwargs: Any) -> Any:
        await gate.wait()
        return await sent(*args, **kwargs)

    client.task = held  # type: ignore[method-assign]
    async with serving(store_url, {"a1": client}) as served:
        posted = await served.http.post(
            "/v1/agents/a1/turns", json={"message": "x", "execution_id": "t-2", "async": True}
        )
        running = await served.http.get("/v1/turns/t-2")
        again = await served.http.post(
            "/v1/agents/a1/turns", json={"message": "x", "execution_id": "t-2", "async": True}
        )
        gate.set()
        for _ in range(100):
            done = await served.http.get("/v1/turns/t-2")
            if done.status_code == 200:
                break
            await asyncio.sleep(0.01)
        unknown = await served.http.get("/v1/turns/nope")
    assert (posted.status_code, posted.json()) == (202, {"execution_id": "t-2", "state": "running"})
    assert (running.status_code, running.json()["state"]) == (202, "running")
    assert again.status_code == 409
    assert (done.status_code, done.json()["result"]["outcome"]) == (200, "served")
    assert unknown.status_code == 404


async def test_a_heartbeat_is_kept_and_shown(store_url: str) -> None:
    """The agent's own token: 204, then its liveness in /v1/pool and /metrics; a wrong
    token, an unknown agent or a bad body changes nothing."""
    agent = MockAgent({})
    beat = {
        "memory_mb": 81.5,
        "active_executions": 1,
        "uptime_s": 12.0,
        "executions": [{"execution_id": "e1", "tool": "Bash", "summary": "ls", "since": "x"}],
    }
    async with serving(store_url, {"a1": agent.client()}) as served:
        url = "/api/agents/a1/heartbeat"
        own = {"Authorization": f"Bearer {AGENT_TOKEN}"}
        wrong = await served.http.post(url, json=beat, headers=BEARER)
        ghost = await served.http.post("/api/agents/ghost/heartbeat", json=beat, headers=own)
        bad = await served.http.post(url, json={**beat, "active_executions": -1}, headers=own)
        before = (await served.http.get("/v1/pool")).json()["agents"]
        kept = await served.http.post(url, json=beat, headers=own)
        pool = (await served.http.get("/v1/pool")).json()
        metrics = (await served.http.get("/metrics")).text
    assert (wrong.status_code, ghost.status_code, bad.status_code) == (401, 401, 422)
    assert before == [{"agent": "a1", "credential": None, "heartbeat": None}]
    assert kept.status_code == 204
    shown = pool["agents"][0]["heartbeat"]
    assert shown["executions"][0]["tool"] == "Bash"
    assert (shown["memory_mb"], shown["age_s"]) == (81.5, 0.0)
    assert _sample(metrics, "agent_pool_agent_heartbeat_age_seconds", agent="a1") == 0.0


async def test_the_pool_and_the_operators_hands(store_url: str) -> None:
    """assign, stop and clear do what the CLI's do; /v1/pool shows the result."""
    agent = MockAgent({})
    async with serving(store_url, {"a1": agent.client()}) as served:
        assigned = await served.http.post("/v1/agents/a1/assign", json={"credential": "b"})
        stranger = await served.http.post("/v1/agents/a1/assign", json={"credential": "zz"})
        invalid = await served.http.post("/v1/agents/a1/assign", json={"credential": 3})
        stopped = await served.http.post("/v1/agents/a1/stop")
        cleared = await served.http.delete("/v1/credentials/a/failures")
        unknown = await served.http.delete("/v1/credentials/zz/failures")
        pool = (await served.http.get("/v1/pool")).json()
    assert assigned.json() == {"agent": "a1", "credential": "b", "generation": 1}
    assert (stranger.status_code, invalid.status_code) == (404, 422)
    assert stopped.json() == {"agent": "a1", "cancelled_turns": 0}
    assert cleared.json() == {"credential": "a", "cleared": True}
    assert unknown.status_code == 404
    assert pool["assignments"][0]["credential"] == "b"
    assert [row["credential"] for row in pool["credentials"]] == ["a", "b", "gw"]
    assert {row["in_flight"] for row in pool["credentials"]} == {0}


async def test_the_metrics_parse_with_every_fixed_name(store_url: str) -> None:
    """The exposition parses with prometheus-client's parser and names every metric."""
    async with serving(store_url, {}) as served:
        answer = await served.http.get("/metrics")
    names = {family.name for family in text_string_to_metric_families(answer.text)}
    assert names >= {
        "agent_pool_credential_standing",
        "agent_pool_refusals",
        "agent_pool_walks",
        "agent_pool_walk_rungs",
        "agent_pool_waiting_turns",
        "agent_pool_retries_run",
        "agent_pool_probes_run",
        "agent_pool_turns_in_flight",
    }
    assert _sample(answer.text, "agent_pool_credential_standing", credential="a",
                   standing="available") == 1  # fmt: skip


async def test_the_page_is_served_without_a_token_and_may_only_talk_to_its_origin(
    store_url: str,
) -> None:
    """GET / needs no bearer (the page holds no data; it asks for the token), and its
    headers keep it from loading, framing or posting anything beyond this origin."""
    async with serving(store_url, {}) as served:
        served.http.headers.clear()
        answer = await served.http.get("/")
    assert answer.status_code == 200
    assert answer.headers["content-type"] == "text/html; charset=utf-8"
    policy = dict(
        directive.strip().split(" ", 1)
        for directive in answer.headers["content-security-policy"].split(";")
    )
    assert policy["default-src"] == "'none'"
    assert policy["connect-src"] == "'self'"
    assert policy["frame-ancestors"] == "'none'"
    assert answer.headers["x-content-type-options"] == "nosniff"
    assert answer.headers["referrer-policy"] == "no-referrer"
    assert answer.headers["cache-control"] == "no-store"


def _sample(text: str, name: str, **labels: str) -> float | None:
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return sample.value
    return None


async def test_an_unreachable_agent_is_a_502_and_a_failed_async_turn(store_url: str) -> None:
    """Nothing listens at the agent's url: a sync turn is a 502 naming the error's kind;
    an async one reads back as failed."""
    client = AgentClient("http://127.0.0.1:1", SecretStr(AGENT_TOKEN), timeout_s=2)
    async with serving(store_url, {"a1": client}) as served:
        sync = await served.http.post("/v1/agents/a1/turns", json={"message": "x"})
        body = {"message": "x", "execution_id": "t-4", "async": True}
        assert (await served.http.post("/v1/agents/a1/turns", json=body)).status_code == 202
        for _ in range(200):
            later = await served.http.get("/v1/turns/t-4")
            if later.status_code == 200:
                break
            await asyncio.sleep(0.01)
    assert (sync.status_code, sync.json()) == (
        502,
        {"error": "agent_unreachable", "message": "TransportError"},
    )
    assert later.json() == {"execution_id": "t-4", "state": "failed", "error": "TransportError"}
