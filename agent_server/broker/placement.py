"""Where a spawn's credential goes when the broker stands in for it (contract §4.8). Pure.

`placement` reads a built spawn environment (after the five layers and the route
rules): the credential Claude Code would authenticate with, and where it would send
it. It answers the grant the broker keeps (that credential, its header, that
upstream) and the environment the spawn gets instead: the same credential variable
holding a placeholder, every other Claude credential gone, and `ANTHROPIC_BASE_URL`
the broker's. Cloud providers the CLI signs for itself (Bedrock, Vertex, Foundry)
and a spawn with no credential of the server's stay outside the broker (None).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from pydantic import SecretStr

from agent_server.broker.grants import CredentialHeader, Grant, Rung
from agent_server.spawn_env.route import effective_credential
from agent_server.wire.names import (
    API_KEY,
    AUTH_TOKEN,
    BASE_URL,
    CLAUDE_CREDENTIALS,
    CLAUDE_OAUTH,
    PROVIDER_SWITCHES,
    Layer,
)
from agent_server.wire.turns import AuthOverride

DEFAULT_UPSTREAM = "https://api.anthropic.com"
"""Where Claude Code sends a credential when no base URL is set."""
_HEADERS: dict[str, tuple[CredentialHeader, str]] = {
    CLAUDE_OAUTH: ("authorization", "sk-ant-oat01-"),
    API_KEY: ("x-api-key", "sk-ant-api03-"),
    AUTH_TOKEN: ("authorization", ""),
}
"""Each credential variable: the header the CLI sends it in, and its placeholder's prefix."""
_NO_PROXY = ("NO_PROXY", "no_proxy")
_PROXIES = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy")


@dataclass(frozen=True)
class Placement:
    """One spawn's credential, held by the broker: the grant and the spawn's environment."""

    grant: Grant
    env: dict[str, str]
    placeholder: str


def placement(
    env: Mapping[str, str],
    sources: Mapping[str, Layer],
    broker_url: str,
    issue: Callable[[Grant, str], str],
) -> Placement | None:
    """The broker's placement of the credential in `env`, or None when it stays outside.

    `issue(grant, shape)` registers the grant and answers its placeholder.
    """
    credential = effective_credential(env, sources)
    if credential is None or credential.variable in PROVIDER_SWITCHES:
        return None
    header, shape = _HEADERS[credential.variable]
    upstream = (env.get(BASE_URL) or DEFAULT_UPSTREAM).rstrip("/")
    grant = Grant(header, SecretStr(env[credential.variable]), upstream)
    placeholder = issue(grant, shape)
    placed = {name: value for name, value in env.items() if name not in CLAUDE_CREDENTIALS}
    placed[credential.variable] = placeholder
    placed[BASE_URL] = broker_url
    if any(placed.get(name) for name in _PROXIES):
        # A proxy of the container's must not carry the placeholder to the broker's loopback.
        for name in _NO_PROXY:
            placed[name] = ",".join(filter(None, (placed.get(name), "127.0.0.1", "localhost")))
    return Placement(grant, placed, placeholder)


def rung_of(override: AuthOverride, upstream: str) -> Rung:
    """One `auth_ladder` entry as the broker sends it: a subscription token or a key to
    `upstream` (where the turn's own override goes), a provider to its own base URL."""
    if override.provider is not None:
        provider = override.provider
        return Rung("authorization", provider.auth_token, provider.base_url.rstrip("/"))
    if override.oauth_token is not None:
        return Rung("authorization", override.oauth_token, upstream)
    assert override.api_key is not None  # noqa: S101 - AuthOverride holds exactly one
    return Rung("x-api-key", override.api_key, upstream)
