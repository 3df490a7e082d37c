"""The credential broker: between every CLI and its API (contract §4.8, §7).

    spawn env -> placement (placeholder in, the broker's URL as the API's)
        -> CLI -> Forwarder (placeholder out, the grant's credential in) -> upstream
        -> Exchange (status, rate-limit headers, the API's error) -> verdict

`Broker` is the front door: `lease` places one spawn's credential for as long as its
turn runs (the placeholder is revoked at the lease's end) and hands back the turn's
exchanges, from which the turn's outcome for its credential and its headroom come.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager

from agent_server.broker.exchange import Exchange, TurnExchanges
from agent_server.broker.forward import MAX_REQUEST_BYTES, Forwarder
from agent_server.broker.grants import Grant, Grants
from agent_server.broker.placement import Placement, placement
from agent_server.broker.server import BrokerServer
from agent_server.broker.verdict import ExchangeVerdict, rate_limit_info, verdict_of
from agent_server.wire.names import Api, Layer

__all__ = [
    "Broker",
    "Exchange",
    "ExchangeVerdict",
    "Grant",
    "Placement",
    "TurnExchanges",
    "rate_limit_info",
    "verdict_of",
]


class Broker:
    """The server's one broker: its grants, its forwarder and its loopback listener."""

    def __init__(self, max_request_bytes: int = MAX_REQUEST_BYTES) -> None:
        self.grants = Grants()
        self.server = BrokerServer(Forwarder(self.grants, max_request_bytes=max_request_bytes))

    @property
    def url(self) -> str:
        """The broker's base URL ('' until it started)."""
        return self.server.url

    async def start(self) -> str:
        """Start listening on loopback; return the base URL."""
        return await self.server.start()

    async def stop(self) -> None:
        """Stop listening; every placeholder is refused from now on."""
        await self.server.stop()

    @contextmanager
    def lease(
        self, env: Mapping[str, str], sources: Mapping[str, Layer], api: Api = "anthropic"
    ) -> Iterator[Placement | None]:
        """Place the credential of one spawn's `env` (a CLI of `api`) for the lease's length
        (None: it stays outside the broker, see `placement`); the placeholder is revoked
        at its end."""
        if not self.url:
            msg = "the broker has not started"
            raise RuntimeError(msg)
        placed = placement(env, sources, self.url, self.grants.issue, api)
        try:
            yield placed
        finally:
            if placed is not None:
                self.grants.revoke(placed.placeholder)
