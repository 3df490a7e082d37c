"""The boot guards of contract §4: every armed and inert case, as the next spawn sees it."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import pytest
from pydantic import SecretStr

from agent_server.credentials.override_file import OverrideFile
from agent_server.credentials.store import CredentialStore
from agent_server.spawn_env.layers import PerSpawn, build_spawn_env
from agent_server.wire.names import SUBSCRIPTION_SHADOW_KEYS

OAUTH = "CLAUDE_CODE_OAUTH_TOKEN"
KEY = "ANTHROPIC_API_KEY"
AUTH = "ANTHROPIC_AUTH_TOKEN"
URL = "ANTHROPIC_BASE_URL"
BEDROCK = "CLAUDE_CODE_USE_BEDROCK"
ABSENT = None


def boot(
    tmp_path: Path, runtime: str, baseline: Mapping[str, str], file_token: str | None
) -> CredentialStore:
    """Boot a store the way the server does, with a real override file."""
    path = tmp_path / "state" / "oauth-token"
    path.parent.mkdir(mode=0o700)
    if file_token is not None:
        path.write_text(file_token)
    return CredentialStore.boot(runtime == "claude-code", baseline, OverrideFile(path))


@pytest.mark.parametrize(
    ("runtime", "baseline", "file_token", "dotenv", "armed", "expected"),
    [
        pytest.param(
            "claude-code",
            {OAUTH: "", KEY: "base-key"},
            None,
            {},
            False,
            {KEY: "base-key"},
            id="an empty OAuth token arms nothing",
        ),
        pytest.param(
            "claude-code",
            {OAUTH: "   ", KEY: "base-key"},
            None,
            {},
            False,
            {KEY: "base-key"},
            id="a whitespace-only OAuth token arms nothing",
        ),
        pytest.param(
            "codex",
            {OAUTH: "oauth-1", KEY: "base-key"},
            None,
            {AUTH: "file-auth"},
            False,
            {KEY: "base-key", AUTH: "file-auth"},
            id="a Codex agent keeps its keys",
        ),
        pytest.param(
            "gemini-cli",
            {OAUTH: "oauth-1", KEY: "base-key"},
            "file-oauth",
            {},
            False,
            {KEY: "base-key"},
            id="a Gemini agent keeps its keys even with an override file",
        ),
        pytest.param(
            "claude-code",
            {},
            None,
            {KEY: "file-key"},
            False,
            {KEY: "file-key"},
            id="no baseline credential (terminal login) arms nothing",
        ),
        pytest.param(
            "claude-code",
            {KEY: "base-key"},
            None,
            {},
            False,
            {KEY: "base-key", OAUTH: ABSENT},
            id="a platform-key agent (API key, no OAuth token) arms nothing",
        ),
        pytest.param(
            "claude-code",
            {},
            None,
            {OAUTH: "file-oauth", KEY: "file-key"},
            False,
            {OAUTH: "file-oauth", KEY: "file-key"},
            id="an OAuth token only in .env is operator-managed and arms nothing",
        ),
        pytest.param(
            "claude-code",
            {OAUTH: "oauth-1", KEY: "base-key", BEDROCK: "1"},
            None,
            {AUTH: "file-auth", "CLAUDE_CODE_USE_VERTEX": "1"},
            True,
            {OAUTH: "oauth-1", KEY: ABSENT, AUTH: ABSENT, BEDROCK: ABSENT},
            id="an OAuth token in baseline arms: every shadow key is unset",
        ),
        pytest.param(
            "claude-code",
            {KEY: "base-key"},
            "file-oauth-0123456789abcdef",
            {KEY: "file-key"},
            True,
            {OAUTH: "file-oauth-0123456789abcdef", KEY: ABSENT},
            id="an OAuth token only in the override file arms too",
        ),
        pytest.param(
            "claude-code",
            {URL: "https://gw.example", AUTH: "gw-token", KEY: "base-key"},
            None,
            {URL: "https://other.example", AUTH: "file-auth"},
            False,
            {URL: "https://gw.example", AUTH: "gw-token", KEY: ABSENT},
            id="the provider guard pins base URL and auth token and unsets the API key",
        ),
        pytest.param(
            "claude-code",
            {URL: "https://gw.example", AUTH: "gw-token", OAUTH: "oauth-1"},
            None,
            {},
            False,
            {URL: "https://gw.example", AUTH: "gw-token", KEY: ABSENT, BEDROCK: ABSENT},
            id="the provider guard keeps the gateway token over the subscription arm",
        ),
        pytest.param(
            "claude-code",
            {URL: "https://gw.example", KEY: "base-key"},
            None,
            {URL: "https://other.example"},
            False,
            {URL: "https://gw.example", KEY: "base-key"},
            id="a .env base URL never reroutes the baseline's key (the route guard)",
        ),
        pytest.param(
            "claude-code",
            {AUTH: "gw-token", KEY: "base-key"},
            None,
            {AUTH: "file-auth"},
            False,
            {AUTH: "file-auth", KEY: "base-key"},
            id="the provider guard is inert with only an auth token",
        ),
    ],
)
def test_boot_guard(
    tmp_path: Path,
    runtime: str,
    baseline: Mapping[str, str],
    file_token: str | None,
    dotenv: Mapping[str, str],
    armed: bool,
    expected: Mapping[str, str | None],
) -> None:
    """The guard arms exactly when contract §4 says, and the next spawn shows it."""
    state = boot(tmp_path, runtime, baseline, file_token).current
    env = build_spawn_env(state.baseline, dotenv, state.overrides).env
    assert state.guard_armed is armed
    assert {name: env.get(name) for name in expected} == expected


def test_a_later_explicit_override_wins_over_the_arm(tmp_path: Path) -> None:
    """Extra beats the arm: an override set after arming, and a per-spawn value, both win."""
    state = boot(tmp_path, "claude-code", {OAUTH: "oauth-1", KEY: "base-key"}, None).current
    assert state.guard_armed
    later = {**state.overrides, KEY: SecretStr("explicit-key")}
    assert build_spawn_env(state.baseline, {}, later).env[KEY] == "explicit-key"
    per_spawn = PerSpawn(values={AUTH: SecretStr("spawn-auth")})
    assert build_spawn_env(state.baseline, {}, state.overrides, per_spawn).env[AUTH] == "spawn-auth"


def test_the_arm_covers_every_shadow_key(tmp_path: Path) -> None:
    """Armed means all of SUBSCRIPTION_SHADOW_KEYS are force-unset, nothing else."""
    state = boot(tmp_path, "claude-code", {OAUTH: "oauth-1"}, None).current
    assert {n for n, v in state.overrides.items() if v is None} == set(SUBSCRIPTION_SHADOW_KEYS)
