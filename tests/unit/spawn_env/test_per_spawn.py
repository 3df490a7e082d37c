"""The per-spawn layer of one turn's `auth_override` (contract §6), as tables of named cases."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import pytest
from pydantic import SecretStr

from agent_server.spawn_env.layers import build_spawn_env
from agent_server.spawn_env.per_spawn import spawn_credential
from agent_server.wire.names import EXECUTION_ID
from agent_server.wire.turns import AuthOverride, ProviderOverride
from tests.support.fake_claude import served_by

SWITCHES = {"CLAUDE_CODE_USE_BEDROCK", "CLAUDE_CODE_USE_VERTEX", "CLAUDE_CODE_USE_FOUNDRY"}
CREDENTIALS = {"CLAUDE_CODE_OAUTH_TOKEN", "ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN"}

OAUTH = AuthOverride(oauth_token=SecretStr("override-oauth-0001"))
API_KEY = AuthOverride(api_key=SecretStr("override-apikey-0001"))
PROVIDER = AuthOverride(
    provider=ProviderOverride(
        base_url="https://gateway.invalid/anthropic",
        auth_token=SecretStr("override-gateway-0001"),
        model="glm-4.6",
    )
)
PROVIDER_NO_MODEL = AuthOverride(
    provider=ProviderOverride(
        base_url="https://gateway.invalid/anthropic", auth_token=SecretStr("override-gateway-0002")
    )
)


@dataclass(frozen=True)
class Case:
    override: AuthOverride | None
    route: str
    sets: frozenset[str]
    drops: frozenset[str]
    model: str | None = None


CASES = {
    "no override leaves the baseline to serve": Case(None, "baseline", frozenset(), frozenset()),
    "an OAuth token drops every name the CLI prefers over it": Case(
        OAUTH,
        "oauth_token",
        frozenset({"CLAUDE_CODE_OAUTH_TOKEN"}),
        frozenset({"ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", *SWITCHES}),
    ),
    "an API key drops the OAuth token, the auth token and the provider switches": Case(
        API_KEY,
        "api_key",
        frozenset({"ANTHROPIC_API_KEY"}),
        frozenset({"CLAUDE_CODE_OAUTH_TOKEN", "ANTHROPIC_AUTH_TOKEN", *SWITCHES}),
    ),
    "a provider sets the gateway and its token and imposes its model": Case(
        PROVIDER,
        "provider",
        frozenset({"ANTHROPIC_BASE_URL", "ANTHROPIC_AUTH_TOKEN"}),
        frozenset({"ANTHROPIC_API_KEY", "CLAUDE_CODE_OAUTH_TOKEN", *SWITCHES}),
        "glm-4.6",
    ),
    "a provider without a model keeps the turn's model": Case(
        PROVIDER_NO_MODEL,
        "provider",
        frozenset({"ANTHROPIC_BASE_URL", "ANTHROPIC_AUTH_TOKEN"}),
        frozenset({"ANTHROPIC_API_KEY", "CLAUDE_CODE_OAUTH_TOKEN", *SWITCHES}),
    ),
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_spawn_credential(case: Case) -> None:
    """Each override kind: its route, the names it sets, the names it drops, its model."""
    credential = spawn_credential("exec-1", case.override)
    assert credential.auth_route == case.route
    assert set(credential.layer.values) == {EXECUTION_ID, *case.sets}
    assert credential.layer.values[EXECUTION_ID] == "exec-1"
    assert credential.layer.drop == case.drops
    assert credential.model == case.model
    assert not case.sets & case.drops


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_override_secrets_are_staged_for_the_redactor(case: Case) -> None:
    """The credential values are secrets; the execution id and the base URL are not."""
    staged = {s.get_secret_value() for s in spawn_credential("exec-1", case.override).secrets()}
    expected = {
        value.get_secret_value()
        for value in spawn_credential("exec-1", case.override).layer.values.values()
        if isinstance(value, SecretStr)
    }
    assert staged == expected
    assert len(staged) == (0 if case.override is None else 1)
    assert "https://gateway.invalid/anthropic" not in staged
    assert "exec-1" not in staged


# Every credential name in every lower layer: only the drop set can make a spawn coherent.
DIRTY_BASELINE = {
    "PATH": "/usr/bin",
    "CLAUDE_CODE_OAUTH_TOKEN": "baseline-oauth-0001",
    "ANTHROPIC_API_KEY": "baseline-apikey-0001",
    "ANTHROPIC_AUTH_TOKEN": "baseline-auth-0001",
    "ANTHROPIC_BASE_URL": "https://baseline.invalid",
    "CLAUDE_CODE_USE_BEDROCK": "1",
    "TRINITY_AGENT_AUTH_TOKEN": "controller-0001",
    "AGENT_SERVER_PORT": "8000",
}
DIRTY_DOTENV = {
    "ANTHROPIC_API_KEY": "dotenv-apikey-0001",
    "ANTHROPIC_AUTH_TOKEN": "dotenv-auth-0001",
    "CLAUDE_CODE_USE_VERTEX": "1",
    "CLAUDE_CODE_OAUTH_TOKEN": "dotenv-oauth-0001",
}
RELOADED = {"CLAUDE_CODE_OAUTH_TOKEN": SecretStr("reloaded-oauth-0001")}

SERVES = {
    "an OAuth token override serves even over a dirty baseline and .env": (
        OAUTH,
        "CLAUDE_CODE_OAUTH_TOKEN",
        "override-oauth-0001",
    ),
    "an API key override serves, with no OAuth token or auth token beside it": (
        API_KEY,
        "ANTHROPIC_API_KEY",
        "override-apikey-0001",
    ),
    "a provider override serves through its own base URL": (
        PROVIDER,
        "ANTHROPIC_AUTH_TOKEN",
        "override-gateway-0001",
    ),
}


@pytest.mark.parametrize(("override", "variable", "value"), SERVES.values(), ids=SERVES.keys())
def test_the_cli_sees_exactly_the_overridden_credential(
    override: AuthOverride, variable: str, value: str
) -> None:
    """Built over every layer at once, the spawn carries one credential: the override's."""
    spawn = build_spawn_env(
        DIRTY_BASELINE, DIRTY_DOTENV, RELOADED, spawn_credential("exec-2", override).layer
    )
    env = spawn.env
    assert served_by(env) == variable
    assert env[variable] == value
    assert not SWITCHES & set(env)
    assert set(env) & CREDENTIALS == {variable}
    assert spawn.sources[variable] == "per_spawn"
    if override is PROVIDER:
        assert env["ANTHROPIC_BASE_URL"] == "https://gateway.invalid/anthropic"
    assert "TRINITY_AGENT_AUTH_TOKEN" not in env
    assert "AGENT_SERVER_PORT" not in env
    assert env[EXECUTION_ID] == "exec-2"


