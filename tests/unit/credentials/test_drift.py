"""`effective_auth` follows the CLI's precedence; `env_drift` shows names only (contract §4)."""

from __future__ import annotations

from collections.abc import Mapping

import pytest
from pydantic import SecretStr

from agent_server.credentials.state import CredentialState, fingerprint
from agent_server.credentials.status import auth_mode, effective_auth, env_drift, spawn_preview
from agent_server.spawn_env.layers import Overrides

OAUTH = "CLAUDE_CODE_OAUTH_TOKEN"
KEY = "ANTHROPIC_API_KEY"
AUTH = "ANTHROPIC_AUTH_TOKEN"


@pytest.mark.parametrize(
    ("baseline", "dotenv", "overrides", "variable", "layer", "conflicts", "mode"),
    [
        pytest.param({}, {}, {}, None, None, None, "none", id="no credential at all"),
        pytest.param(
            {OAUTH: "oauth-aaaaaaaa"},
            {},
            {},
            OAUTH,
            "baseline",
            [],
            "subscription",
            id="an OAuth token alone",
        ),
        pytest.param(
            {OAUTH: "oauth-aaaaaaaa"},
            {KEY: "key-bbbbbbbb"},
            {},
            KEY,
            "env_file",
            [OAUTH],
            "api_key",
            id="an API key beats the OAuth token, which is a conflict",
        ),
        pytest.param(
            {},
            {AUTH: "auth-cccccccc", KEY: "key-bbbbbbbb"},
            {},
            KEY,
            "env_file",
            [AUTH],
            "api_key",
            id="ANTHROPIC_API_KEY beats ANTHROPIC_AUTH_TOKEN; both are sent",
        ),
        pytest.param(
            {OAUTH: "oauth-aaaaaaaa"},
            {AUTH: "auth-cccccccc"},
            {},
            AUTH,
            "env_file",
            [OAUTH],
            "gateway",
            id="ANTHROPIC_AUTH_TOKEN beats the OAuth token",
        ),
        pytest.param(
            {KEY: "key-bbbbbbbb"},
            {"CLAUDE_CODE_USE_BEDROCK": "1"},
            {},
            "CLAUDE_CODE_USE_BEDROCK",
            "env_file",
            [KEY],
            "provider",
            id="a provider switch beats every credential",
        ),
        pytest.param(
            {},
            {"CLAUDE_CODE_USE_VERTEX": "0", OAUTH: "oauth-aaaaaaaa"},
            {},
            OAUTH,
            "env_file",
            [],
            "subscription",
            id="a switch set to 0 is off",
        ),
        pytest.param(
            {OAUTH: "stale-oauth-1"},
            {OAUTH: "stale-oauth-2", KEY: "key-bbbbbbbb"},
            {OAUTH: SecretStr("fresh-oauth"), KEY: None},
            OAUTH,
            "override",
            [],
            "subscription",
            id="the reloaded token in the override layer, the key force-unset",
        ),
    ],
)
def test_effective_auth(
    baseline: Mapping[str, str],
    dotenv: Mapping[str, str],
    overrides: Overrides,
    variable: str | None,
    layer: str | None,
    conflicts: list[str] | None,
    mode: str,
) -> None:
    """The next spawn's credential, its layer and the conflicting names it also carries."""
    state = CredentialState.create(baseline, overrides, 1)
    preview = spawn_preview(state, dotenv)
    auth = effective_auth(preview)
    assert auth_mode(auth) == mode
    if variable is None:
        assert auth is None
        return
    assert auth is not None
    assert (auth.variable, auth.layer, auth.conflicts) == (variable, layer, conflicts)
    if variable.startswith("CLAUDE_CODE_USE_"):
        assert auth.fingerprint is None
    else:
        assert auth.fingerprint == fingerprint(preview.env[variable])


def test_env_drift_rows() -> None:
    """One row per `.env` key, baseline credential and overridden name, with names only."""
    state = CredentialState.create(
        {OAUTH: "oauth-aaaaaaaa", "FOO": "same", "PLAIN": "x"},
        {KEY: None, OAUTH: SecretStr("fresh-oauth")},
        1,
    )
    dotenv = {"FOO": "same", KEY: "key-bbbbbbbb", "BAR": "file-only"}
    rows = {row.key: row for row in env_drift(state, dotenv, spawn_preview(state, dotenv))}
    assert set(rows) == {OAUTH, KEY, "FOO", "BAR"}
    foo, key, oauth, bar = rows["FOO"], rows[KEY], rows[OAUTH], rows["BAR"]
    assert (foo.in_file, foo.in_process_env, foo.equal, foo.spawn_source) == (
        True,
        True,
        True,
        "env_file",
    )
    assert (key.in_file, key.suppressed_for_spawn, key.spawn_source) == (True, True, None)
    assert (oauth.in_file, oauth.in_process_env, oauth.equal) == (False, True, None)
    assert (oauth.overridden_for_spawn, oauth.spawn_source) == (True, "override")
    assert (bar.in_process_env, bar.equal) == (False, None)
    assert "file-only" not in repr(rows) and "oauth-aaaaaaaa" not in repr(rows)
