"""The broker's forwarder: a CLI's request, with the real credential, to the chosen upstream.

A plain ASGI app, so nothing between the socket and the upstream costs more than it
must. A request must present a live placeholder (`x-api-key`, `x-goog-api-key`,
`Authorization: Bearer`, or a `key` query parameter); anything else is refused in the
API's own error shape and goes nowhere. The upstream request is the CLI's: the same
method, path, query, body and headers, but the credential (the grant's, in the
grant's header: a placeholder in the query leaves it, as a URL is what proxies log)
and the hop-by-hop headers.
Its answer streams back as it arrives; the exchange is recorded as the answer starts,
and a refusal's body (its first bytes) before its end reaches the CLI.
"""

from __future__ import annotations

import json
import logging
import time
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote_to_bytes

from agent_server.broker.exchange import ERROR_BODY_BYTES, Exchange, kept_headers
from agent_server.broker.grants import Grant, Grants, Rung
from agent_server.broker.verdict import verdict_of
from agent_server.wire.names import OutcomeKind

if TYPE_CHECKING:
    import httpx

logger = logging.getLogger("agent_server.broker")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

MAX_REQUEST_BYTES = 64 * 1024 * 1024
"""A request body the broker takes: a long conversation with images, and far below memory."""
_HOP_BY_HOP = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-authenticate",
        b"proxy-authorization",
        b"proxy-connection",
        b"te",
        b"trailer",
        b"transfer-encoding",
        b"upgrade",
    }
)
_SWITCHABLE = frozenset({400, 401, 402, 403, 429})
"""Statuses of a refusal another rung may fix (a 400 only about the credit balance)."""
_KEY_HEADERS = (b"x-api-key", b"x-goog-api-key")
_NOT_FORWARDED = _HOP_BY_HOP | {b"host", b"content-length", b"authorization", *_KEY_HEADERS}


class Forwarder:
    """The ASGI app of the broker (HTTP only; it has no lifespan of its own)."""

    def __init__(
        self,
        grants: Grants,
        client: Callable[[], httpx.AsyncClient],
        max_request_bytes: int = MAX_REQUEST_BYTES,
    ) -> None:
        self.grants = grants
        self._make_client = client
        self._client: httpx.AsyncClient | None = None
        self.max_request_bytes = max_request_bytes

    @property
    def client(self) -> httpx.AsyncClient:
        """The upstream client, made at the first request: its TLS trust store costs an
        idle server about 2 MiB it need not hold before any turn."""
        if self._client is None:
            self._client = self._make_client()
        return self._client

    async def aclose(self) -> None:
        """Close the upstream client, if one was made."""
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        headers: list[tuple[bytes, bytes]] = scope["headers"]
        query = _query_placeholder(scope["query_string"])
        grant = self._grant_of(headers, query)
        if grant is None:
            await _refuse(send, 401, "authentication_error", "not a credential of this server")
            return
        body = await _read_body(receive, self.max_request_bytes)
        if body is None:
            await _refuse(send, 413, "request_too_large", "the request body is too large")
            return
        in_query = bool(query) and self.grants.find(query) is grant
        path = scope["raw_path"].decode("latin-1")
        path += _without_placeholder(scope["query_string"], in_query)
        forwarded = [(k, v) for k, v in headers if _forwarded(k, v)]
        rungs = grant.rungs()
        index = grant.rung
        while True:
            rung = rungs[index]
            response = await self._send(scope["method"], rung, path, forwarded, body)
            if response is None:
                grant.exchanges.add(Exchange(None, at=time.time(), rung=index))
                await _refuse(send, 502, "api_error", "the server could not reach the API")
                return
            try:
                exchange = Exchange(
                    response.status_code, kept_headers(response.headers), at=time.time(), rung=index
                )
                chunks = response.aiter_raw()
                head = b""
                if response.status_code in _SWITCHABLE and index + 1 < len(rungs):
                    head = await _error_head(response, chunks, exchange)
                    if _switch(exchange):
                        # The CLI never sees this refusal: the same request goes on the next rung.
                        grant.exchanges.add(exchange)
                        index = grant.rung = max(grant.rung, index + 1)
                        continue
                grant.exchanges.add(exchange)
                await _relay(response, exchange, head, chunks, send)
                return
            finally:
                await response.aclose()

    async def _send(
        self,
        method: str,
        rung: Rung,
        path: str,
        headers: list[tuple[bytes, bytes]],
        body: bytes,
    ) -> httpx.Response | None:
        """Send the request on `rung`; its answer, streaming, or None when none came."""
        import httpx  # imported at the first request, not at boot (see upstream_client)

        headers = [*headers, _credential_header(rung)]
        request = httpx.Request(method, rung.upstream + path, headers=headers, content=body)
        try:
            return await self.client.send(request, stream=True)
        except httpx.HTTPError as failed:
            logger.warning("broker: the upstream could not be reached: %s", type(failed).__name__)
            return None

    def _grant_of(self, headers: list[tuple[bytes, bytes]], query: str) -> Grant | None:
        """The grant of the placeholder the request presents, in a credential header or
        the `key` query parameter."""
        if query and (grant := self.grants.find(query)) is not None:
            return grant
        for name, value in headers:
            lowered = name.lower()
            if lowered in _KEY_HEADERS:
                presented = value
            elif lowered == b"authorization" and value[:7].lower() == b"bearer ":
                presented = value[7:].strip()
            else:
                continue
            grant = self.grants.find(presented.decode("latin-1"))
            if grant is not None:
                return grant
        return None


