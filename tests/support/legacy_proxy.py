"""An agent server older than per-spawn overrides, played by a proxy in front of ours.

It forwards every request to a real agent-server but drops `auth_override` from turn
bodies (the old server ignored the field, so the turn runs on its own credential)
and `X-Trinity-Auth-Override` from every answer (the old server never said which
override it applied). That is how the controller tells such a server: no header.
"""

from __future__ import annotations

import json

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from tests.support.thread_server import ThreadServer

TURN_PATHS = ("/api/task", "/api/chat")
DROPPED_HEADERS = {"x-trinity-auth-override", "content-length", "transfer-encoding", "connection"}


class LegacyProxy(ThreadServer):
    """The proxy on a loopback port; `upstream` is the real server's base URL."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.forwarded_overrides = 0
        """How many turn bodies carried an override that was dropped."""
        app = Starlette(
            routes=[Route("/{path:path}", self._forward, methods=["GET", "POST", "PUT"])]
        )
        super().__init__(app, "legacy-proxy")

    async def _forward(self, request: Request) -> Response:
        body = await request.body()
        if request.url.path in TURN_PATHS and body:
            payload = json.loads(body)
            if payload.pop("auth_override", None) is not None:
                self.forwarded_overrides += 1
            body = json.dumps(payload).encode()
        headers = {
            k: v for k, v in request.headers.items() if k.lower() not in {"host", "content-length"}
        }
        async with httpx.AsyncClient(base_url=self.upstream, timeout=300) as client:
            answer = await client.request(
                request.method, request.url.path, content=body, headers=headers
            )
        kept = {k: v for k, v in answer.headers.items() if k.lower() not in DROPPED_HEADERS}
        return Response(answer.content, answer.status_code, headers=kept)
