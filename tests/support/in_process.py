"""The real ASGI app in-process: Services over the fake CLI and an httpx client of it.

httpx's `ASGITransport` runs the app's routes, middleware and error handlers on the
test's own event loop, with no server and no lifespan; `app_client` starts and stops
the services' broker (on by default, contract §4.8) as the lifespan would. Each test
builds its own Services, so no two tests share a counter, a registry or a state dir.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from typing import Any

import httpx

from agent_server.app import create_app
from agent_server.config import Settings
from agent_server.services import Services
from agent_server.wire.names import CONTROLLER_TOKEN_HEADER
from tests.support.server import FAKE_CLAUDE

TOKEN = "unit-controller-token-0123456789"
HEADERS = {CONTROLLER_TOKEN_HEADER: TOKEN}
BASE_URL = "http://agent.test"


def fake_cli_services(environ: Mapping[str, str], **extra: str) -> Services:
    """Services for `environ` and `extra`: fake-claude as the runtime, TOKEN as the token.

    `extra` wins over everything, `environ` over the two defaults (so
    `TRINITY_AGENT_AUTH_TOKEN=""` leaves the token unset, `AGENT_RUNTIME=codex` switches).
    """
    defaults = {
        "AGENT_SERVER_RUNTIME_COMMAND": str(FAKE_CLAUDE),
        "TRINITY_AGENT_AUTH_TOKEN": TOKEN,
        "IS_SANDBOX": "1",
        # fake-claude makes no API exchange (tests/support/real_clis.py `broker_default`)
        "AGENT_SERVER_BROKER": "0",
    }
    return Services.build(Settings.from_environ({**defaults, **environ, **extra}))


class _OverTheWire(httpx.ASGITransport):
    """An answer reaches a real client at the earliest one step of the server's loop
    after the app wrote it (it crosses a socket); here too. What the server does once
    an answer has left (a turn's metrics, log line, retention) has then begun, as it
    has for any request a real client sends after reading that answer."""

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await super().handle_async_request(request)
        await asyncio.sleep(0)
        return response


@asynccontextmanager
async def app_client(
    services: Services,
    *,
    headers: Mapping[str, str] | None = None,
    raise_app_exceptions: bool = True,
) -> AsyncIterator[httpx.AsyncClient]:
    """A client of `create_app(services)`; it sends the controller token unless `headers`.

    The services' broker, if any, listens for as long as the client is open.
    """
    app = create_app(services.settings, services)
    transport = _OverTheWire(app=app, raise_app_exceptions=raise_app_exceptions)
    sent = HEADERS if headers is None else headers
    async with (
        _broker_running(services),
        httpx.AsyncClient(transport=transport, base_url=BASE_URL, headers=sent) as client,
    ):
        yield client


@asynccontextmanager
async def _broker_running(services: Services) -> AsyncIterator[None]:
    """The services' broker listening (as the app's lifespan starts it), then stopped."""
    if services.broker is None:
        yield
        return
    await services.broker.start()
    try:
        yield
    finally:
        await services.broker.stop()


def request(
    services: Services,
    method: str,
    path: str,
    *,
    headers: Mapping[str, str] | None = None,
    **kwargs: Any,
) -> httpx.Response:
    """One request to `create_app(services)` on a fresh event loop (see `app_client`).

    `headers` replaces the controller token as `app_client`'s do; `kwargs` go to
    `httpx.AsyncClient.request` (`json=`, `content=`, `params=`, ...).
    """

    async def scenario() -> httpx.Response:
        async with app_client(services, headers=headers) as client:
            return await client.request(method, path, **kwargs)

    return asyncio.run(scenario())


def cli_report(response: httpx.Response) -> dict[str, Any]:
    """The fake CLI's JSON report of what its spawn received (from a 200 turn answer)."""
    assert response.status_code == 200, response.text
    report: dict[str, Any] = json.loads(response.json()["response"])
    return report


async def wait_until(condition: Callable[[], bool], timeout_s: float = 10.0) -> None:
    """Poll `condition` every 10 ms until it holds; fail after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            msg = f"condition not met within {timeout_s}s"
            raise AssertionError(msg)
        await asyncio.sleep(0.01)
