"""The broker's forwarder: a CLI's request, with the real credential, to the chosen upstream.

A request must present a live placeholder (`x-api-key`, `x-goog-api-key`,
`Authorization: Bearer`, or a `key` query parameter); anything else is refused in the
API's own error shape and goes nowhere. The upstream request is the CLI's: the same
method, path, query, body and headers, but the credential (the grant's, in the
grant's header: `_credential_header`, the one place it is put in; a placeholder in
the query leaves it, as a URL is what proxies log) and the hop-by-hop headers. Its
answer streams back as it arrives, framing and all; the exchange is recorded as the
answer starts, and a refusal's body (its first bytes) is read into it before its end
reaches the CLI.
"""

from __future__ import annotations

import json
import logging
import time
import zlib
from datetime import UTC, datetime
from urllib.parse import unquote_to_bytes

import httptools

from agent_server.broker.dial import Origin
from agent_server.broker.exchange import ERROR_BODY_BYTES, Exchange, kept_headers
from agent_server.broker.grants import Grant, Grants, Rung
from agent_server.broker.inbound import CliConnection, Request
from agent_server.broker.pool import Pool
from agent_server.broker.upstream import AnswerHead, UpstreamConnection, UpstreamError
from agent_server.broker.verdict import verdict_of
from agent_server.wire.names import OutcomeKind

logger = logging.getLogger("agent_server.broker")

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
_NOT_RELAYED = _HOP_BY_HOP - {b"transfer-encoding"}
"""An answer's body is relayed framed as the upstream framed it, so its framing header stays."""


class Forwarder:
    """Answers each request of a CLI's connection (`inbound.Handler`)."""

    def __init__(
        self, grants: Grants, pool: Pool | None = None, max_request_bytes: int = MAX_REQUEST_BYTES
    ) -> None:
        self.grants = grants
        self.pool = pool or Pool()
        self.max_request_bytes = max_request_bytes

    def close(self) -> None:
        """Close the kept upstream connections."""
        self.pool.close()

    async def __call__(self, request: Request, cli: CliConnection) -> None:
        try:
            path, query = _target_of(request.target)
        except httptools.HttpParserInvalidURLError:
            _refuse(cli, 400, "invalid_request_error", "the request target is not a path")
            return
        placeholder = _query_placeholder(query)
        grant = self._grant_of(request.headers, placeholder)
        if grant is None:
            _refuse(cli, 401, "authentication_error", "not a credential of this server")
            return
        if request.body is None:
            _refuse(cli, 413, "request_too_large", "the request body is too large")
            return
        in_query = bool(placeholder) and self.grants.find(placeholder) is grant
        path += _without_placeholder(query, in_query)
        forwarded = [(k, v) for k, v in request.headers if _forwarded(k, v)]
        await self._forward(grant, request.method, path, forwarded, request.body, cli)

    async def _forward(
        self,
        grant: Grant,
        method: str,
        path: str,
        headers: list[tuple[bytes, bytes]],
        body: bytes,
        cli: CliConnection,
    ) -> None:
        """Send the request on the grant's rung in use, and on the next after a switchable
        refusal (the CLI never sees that refusal); relay the answer that ends it."""
        rungs = grant.rungs()
        index = grant.rung
        while True:
            rung = rungs[index]
            try:
                swapped = [*headers, _credential_header(rung)]
                origin = Origin.of(rung.upstream)
                route, connection, head = await self.pool.send(origin, method, path, swapped, body)
            except UpstreamError as failed:
                logger.warning("broker: the upstream could not be reached: %s", failed)
                grant.exchanges.add(Exchange(None, at=time.time(), rung=index))
                _refuse(cli, 502, "api_error", "the server could not reach the API")
                return
            exchange = Exchange(head.status, _kept(head), at=time.time(), rung=index)
            try:
                read = head.status in _SWITCHABLE and index + 1 < len(rungs)
                if read:
                    exchange.read_error_body(_decoded(await connection.read_refusal(), head))
                    if _switch(exchange):
                        grant.exchanges.add(exchange)
                        index = grant.rung = max(grant.rung, index + 1)
                        continue
                grant.exchanges.add(exchange)
                await _relay(connection, head, exchange, cli, read_already=read)
                return
            except UpstreamError as cut:
                logger.warning("broker: the upstream's answer was cut short: %s", cut)
                if all(kept is not exchange for kept in grant.exchanges.all()):
                    grant.exchanges.add(exchange)
                cli.abort()
                return
            finally:
                self.pool.release(route, connection)

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


