"""Where a spawn's credential goes when the broker stands in for it (contract §4.8). Pure.

`placement` reads a built spawn environment (after the five layers and the route
rules): the credential the CLI would authenticate with, and where it would send it.
It answers the grant the broker keeps (that credential, its header, that upstream)
and the environment the spawn gets instead: the same credential variable holding a
placeholder, every other credential of that API gone, and the API's base URL
variable the broker's. Claude Code's credentials follow its own precedence and
gateway rules (`spawn_env.route`); OpenAI's and Gemini's are one API key each
(`names.KEY_APIS`). Cloud providers the CLI signs for itself (Bedrock, Vertex,
Foundry, a Google login) and a spawn with no credential of the server's stay
outside the broker (None).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from pydantic import SecretStr

from agent_server.broker.grants import Grant, Rung
from agent_server.broker.providers import PROVIDERS, CredentialHeader
from agent_server.spawn_env.route import effective_credential
from agent_server.wire.names import (
    API_KEY,
    AUTH_TOKEN,
    BASE_URL,
    CLAUDE_CREDENTIALS,
    CLAUDE_OAUTH,
    KEY_APIS,
    PROVIDER_SWITCHES,
    Api,
    ApiNames,
    Layer,
)
from agent_server.wire.turns import AuthOverride

DEFAULT_UPSTREAM = PROVIDERS["anthropic"].upstream
"""Where Claude Code sends a credential when no base URL is set."""
_TRUTHY = ("1", "true", "yes", "on")
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
    api: Api = "anthropic",
) -> Placement | None:
    """The broker's placement of the credential in `env`, or None when it stays outside.

    `issue(grant, shape)` registers the grant and answers its placeholder.
    """
    if api != "anthropic":
        return _key_placement(env, sources, broker_url, issue, api)
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
    return Placement(grant, _around_proxies(placed), placeholder)


def _key_placement(
    env: Mapping[str, str],
    sources: Mapping[str, Layer],
    broker_url: str,
    issue: Callable[[Grant, str], str],
    api: Api,
) -> Placement | None:
    """The placement of a CLI that authenticates with one API key (OpenAI's, Gemini's)."""
    names, provider = KEY_APIS[api], PROVIDERS[api]
    if any(env.get(name, "").lower() in _TRUTHY for name in names.switches):
        return None
    variable = next((name for name in names.keys if env.get(name)), None)
    if variable is None:
        return None
    upstream = (_upstream(env, sources, names, variable) or provider.upstream).rstrip("/")
    grant = Grant(provider.key_header, SecretStr(env[variable]), upstream)
    placeholder = issue(grant, provider.key_shape)
    placed = {name: value for name, value in env.items() if name not in names.keys}
    # Under the variable the CLI reads first (Codex's brokered provider reads only it).
    placed[names.keys[0]] = placeholder
    placed[names.base_url] = broker_url
    return Placement(grant, _around_proxies(placed), placeholder)


def _upstream(
    env: Mapping[str, str], sources: Mapping[str, Layer], names: ApiNames, variable: str
) -> str | None:
    """The base URL the key goes to: the spawn's, unless `.env` (the agent's) set it for a
    key that is not `.env`'s own (the route rule of §4.6, for a key-only API)."""
    base = env.get(names.base_url)
    if not base:
        return None
    if sources.get(names.base_url) == "env_file" and sources.get(variable) != "env_file":
        return None
    return base


def _around_proxies(placed: dict[str, str]) -> dict[str, str]:
    """A proxy of the container's must not carry the placeholder to the broker's loopback."""
    if any(placed.get(name) for name in _PROXIES):
        for name in _NO_PROXY:
            placed[name] = ",".join(filter(None, (placed.get(name), "127.0.0.1", "localhost")))
    return placed


def rung_of(override: AuthOverride, upstream: str, api: Api = "anthropic") -> Rung:
    """One `auth_ladder` entry as the broker sends it: a subscription token or a key to
    `upstream` (where the turn's own override goes), a provider to its own base URL."""
    provider = PROVIDERS[api]
    if override.provider is not None:
        gateway = override.provider
        return Rung(provider.gateway_header, gateway.auth_token, gateway.base_url.rstrip("/"))
    if override.oauth_token is not None:
        return Rung("authorization", override.oauth_token, upstream)
    assert override.api_key is not None  # noqa: S101 - AuthOverride holds exactly one
    return Rung(provider.key_header, override.api_key, upstream)
