"""A loopback upstream that records every request whole and answers as told, for the broker.

Unlike the Messages API stand-in it keeps each request as it arrived (method, raw path,
query, headers in order, body), so a test compares what the broker forwarded with what
the client sent, field by field. Its answer is programmable: a status, headers, and a
body sent in chunks, optionally holding back after the first chunk until `release()`.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from tests.support.thread_server import ThreadServer


@dataclass(frozen=True)
class Received:
    """One request as the upstream received it."""

    method: str
    path: str
    query: str
    headers: list[tuple[str, str]]
    body: bytes


@dataclass
class Answer:
    """What the upstream answers every request."""

    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    chunks: tuple[bytes, ...] = (b"ok",)
    hold_after_first: bool = False


class RecordingUpstream(ThreadServer):
    """The upstream: `answer` what to send (`by_credential` for some), `received` what came."""

    def __init__(self) -> None:
        self.answer = Answer()
        self.by_credential: dict[str, Answer] = {}
        """Answers for requests carrying a credential (`x-api-key`, or a bearer's value)."""
        self.received: list[Received] = []
        self._released = threading.Event()

        async def app(scope: Scope, receive: Receive, send: Send) -> None:
            await self._serve(scope, receive, send)

        super().__init__(app, "recording-upstream")

    def release(self) -> None:
        """Let a held answer send the rest of its chunks."""
        self._released.set()

    async def _serve(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        request = Request(scope, receive)
        body = await request.body()
        self.received.append(
            Received(
                request.method,
                scope["raw_path"].decode(),
                scope["query_string"].decode(),
                [(k.decode(), v.decode()) for k, v in scope["headers"]],
                body,
            )
        )
        credential = request.headers.get("x-api-key") or request.headers.get(
            "authorization", ""
        ).removeprefix("Bearer ")
        answer = self.by_credential.get(credential, self.answer)
        response: Response = StreamingResponse(
            self._chunks(answer), status_code=answer.status, headers=answer.headers
        )
        await response(scope, receive, send)

    async def _chunks(self, answer: Answer) -> AsyncIterator[bytes]:
        for index, chunk in enumerate(answer.chunks):
            yield chunk
            if index == 0 and answer.hold_after_first:
                for _ in range(1000):
                    if self._released.is_set():
                        break
                    await asyncio.sleep(0.01)
