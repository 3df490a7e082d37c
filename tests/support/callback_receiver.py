"""A loopback stand-in for the controller's result-callback endpoint (contract §6.8).

It serves `POST /api/agents/{agent}/executions/{execution_id}/result` the way
Trinity's backend does (403 for a wrong bearer, 200 `{ok, replayed}`), and can be told
to fail first: answer some statuses (with headers such as `Retry-After`) before it
accepts, or hang. Every request is recorded, credentials only as fingerprints. Given
the agent's controller token, it checks each request's `X-Agent-Server-Signature` as
a controller would (written here from the contract, not borrowed from the server).

    with CallbackReceiver(key="k") as receiver:
        receiver.fail_next(503, 503, headers={"Retry-After": "1"})
        ...  # start a server with TRINITY_BACKEND_URL=receiver.base_url
        (delivery,) = receiver.wait_for_accepted(1)
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
import hmac
import json
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from tests.support.fake_cli import fingerprint
from tests.support.thread_server import ThreadServer


@dataclass(frozen=True)
class Delivery:
    """One callback request as received."""

    agent: str
    execution_id: str
    body: dict[str, Any]
    bearer_fp: str | None
    status: int
    """What the receiver answered."""
    replayed: bool
    """A 200 for an id it had accepted before."""
    signed: bool | None = None
    """The signature checked out (None: no signature, or no token to check it with)."""
    received_at: float = field(default_factory=time.monotonic)


class CallbackReceiver(ThreadServer):
    """The callback endpoint in a uvicorn thread on 127.0.0.1."""

    def __init__(self, key: str, controller_token: str | None = None) -> None:
        self.key = key
        self.controller_token = controller_token
        self._lock = threading.Lock()
        self._deliveries: list[Delivery] = []
        self._failures: collections.deque[tuple[int, dict[str, str]]] = collections.deque()
        self._hang_s = 0.0
        self._accepted_ids: set[str] = set()
        app = Starlette(
            routes=[
                Route(
                    "/api/agents/{agent}/executions/{execution_id}/result",
                    self._result,
                    methods=["POST"],
                )
            ]
        )
        super().__init__(app, "callbacks")

    def environ(self) -> dict[str, str]:
        """The server settings that send its callbacks here, with this receiver's key."""
        return {"TRINITY_BACKEND_URL": self.base_url, "TRINITY_MCP_API_KEY": self.key}

    def fail_next(self, *statuses: int, headers: Mapping[str, str] | None = None) -> None:
        """Answer the next requests with these statuses (and headers), in order."""
        with self._lock:
            self._failures.extend((status, dict(headers or {})) for status in statuses)

    def recover(self) -> None:
        """Forget the failures still planned: accept from now on."""
        with self._lock:
            self._failures.clear()

    def hang(self, seconds: float) -> None:
        """Hold every request this long before answering (0: answer at once)."""
        self._hang_s = seconds

    @property
    def deliveries(self) -> list[Delivery]:
        """Every request so far, oldest first."""
        with self._lock:
            return list(self._deliveries)

    def accepted(self) -> list[Delivery]:
        """The requests answered 2xx the first time for their id (not replays)."""
        return [d for d in self.deliveries if d.status == 200 and not d.replayed]

    def wait_for(self, count: int, timeout: float = 30.0, *, status: int = 200) -> list[Delivery]:
        """Block until `count` requests were answered `status`; return them."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            answered = [d for d in self.deliveries if d.status == status]
            if len(answered) >= count:
                return answered
            time.sleep(0.02)
        msg = f"{len(self.deliveries)} callbacks arrived; wanted {count} answered {status}"
        raise TimeoutError(msg)

    def wait_for_id(self, execution_id: str, timeout: float = 30.0) -> Delivery:
        """Block until the result of `execution_id` was accepted (200); return it."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for delivery in self.deliveries:
                if delivery.execution_id == execution_id and delivery.status == 200:
                    return delivery
            time.sleep(0.02)
        msg = f"no accepted callback for {execution_id} within {timeout}s"
        raise TimeoutError(msg)

    def _signed(self, header: str | None, body: bytes) -> bool | None:
        """`t=<unix time>,v1=<hex>`: HMAC-SHA256 of `<t>.<body>` under HMAC-SHA256 of the
        label `agent-server callback signature v1` keyed with the controller token."""
        if header is None or self.controller_token is None:
            return None
        fields = dict(part.split("=", 1) for part in header.split(",") if "=" in part)
        label = b"agent-server callback signature v1"
        key = hmac.new(self.controller_token.encode(), label, hashlib.sha256).digest()
        expected = hmac.new(key, fields.get("t", "").encode() + b"." + body, hashlib.sha256)
        return hmac.compare_digest(expected.hexdigest(), fields.get("v1", ""))

    async def _result(self, request: Request) -> Response:
        authorization = request.headers.get("authorization", "")
        bearer = authorization[7:] if authorization.startswith("Bearer ") else None
        fp = fingerprint(bearer) if bearer else None
        raw = await request.body()
        signed = self._signed(request.headers.get("x-agent-server-signature"), raw)
        try:
            body = json.loads(raw)
        except ValueError:
            body = {}
        if self._hang_s:
            await asyncio.sleep(self._hang_s)
        execution_id = request.path_params["execution_id"]
        with self._lock:
            if bearer != self.key:
                status, headers = 403, {}
            elif self._failures:
                status, headers = self._failures.popleft()
            else:
                status, headers = 200, {}
            replayed = status == 200 and execution_id in self._accepted_ids
            if status == 200:
                self._accepted_ids.add(execution_id)
            self._deliveries.append(
                Delivery(
                    request.path_params["agent"],
                    execution_id,
                    body if isinstance(body, dict) else {},
                    fp,
                    status,
                    replayed,
                    signed,
                )
            )
        if status == 200:
            return JSONResponse({"ok": True, "replayed": replayed})
        return JSONResponse({"detail": f"refused {status}"}, status, headers=headers)