async def _error_head(
    response: httpx.Response, chunks: AsyncIterator[bytes], exchange: Exchange
) -> bytes:
    """Read a refusal's first bytes (its whole body, as the API's are small) into
    `exchange` before anything reaches the CLI: the refusal may yet be switched."""
    head = bytearray()
    async for chunk in chunks:
        head += chunk
        if len(head) >= ERROR_BODY_BYTES:
            break
    exchange.read_error_body(_decoded(bytes(head), response.headers.get("content-encoding")))
    return bytes(head)


def _switch(exchange: Exchange) -> bool:
    """Whether a refusal is one another credential may not get: a rate limit, auth, billing."""
    kind = verdict_of(exchange, datetime.now(UTC)).kind
    return kind in (OutcomeKind.RATE_LIMIT, OutcomeKind.AUTH, OutcomeKind.BILLING)


async def _relay(
    response: httpx.Response,
    exchange: Exchange,
    head: bytes,
    chunks: AsyncIterator[bytes],
    send: Send,
) -> None:
    """Stream the upstream's answer to the CLI: `head` (already read), then the rest."""
    await send(
        {
            "type": "http.response.start",
            "status": response.status_code,
            "headers": [(k, v) for k, v in response.headers.raw if k.lower() not in _HOP_BY_HOP],
        }
    )
    if head:
        await send({"type": "http.response.body", "body": head, "more_body": True})
    kept = bytearray() if response.status_code >= 400 and not head else None
    async for chunk in chunks:
        if kept is not None and len(kept) < ERROR_BODY_BYTES:
            kept += chunk[: ERROR_BODY_BYTES - len(kept)]
        await send({"type": "http.response.body", "body": chunk, "more_body": True})
    if kept is not None:
        # Before the body ends for the CLI: its turn is never classified without it.
        exchange.read_error_body(_decoded(bytes(kept), response.headers.get("content-encoding")))
    await send({"type": "http.response.body", "body": b"", "more_body": False})


def _forwarded(name: bytes, value: bytes) -> bool:
    """Whether a request header goes upstream as the CLI sent it. `Connection:
    keep-alive` does (the upstream connection is pooled: it says the same of that hop)."""
    lowered = name.lower()
    if lowered == b"connection":
        return value.strip().lower() == b"keep-alive"
    return lowered not in _NOT_FORWARDED


def _credential_header(rung: Rung) -> tuple[bytes, bytes]:
    secret = rung.secret.get_secret_value().encode("latin-1")
    if rung.header == "authorization":
        return b"authorization", b"Bearer " + secret
    return rung.header.encode(), secret


def _query_placeholder(query: bytes) -> str:
    """The value of the request's `key` query parameter ('' without one)."""
    for pair in query.split(b"&"):
        name, _, value = pair.partition(b"=")
        if name == b"key":
            return unquote_to_bytes(value).decode("latin-1")
    return ""


def _without_placeholder(query: bytes, in_query: bool) -> str:
    """`?<query>` as the upstream gets it ('' for none): without the `key` parameter when
    the request presented its placeholder there (the credential goes in the grant's header)."""
    if in_query:
        query = b"&".join(p for p in query.split(b"&") if p.partition(b"=")[0] != b"key")
    return "?" + query.decode("latin-1") if query else ""


async def _read_body(receive: Receive, limit: int) -> bytes | None:
    """The whole request body; None past `limit` bytes (the rest is not read) or when the
    client left before it ended (half a request goes nowhere)."""
    body = bytearray()
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        body += message.get("body", b"")
        if len(body) > limit:
            return None
        if not message.get("more_body", False):
            return bytes(body)


def _decoded(body: bytes, encoding: str | None) -> bytes:
    """A refusal's kept bytes as JSON text: gzip and deflate are undone, anything else
    is left (the verdict then goes by the status alone)."""
    if encoding in ("gzip", "deflate"):
        try:
            return zlib.decompressobj(wbits=47).decompress(body, ERROR_BODY_BYTES)
        except zlib.error:
            return b""
    return body


async def _refuse(send: Send, status: int, error_type: str, message: str) -> None:
    """Answer in the Messages API's error shape (the CLI reports it as the API's)."""
    body = json.dumps({"type": "error", "error": {"type": error_type, "message": message}}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
