"""What the walk's end-to-end tests share: pools from values, a walker on a real
server and store, and what the stand-in was sent."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from pydantic import SecretStr

from agent_server.controller.client import AgentClient
from agent_server.controller.clock import utc_now
from agent_server.controller.events import WalkEvent
from agent_server.controller.pool.file import Pool, parse_pool
from agent_server.controller.result import WalkResult
from agent_server.controller.stores.base import PoolStore, open_store
from agent_server.controller.walker import Walker
from tests.conftest import SecretRegistry
from tests.e2e.conftest import TurnServers
from tests.support.messages_api import QUIET_CLI, MessagesApiStandIn, require_real_cli
from tests.support.messages_api import ScenarioCredentials as Credentials
from tests.support.server import CONTROLLER_TOKEN, REPO, ServerProcess

HOUR = 3600


@pytest.fixture(name="anyio_backend")
def anyio_backend_fixture() -> str:
    return "asyncio"


@pytest.fixture(scope="module", name="api")
def api_fixture() -> Iterator[MessagesApiStandIn]:
    with MessagesApiStandIn(reset_in_s=HOUR, slow_max_wait_s=10) as stand_in:
        yield stand_in


@pytest.fixture(scope="module", name="cli_env")
def cli_env_fixture(api: MessagesApiStandIn) -> dict[str, str]:
    return {
        # The server runs this checkout's package (the venv's editable install may be
        # another worktree's): the walk's tests exercise the server beside them.
        "PYTHONPATH": str(REPO),
        "AGENT_SERVER_RUNTIME_COMMAND": str(require_real_cli()),
        "ANTHROPIC_BASE_URL": api.base_url,
        **QUIET_CLI,
    }


@pytest.fixture(scope="module", name="agent")
def agent_fixture(module_turn_servers: TurnServers, cli_env: dict[str, str]) -> ServerProcess:
    """The agent's server, with no credential of its own: the walk brings each one."""
    return module_turn_servers.start(**cli_env)


@pytest.fixture(scope="module", name="creds")
def creds_fixture(secret_registry: SecretRegistry) -> Credentials:
    """The module's credential values, registered for the leak checks."""
    return Credentials(secret_registry, "walk")


def make_pool(
    *entries: tuple[str, str, str],
    gateway_url: str = "",
    gateway_model: str | None = None,
    opt_out: str = "",
) -> Pool:
    """A pool of (id, kind, secret) whose secrets come from variables, as a file's would."""
    environ = {f"POOL_{n}": secret for n, (_, _, secret) in enumerate(entries)}
    document: dict[str, Any] = {
        "credential": [
            {"id": ident, "kind": kind, "secret_env": f"POOL_{n}"}
            | ({"base_url": gateway_url} if kind == "gateway" else {})
            | ({"model": gateway_model} if kind == "gateway" and gateway_model else {})
            for n, (ident, kind, _) in enumerate(entries)
        ],
        "agent": {opt_out: {"api_key": False}} if opt_out else {},
    }
    return parse_pool(document, environ, Path("."))


@contextlib.asynccontextmanager
async def walking(
    server: ServerProcess | str,
    pool: Pool,
    store_url: str,
    events: list[WalkEvent],
    clock: Callable[[], datetime] = utc_now,
) -> AsyncIterator[tuple[Walker, PoolStore]]:
    """A walker over a real server and a real store, its events into `events`."""
    base_url = server if isinstance(server, str) else server.base_url
    store = await open_store(store_url)
    client = AgentClient(base_url, SecretStr(CONTROLLER_TOKEN))
    try:
        await store.register_credentials(pool.infos)
        # One server answers for every agent name these tests walk.
        yield Walker(lambda _agent: client, store, pool, clock=clock, hook=events.append), store
    finally:
        await client.aclose()
        await store.close()


def attempts(result: WalkResult) -> list[tuple[str | None, str | None]]:
    return [(attempt.credential_id, attempt.error_code) for attempt in result.trail]


def seen(api: MessagesApiStandIn, since: int) -> list[str]:
    """The fingerprints of the credentials the API was sent since request `since`, a run
    of one credential counted once (Claude Code sends a request again after a 401)."""
    sent = [r.fingerprint or "" for r in api.message_requests[since:]]
    return [fp for n, fp in enumerate(sent) if n == 0 or sent[n - 1] != fp]


def reloads(server: ServerProcess) -> dict[str, float]:
    """`agent_server_credential_reloads_total` by result."""
    return {
        sample.labels["result"]: sample.value
        for family in text_string_to_metric_families(server.get("/metrics").text)
        for sample in family.samples
        if sample.name == "agent_server_credential_reloads_total"
    }


def assert_quiet(events: list[WalkEvent], creds: Credentials, text: str = "") -> None:
    """No event, log line or output carries a credential."""
    said = "\n".join(event.line() for event in events) + text
    assert not [value for value in creds.values if value in said]


def about(instant: datetime | None, seconds_ahead: float) -> bool:
    assert instant is not None
    ahead = (instant - utc_now()).total_seconds()
    return seconds_ahead - 120 < ahead <= seconds_ahead + 1
