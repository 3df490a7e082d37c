"""The per-spawn layer of one turn: its execution id and its `auth_override` (contract §6).

Pure: the override becomes values for exactly one spawn plus the names that spawn
drops last, so nothing the baseline, `.env` or a reload carries can shadow it. A
Claude credential goes under Claude Code's names; an API key (or a provider's token
and base URL) for a key-only API under that API's (`names.KEY_APIS`).
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import SecretStr

from agent_server.spawn_env.layers import PerSpawn
from agent_server.wire.names import (
    API_KEY,
    AUTH_TOKEN,
    BASE_URL,
    CLAUDE_OAUTH,
    EXECUTION_ID,
    KEY_APIS,
    PROVIDER_SWITCHES,
    SUBSCRIPTION_SHADOW_KEYS,
    Api,
    AuthRoute,
)
from agent_server.wire.turns import AuthOverride


@dataclass(frozen=True)
class SpawnCredential:
    """What one turn's override does to its spawn."""

    layer: PerSpawn
    auth_route: AuthRoute
    model: str | None = None
    """The model the provider override imposes, if any."""

    def secrets(self) -> list[SecretStr]:
        """The secret values staged for this spawn (for the redactor)."""
        return [v for v in self.layer.values.values() if isinstance(v, SecretStr)]


def spawn_credential(
    execution_id: str, override: AuthOverride | None, api: Api = "anthropic"
) -> SpawnCredential:
    """The per-spawn layer for `override` to a CLI of `api` (None: the baseline serves)."""
    values: dict[str, SecretStr | str] = {EXECUTION_ID: execution_id}
    if override is None:
        return SpawnCredential(PerSpawn(values), "baseline")
    if api != "anthropic":
        return _key_credential(values, override, api)
    if override.oauth_token is not None:
        values[CLAUDE_OAUTH] = override.oauth_token
        drop = frozenset(SUBSCRIPTION_SHADOW_KEYS)
        return SpawnCredential(PerSpawn(values, drop), "oauth_token")
    if override.api_key is not None:
        values[API_KEY] = override.api_key
        drop = frozenset({CLAUDE_OAUTH, AUTH_TOKEN, *PROVIDER_SWITCHES})
        return SpawnCredential(PerSpawn(values, drop), "api_key")
    provider = override.provider
    assert provider is not None  # noqa: S101 - AuthOverride holds exactly one
    values[BASE_URL] = provider.base_url
    values[AUTH_TOKEN] = provider.auth_token
    drop = frozenset({API_KEY, CLAUDE_OAUTH, *PROVIDER_SWITCHES})
    return SpawnCredential(PerSpawn(values, drop), "provider", provider.model)


def _key_credential(
    values: dict[str, SecretStr | str], override: AuthOverride, api: Api
) -> SpawnCredential:
    """A key-only API's override: the key (a provider's token) under the variable the CLI
    reads first, a provider's URL as its base; every other key and switch of it dropped."""
    names = KEY_APIS[api]
    drop = frozenset({*names.keys[1:], *names.switches})
    provider = override.provider
    if provider is None:
        values[names.keys[0]] = override.secret
        return SpawnCredential(PerSpawn(values, drop), override.kind)
    values[names.keys[0]] = provider.auth_token
    values[names.base_url] = provider.base_url
    return SpawnCredential(PerSpawn(values, drop), "provider", provider.model)
