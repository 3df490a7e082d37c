"""Placeholders: the only credential a spawn holds (contract §4.8).

Each turn's spawn gets a placeholder in place of its credential: random, known only
to this server, valid while its turn runs, revoked when the turn ends. The broker
takes a request's placeholder to its `Grant`: the real credential the controller
chose for that turn, the header it travels in, and the upstream it goes to. A
placeholder outside the broker, or after its turn, is a string of random letters.

The placeholder keeps the shape of the credential it stands for (an OAuth token's
prefix for a subscription, an API key's for a key), and the spawn gets it under the
same variable, so the CLI stays in the same credential mode: Claude Code's betas
and default model differ by mode.
"""

from __future__ import annotations

import secrets
import threading
from dataclasses import dataclass, field

from pydantic import SecretStr

from agent_server.broker.exchange import TurnExchanges
from agent_server.broker.providers import CredentialHeader

PLACEHOLDER_PREFIX = "agent-server-placeholder-"
"""Every placeholder holds this, so a log or a test tells one from a credential."""


@dataclass(frozen=True)
class Rung:
    """One credential of a turn's ladder: its secret, its header, its upstream."""

    header: CredentialHeader
    secret: SecretStr
    upstream: str
    """The base URL its requests go to (no trailing slash): the API, or a gateway."""


@dataclass
class Grant:
    """What one turn's placeholder stands for in the broker: the turn's credential, and
    the ladder of more credentials after it (contract §6.2, `auth_ladder`)."""

    header: CredentialHeader
    secret: SecretStr
    upstream: str
    """The base URL its requests go to (no trailing slash): the API, or a gateway."""
    exchanges: TurnExchanges = field(default_factory=TurnExchanges)
    ladder: tuple[Rung, ...] = ()
    """The credentials to use, in order, after a switchable refusal of the one in use."""
    rung: int = 0
    """The rung in use now (0: the turn's own); only the broker's thread moves it."""

    def rungs(self) -> tuple[Rung, ...]:
        """Every credential of the turn, its own first."""
        return (Rung(self.header, self.secret, self.upstream), *self.ladder)


class Grants:
    """The placeholders of the turns running now (thread-safe: a lookup is one dict read)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._grants: dict[str, Grant] = {}

    def issue(self, grant: Grant, shape: str = "") -> str:
        """A new placeholder for `grant`, starting with `shape` (a credential's prefix)."""
        placeholder = f"{shape}{PLACEHOLDER_PREFIX}{secrets.token_urlsafe(32)}"
        with self._lock:
            self._grants[placeholder] = grant
        return placeholder

    def find(self, placeholder: str) -> Grant | None:
        """The grant of a live placeholder, or None (unknown, or its turn has ended)."""
        return self._grants.get(placeholder)

    def revoke(self, placeholder: str) -> None:
        """End a placeholder: the broker refuses it from now on."""
        with self._lock:
            self._grants.pop(placeholder, None)

    def __len__(self) -> int:
        return len(self._grants)
