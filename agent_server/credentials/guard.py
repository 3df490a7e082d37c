"""The boot guards: no stale key may shadow the subscription or the gateway (contract §4.3).

Both are pure: they read the boot-time baseline and return credential overrides.
"""

from __future__ import annotations

from collections.abc import Mapping

from pydantic import SecretStr

from agent_server.wire.names import (
    API_KEY,
    AUTH_TOKEN,
    BASE_URL,
    CLAUDE_OAUTH,
    SUBSCRIPTION_SHADOW_KEYS,
)


def arm_subscription_auth_guard(
    claude_credentials: bool, baseline: Mapping[str, str], override_token: SecretStr | None
) -> dict[str, SecretStr | None]:
    """Force-unset every shadow key when the baseline or override file carries an OAuth token.

    `claude_credentials` says whether the runtime authenticates with Claude
    credentials at all (a Codex or Gemini agent keeps its keys). Inert too for an
    empty or absent token (terminal login, a platform-key agent), and for a token
    that only `.env` carries (operator-managed): `.env` is not an input here, by design.
    """
    if not claude_credentials:
        return {}
    token = override_token.get_secret_value() if override_token is not None else ""
    if not token.strip():
        token = baseline.get(CLAUDE_OAUTH, "")
    if not token.strip():
        return {}
    return dict.fromkeys(SUBSCRIPTION_SHADOW_KEYS)


def pin_provider(
    claude_credentials: bool, baseline: Mapping[str, str]
) -> dict[str, SecretStr | None]:
    """A gateway agent (baseline base URL + auth token) keeps both pinned; the API key goes.

    Applied after the subscription guard: a gateway configured in the process env
    is deliberate, and unsetting its token would send the OAuth token to it.
    """
    if not claude_credentials:
        return {}
    base_url, auth_token = baseline.get(BASE_URL, ""), baseline.get(AUTH_TOKEN, "")
    if not (base_url.strip() and auth_token.strip()):
        return {}
    return {BASE_URL: SecretStr(base_url), AUTH_TOKEN: SecretStr(auth_token), API_KEY: None}