def test_no_override_leaves_every_lower_layer_as_it_was() -> None:
    """The baseline route adds the execution id and removes nothing."""
    layer = spawn_credential("exec-3", None).layer
    with_layer = build_spawn_env(DIRTY_BASELINE, DIRTY_DOTENV, RELOADED, layer).env
    without = build_spawn_env(DIRTY_BASELINE, DIRTY_DOTENV, RELOADED).env
    assert with_layer == {**without, EXECUTION_ID: "exec-3"}


@pytest.mark.parametrize(
    ("api", "override", "values", "drop"),
    [
        (
            "openai",
            AuthOverride(api_key=SecretStr("k")),
            {"OPENAI_API_KEY": "k"},
            {"CODEX_API_KEY"},
        ),
        (
            "gemini",
            AuthOverride(api_key=SecretStr("k")),
            {"GEMINI_API_KEY": "k"},
            {"GOOGLE_API_KEY", "GOOGLE_GENAI_USE_VERTEXAI", "GOOGLE_GENAI_USE_GCA"},
        ),
        (
            "gemini",
            AuthOverride(
                provider=ProviderOverride(base_url="https://gw.example", auth_token=SecretStr("k"))
            ),
            {"GEMINI_API_KEY": "k", "GOOGLE_GEMINI_BASE_URL": "https://gw.example"},
            {"GOOGLE_API_KEY", "GOOGLE_GENAI_USE_VERTEXAI", "GOOGLE_GENAI_USE_GCA"},
        ),
    ],
    ids=["an OpenAI key", "a Gemini key", "a Gemini gateway"],
)
def test_a_key_apis_override_goes_under_its_names(
    api: Literal["openai", "gemini"],
    override: AuthOverride,
    values: dict[str, str],
    drop: set[str],
) -> None:
    """A key (a gateway's token) under the variable the CLI reads first, a gateway's URL
    as its base; no Claude name is touched."""
    credential = spawn_credential("exec-k", override, api)
    layer = credential.layer
    got = {
        name: value.get_secret_value() if isinstance(value, SecretStr) else value
        for name, value in layer.values.items()
        if name != EXECUTION_ID
    }
    assert got == values
    assert layer.drop == drop
    assert credential.auth_route == override.kind
