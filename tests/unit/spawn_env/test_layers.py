"""`build_spawn_env`: the five layers of contract §4 as named precedence cases."""

from __future__ import annotations

from collections.abc import Mapping

import pytest
from pydantic import SecretStr

from agent_server.spawn_env.layers import Overrides, PerSpawn, build_spawn_env
from agent_server.wire.names import is_credential_name, is_protected

S = SecretStr
ABSENT = None


@pytest.mark.parametrize(
    ("baseline", "dotenv", "overrides", "per_spawn", "expected"),
    [
        pytest.param(
            {"FOO": "base"}, {}, {}, None, {"FOO": "base"}, id="the baseline passes through"
        ),
        pytest.param(
            {"FOO": "base"}, {"FOO": "file"}, {}, None, {"FOO": "file"}, id=".env beats baseline"
        ),
        pytest.param(
            {},
            {"FOO": "file"},
            {"FOO": S("over")},
            None,
            {"FOO": "over"},
            id="a credential override beats .env",
        ),
        pytest.param(
            {"FOO": "base"},
            {},
            {"FOO": None},
            None,
            {"FOO": ABSENT},
            id="a force-unset removes a baseline value",
        ),
        pytest.param(
            {"FOO": "base"},
            {"FOO": "file"},
            {"FOO": None},
            None,
            {"FOO": ABSENT},
            id="a force-unset removes a .env value",
        ),
        pytest.param(
            {},
            {},
            {"FOO": S("over")},
            PerSpawn(values={"FOO": S("spawn")}),
            {"FOO": "spawn"},
            id="the per-spawn layer beats an override",
        ),
        pytest.param(
            {},
            {},
            {"ANTHROPIC_API_KEY": None},
            PerSpawn(values={"ANTHROPIC_API_KEY": S("spawnkey1")}),
            {"ANTHROPIC_API_KEY": "spawnkey1"},
            id="extra beats the arm: a per-spawn value wins over a force-unset",
        ),
        pytest.param(
            {},
            {"FOO": "file"},
            {},
            PerSpawn(values={"FOO": "plain", "BAR": "x"}, drop=frozenset({"FOO"})),
            {"FOO": ABSENT, "BAR": "x"},
            id="drop is the top layer: it removes even a per-spawn value",
        ),
        pytest.param(
            {"FOO": "base"},
            {},
            {},
            PerSpawn(drop=frozenset({"FOO", "NOT_THERE"})),
            {"FOO": ABSENT},
            id="drop removes a baseline value and ignores unknown names",
        ),
        pytest.param(
            {"TRINITY_AGENT_AUTH_TOKEN": "ctl", "AGENT_SERVER_PORT": "1", "AGENT_NAME": "a"},
            {},
            {},
            None,
            {"TRINITY_AGENT_AUTH_TOKEN": ABSENT, "AGENT_SERVER_PORT": ABSENT, "AGENT_NAME": "a"},
            id="the server's own settings never reach a spawn even from baseline",
        ),
        pytest.param(
            {"PATH": "/usr/bin"},
            {"PATH": "/evil", "AGENT_SERVER_STATE_DIR": "/x", "TRINITY_AGENT_AUTH_TOKEN": "t"},
            {},
            None,
            {
                "PATH": "/usr/bin",
                "AGENT_SERVER_STATE_DIR": ABSENT,
                "TRINITY_AGENT_AUTH_TOKEN": ABSENT,
            },
            id="protected keys in .env are ignored and the baseline value stays",
        ),
        pytest.param(
            {},
            {"GIT_AUTHOR_NAME": "me", "GIT_SSH_COMMAND": "evil"},
            {},
            None,
            {"GIT_AUTHOR_NAME": "me", "GIT_SSH_COMMAND": ABSENT},
            id="only GIT_ exec hooks are protected, other GIT_ names pass",
        ),
    ],
)
def test_build_spawn_env(
    baseline: Mapping[str, str],
    dotenv: Mapping[str, str],
    overrides: Overrides,
    per_spawn: PerSpawn | None,
    expected: Mapping[str, str | None],
) -> None:
    """Each layer beats the ones below it, and the drop set beats them all."""
    env = build_spawn_env(baseline, dotenv, overrides, per_spawn).env
    assert {name: env.get(name) for name in expected} == expected


def test_sources_name_the_layer_that_gave_each_value() -> None:
    """`sources` says which layer each name came from."""
    spawn = build_spawn_env(
        {"A": "1", "B": "1", "C": "1", "D": "1"},
        {"B": "2", "C": "2", "D": "2"},
        {"C": S("3"), "D": S("3")},
        PerSpawn(values={"D": "4"}),
    )
    assert spawn.sources == {"A": "baseline", "B": "env_file", "C": "override", "D": "per_spawn"}


def test_suppressed_lists_only_env_file_values_a_force_unset_swallowed() -> None:
    """A force-unset of a baseline value is not a `.env` suppression."""
    spawn = build_spawn_env(
        {"ANTHROPIC_AUTH_TOKEN": "b"},
        {"ANTHROPIC_API_KEY": "f"},
        {"ANTHROPIC_API_KEY": None, "ANTHROPIC_AUTH_TOKEN": None},
    )
    assert spawn.suppressed == {"ANTHROPIC_API_KEY"}


@pytest.mark.parametrize(
    "name",
    [
        "PATH",
        "HOME",
        "LD_PRELOAD",
        "LD_LIBRARY_PATH",
        "PYTHONPATH",
        "PYTHONSTARTUP",
        "NODE_OPTIONS",
        "BASH_ENV",
        "ENV",
        "IFS",
        "GIT_SSH_COMMAND",
        "GIT_EXEC_PATH",
        "GIT_CONFIG_GLOBAL",
        "TRINITY_AGENT_AUTH_TOKEN",
        "AGENT_SERVER_RUNTIME_COMMAND",
        "CLAUDE_CODE_OAUTH_TOKEN_FILE_DESCRIPTOR",
        "CLAUDE_CODE_WEBSOCKET_AUTH_FILE_DESCRIPTOR",
    ],
)
def test_protected_names(name: str) -> None:
    """Every protected name of contract §4 is ignored from `.env` and reported."""
    assert is_protected(name)
    assert build_spawn_env({}, {name: "x"}, {}).ignored == {name}


@pytest.mark.parametrize(
    ("name", "secret"),
    [
        pytest.param("CLAUDE_CODE_OAUTH_TOKEN", True, id="the OAuth token"),
        pytest.param("OPENAI_API_KEY", True, id="a name ending in _API_KEY"),
        pytest.param("DB_PASSWORD", True, id="a name ending in _PASSWORD"),
        pytest.param("X_SECRET", True, id="a name ending in _SECRET"),
        pytest.param("ANTHROPIC_BASE_URL", False, id="a base URL is not a secret"),
    ],
)
def test_is_credential_name(name: str, secret: bool) -> None:
    """The redactor's credential names follow contract §8."""
    assert is_credential_name(name) is secret


def test_only_the_server_hands_out_credential_descriptors() -> None:
    """A descriptor name in the baseline never reaches a spawn: only the server sets one."""
    spawn = build_spawn_env({"CLAUDE_CODE_API_KEY_FILE_DESCRIPTOR": "0", "KEEP": "1"}, {}, {})
    assert spawn.env == {"KEEP": "1"}
