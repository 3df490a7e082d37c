"""A client that leaves while its body is read ends its request quietly.

The server closes a connection whose body is too slow (contract §8), and a client may
simply go: either way the app reads `http.disconnect` where it expected body bytes.
Nobody is left to answer, and nothing went wrong, so no traceback, no ERROR line,
and no exception out of the app for uvicorn to log as "Exception in ASGI application".
"""

from __future__ import annotations

import asyncio
import logging

import pytest
from starlette.types import Message

from agent_server.app import create_app
from agent_server.services import Services
from tests.support.in_process import TOKEN, fake_cli_services


@pytest.fixture
def app_services(environ: dict[str, str]) -> Services:
    """Services of a Claude agent with a controller token."""
    return fake_cli_services(environ)


@pytest.mark.parametrize("path", ["/api/task", "/api/chat", "/api/credentials/reload-token"])
def test_a_disconnect_during_the_body_is_no_error(
    app_services: Services, path: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Half a body, then the disconnect: the app returns, and logs nothing over DEBUG."""
    app = create_app(app_services.settings, app_services)
    incoming: list[Message] = [
        {"type": "http.request", "body": b'{"mess', "more_body": True},
        {"type": "http.disconnect"},
    ]
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": b"",
        "headers": [
            (b"host", b"agent.test"),
            (b"x-trinity-agent-token", TOKEN.encode()),
            (b"content-type", b"application/json"),
            (b"content-length", b"100"),
        ],
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 8000),
    }

    async def receive() -> Message:
        return incoming.pop(0) if incoming else {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        """uvicorn drops what is sent on a closed connection; so does this."""

    with caplog.at_level(logging.DEBUG):
        asyncio.run(app(scope, receive, send))
    assert not incoming, "the app did not read up to the disconnect"
    noisy = [r for r in caplog.records if r.levelno > logging.DEBUG and r.name != "asyncio"]
    assert not noisy, [(r.name, r.getMessage()) for r in noisy]
    assert not [r for r in caplog.records if r.exc_info]