def _credential_header(rung: Rung) -> tuple[bytes, bytes]:
    """The one place a real credential goes into a request: the rung's header."""
    secret = rung.secret.get_secret_value().encode("latin-1")
    if rung.header == "authorization":
        return b"authorization", b"Bearer " + secret
    return rung.header.encode(), secret


def _switch(exchange: Exchange) -> bool:
    """Whether a refusal is one another credential may not get: a rate limit, auth, billing."""
    kind = verdict_of(exchange, datetime.now(UTC)).kind
    return kind in (OutcomeKind.RATE_LIMIT, OutcomeKind.AUTH, OutcomeKind.BILLING)


async def _relay(
    connection: UpstreamConnection,
    head: AnswerHead,
    exchange: Exchange,
    cli: CliConnection,
    *,
    read_already: bool,
) -> None:
    """Stream the upstream's answer to the CLI as it arrives: its head, then its body's
    bytes as framed. A refusal's first bytes are read into `exchange` before its end
    reaches the CLI: the turn is never classified without them."""

    def before_end() -> None:
        if head.status >= 400 and not read_already:
            exchange.read_error_body(_decoded(bytes(connection.kept), head))

    lines = [b"HTTP/1.1 %d %s\r\n" % (head.status, head.reason)]
    lines += [k + b": " + v + b"\r\n" for k, v in head.headers if k.lower() not in _NOT_RELAYED]
    closes = connection.until_close
    if closes:
        lines.append(b"connection: close\r\n")
    cli.write(b"".join(lines) + b"\r\n")
    cli.feed_from(connection)
    await connection.relay(cli, before_end)
    if closes:
        cli.close()


def _forwarded(name: bytes, value: bytes) -> bool:
    """Whether a request header goes upstream as the CLI sent it. `Connection:
    keep-alive` does (the upstream connection is kept: it says the same of that hop)."""
    lowered = name.lower()
    if lowered == b"connection":
        return value.strip().lower() == b"keep-alive"
    return lowered not in _NOT_FORWARDED and lowered != b"expect"


def _target_of(target: bytes) -> tuple[str, bytes]:
    """The path and the query of a request target (origin or absolute form)."""
    url = httptools.parse_url(target)
    if not url.path or not url.path.startswith(b"/"):
        msg = "no path"
        raise httptools.HttpParserInvalidURLError(msg)
    return url.path.decode("latin-1"), url.query or b""


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


def _kept(head: AnswerHead) -> dict[str, str]:
    """The headers of the answer a verdict reads."""
    return kept_headers({k.decode("latin-1"): v.decode("latin-1") for k, v in head.headers})


def _decoded(body: bytes, head: AnswerHead) -> bytes:
    """A refusal's kept bytes as JSON text: gzip and deflate are undone, anything else
    is left (the verdict then goes by the status alone)."""
    encoding = next((v for k, v in head.headers if k.lower() == b"content-encoding"), b"")
    if encoding.strip().lower() in (b"gzip", b"deflate"):
        try:
            return zlib.decompressobj(wbits=47).decompress(body, ERROR_BODY_BYTES)
        except zlib.error:
            return b""
    return body


def _refuse(cli: CliConnection, status: int, error_type: str, message: str) -> None:
    """Answer in the Messages API's error shape (the CLI reports it as the API's)."""
    body = json.dumps({"type": "error", "error": {"type": error_type, "message": message}}).encode()
    cli.write(
        b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
        % (status, _REASONS.get(status, b"Error"), len(body), body)
    )


_REASONS = {
    400: b"Bad Request",
    401: b"Unauthorized",
    413: b"Content Too Large",
    502: b"Bad Gateway",
}
