"""A service app over in-process agents (`tests/support/mock_agent.py`) and a SQLite store."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest
from pydantic import SecretStr
from starlette.applications import Starlette

from agent_server.controller import PoolCredential, PoolStore, build_pool, open_store
from agent_server.controller.client import AgentClient
from agent_server.controller.pool.file import PoolAgent
from agent_server.controller.service import ServiceConfig, ServiceInstance, create_app

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
A, B = "tsec-sub-a-0123456789", "tsec-sub-b-0123456789"
GATEWAY = "tsec-gateway-0123456789"
TOKEN = "tsec-service-token-0123456789"
BEARER = {"Authorization": f"Bearer {TOKEN}"}
AGENT_TOKEN = "ctl-token"
POOL = replace(
    build_pool(
        [
            PoolCredential("a", "subscription", SecretStr(A)),
            PoolCredential("b", "subscription", SecretStr(B)),
            PoolCredential("gw", "gateway", SecretStr(GATEWAY), "https://gw.example/anthropic"),
        ]
    ),
    agents={"a1": PoolAgent("a1", "http://agent.test", SecretStr(AGENT_TOKEN))},
)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@dataclass
class Served:
    """One running app: its instance, a client with the bearer, and its store."""

    app: Starlette
    instance: ServiceInstance
    http: httpx.AsyncClient
    store: PoolStore


@asynccontextmanager
async def serving(
    store_url: str, clients: dict[str, AgentClient], *, clock: Callable[[], datetime] = lambda: NOW
) -> AsyncIterator[Served]:
    """An app on `store_url` with these agents, its lifespan run, a client of it."""
    store = await open_store(store_url)
    config = ServiceConfig(POOL, store, tick_s=3600, drain_s=0.2, clock=clock, clients=clients)
    app = create_app(config, SecretStr(TOKEN))
    transport = httpx.ASGITransport(app=app)
    try:
        async with (
            app.router.lifespan_context(app),
            httpx.AsyncClient(
                transport=transport, base_url="http://svc.test", headers=BEARER
            ) as http,
        ):
            yield Served(app, app.state.instance, http, store)
    finally:
        await store.close()


@pytest.fixture
def store_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path}/pool.sqlite3"
