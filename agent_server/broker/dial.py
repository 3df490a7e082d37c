"""How the broker reaches an upstream: direct, over verified TLS, or through the server's proxy.

TLS is verified as httpx verifies it (`httpx.create_ssl_context`: certifi's bundle, or
`SSL_CERT_FILE` / `SSL_CERT_DIR` from the server's environment); the context is made
at the first TLS connection, so an idle server holds no trust store. A proxy comes
from the server's environment as Python's urllib reads it (`HTTPS_PROXY`,
`HTTP_PROXY`, `ALL_PROXY`, `NO_PROXY`): an https upstream through a `CONNECT` tunnel,
a plain one in absolute form, as httpx did with `trust_env`. A SOCKS proxy is refused.
"""

from __future__ import annotations

import asyncio
import base64
import ssl
import urllib.request
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

from agent_server.broker.upstream import UpstreamConnection, UpstreamError

CONNECT_TIMEOUT_S = 30.0
_DEFAULT_PORTS = {"http": 80, "https": 443}


@dataclass(frozen=True)
class Origin:
    """Where an upstream's requests go: scheme, host and port, and its base path."""

    scheme: str
    host: str
    port: int
    prefix: str = ""
    """The base URL's path (a gateway's), before every request's path."""

    @classmethod
    def of(cls, url: str) -> Origin:
        """The origin of a base URL (`https://api.anthropic.com`, `http://gw:8080/v1`)."""
        parts = urlsplit(url)
        scheme = parts.scheme.lower()
        if scheme not in _DEFAULT_PORTS or not parts.hostname:
            msg = f"not an http(s) URL: {scheme}://"
            raise UpstreamError(msg)
        try:
            port = parts.port or _DEFAULT_PORTS[scheme]
            host = parts.hostname.encode("idna").decode("ascii")
        except (ValueError, UnicodeError) as bad:
            msg = "not a valid host or port"
            raise UpstreamError(msg) from bad
        return cls(scheme, host, port, parts.path.rstrip("/"))

    @property
    def netloc(self) -> str:
        """The `Host` header's value: the port only when it is not the scheme's own."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return host if _DEFAULT_PORTS[self.scheme] == self.port else f"{host}:{self.port}"


@dataclass(frozen=True)
class Route:
    """How one origin's requests travel: `proxy` None for direct."""

    origin: Origin
    proxy: Origin | None = None
    proxy_authorization: bytes = b""

    @property
    def absolute(self) -> bool:
        """A plain-HTTP upstream through a proxy: requests name the whole URL."""
        return self.proxy is not None and self.origin.scheme == "http"


class Dialer:
    """Opens connections to upstreams; holds the TLS context once one was needed."""

    def __init__(self) -> None:
        self._tls: ssl.SSLContext | None = None

    def route(self, origin: Origin) -> Route:
        """The route to `origin` the server's environment names (read at each dial)."""
        proxies = urllib.request.getproxies_environment()
        url = proxies.get(origin.scheme) or proxies.get("all")
        if not url or urllib.request.proxy_bypass_environment(origin.host, proxies):  # type: ignore[attr-defined]
            return Route(origin)
        url = url if "://" in url else f"http://{url}"
        parts = urlsplit(url)
        authorization = b""
        if parts.username is not None:
            user = f"{unquote(parts.username)}:{unquote(parts.password or '')}"
            authorization = b"Basic " + base64.b64encode(user.encode())
        proxy = Origin.of(url)
        return Route(origin, proxy, authorization)

    async def dial(self, route: Route) -> UpstreamConnection:
        """A new connection along `route` (an `UpstreamError` when none could be made)."""
        try:
            return await asyncio.wait_for(self._open(route), CONNECT_TIMEOUT_S)
        except UpstreamError:
            raise
        except (
            OSError,
            TimeoutError,
            asyncio.IncompleteReadError,
            asyncio.LimitOverrunError,
        ) as failed:
            msg = f"could not connect: {type(failed).__name__}"
            raise UpstreamError(msg) from failed

    def tls(self) -> ssl.SSLContext:
        """The verified client context, as httpx makes it with `trust_env`."""
        if self._tls is None:
            import httpx  # only for its trust store's choice, at the first TLS connection

            self._tls = httpx.create_ssl_context(trust_env=True)
        return self._tls

    async def _open(self, route: Route) -> UpstreamConnection:
        loop = asyncio.get_running_loop()
        origin, proxy = route.origin, route.proxy
        if proxy is None or route.absolute:
            target = proxy or origin
            tls = self.tls() if target.scheme == "https" else None
            _, protocol = await loop.create_connection(
                UpstreamConnection, target.host, target.port, ssl=tls
            )
            return protocol
        return await self._tunnel(route, proxy)

    async def _tunnel(self, route: Route, proxy: Origin) -> UpstreamConnection:
        """An https upstream through the proxy: `CONNECT`, then TLS inside the tunnel."""
        origin = route.origin
        tls = self.tls()
        reader, writer = await asyncio.open_connection(
            proxy.host, proxy.port, ssl=tls if proxy.scheme == "https" else None
        )
        try:
            authority = f"{origin.host}:{origin.port}".encode()
            head = b"CONNECT %s HTTP/1.1\r\nHost: %s\r\n" % (authority, authority)
            if route.proxy_authorization:
                head += b"Proxy-Authorization: " + route.proxy_authorization + b"\r\n"
            writer.write(head + b"\r\n")
            answer = await reader.readuntil(b"\r\n\r\n")
            status = answer.split(b" ", 2)[1] if answer.count(b" ") >= 1 else b""
            if not status.startswith(b"2"):
                msg = f"the proxy refused the tunnel: {status.decode('latin-1')[:3]}"
                raise UpstreamError(msg)
            loop = asyncio.get_running_loop()
            transport = writer.transport
            inner = await loop.start_tls(
                transport, transport.get_protocol(), tls, server_hostname=origin.host
            )
        except BaseException:
            writer.transport.abort()
            raise
        assert inner is not None  # noqa: S101 - start_tls answers a transport or raises
        protocol = UpstreamConnection()
        inner.set_protocol(protocol)
        protocol.connection_made(inner)
        return protocol
