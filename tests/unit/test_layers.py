"""`build_spawn_env`: the five layers of contract §4 as named precedence cases."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path

import pytest
from pydantic import SecretStr

from agent_server.config import Settings
from agent_server.services import Services
from agent_server.spawn_env.layers import (
    OnceWarner,
    Overrides,
    PerSpawn,
    build_spawn_env,
    is_credential_name,
    is_protected,
)

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


def test_once_warner_warns_once_and_again_after_the_key_returns(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """One warning per key while present; a key that leaves and returns warns again."""
    warner = OnceWarner(logging.getLogger("test.warner"), "hit %s")
    with caplog.at_level(logging.WARNING, "test.warner"):
        assert warner.observe({"K"}, {"K"}) == ["K"]
        assert warner.observe({"K"}, {"K"}) == []
        assert warner.observe(set(), set()) == []
        assert warner.observe({"K"}, {"K"}) == ["K"]
    assert [r.getMessage() for r in caplog.records] == ["hit K", "hit K"]


def _services(environ: dict[str, str]) -> Services:
    return Services.build(Settings.from_environ(environ), serving=False)


def _warnings(caplog: pytest.LogCaptureFixture, key: str) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.WARNING and getattr(r, "key", None) == key
    ]


def test_force_unset_of_a_dotenv_value_warns_once_and_again_after_readd(
    environ: dict[str, str], caplog: pytest.LogCaptureFixture
) -> None:
    """A guard-swallowed `.env` key warns once by name (no value), and again when re-added."""
    environ["CLAUDE_CODE_OAUTH_TOKEN"] = "baseline-oauth-token-1"
    env_file = Path(environ["AGENT_SERVER_ENV_FILE"])
    services = _services(environ)
    with caplog.at_level(logging.WARNING):
        env_file.write_text("ANTHROPIC_API_KEY=dotenv-api-key-value\n")
        for _ in range(3):
            spawn = services.spawn_env(services.store.current)
            assert "ANTHROPIC_API_KEY" not in spawn.env
        assert len(_warnings(caplog, "ANTHROPIC_API_KEY")) == 1
        env_file.write_text("OTHER=1\n")
        services.spawn_env(services.store.current)
        env_file.write_text("ANTHROPIC_API_KEY=dotenv-api-key-value2\n")
        services.spawn_env(services.store.current)
    warned = _warnings(caplog, "ANTHROPIC_API_KEY")
    assert len(warned) == 2
    assert all("ANTHROPIC_API_KEY" in m and "dotenv-api-key" not in m for m in warned)


def test_protected_dotenv_keys_warn_once_per_name_not_per_spawn(
    environ: dict[str, str], caplog: pytest.LogCaptureFixture
) -> None:
    """Two protected keys over five spawns: exactly two warnings, one per name."""
    Path(environ["AGENT_SERVER_ENV_FILE"]).write_text("PATH=/evil\nLD_PRELOAD=/evil.so\nOK=1\n")
    services = _services(environ)
    with caplog.at_level(logging.WARNING):
        for _ in range(5):
            spawn = services.spawn_env(services.store.current)
            assert spawn.env["PATH"] == environ["PATH"]
            assert "LD_PRELOAD" not in spawn.env
            assert spawn.env["OK"] == "1"
    assert len(_warnings(caplog, "PATH")) == 1
    assert len(_warnings(caplog, "LD_PRELOAD")) == 1


def test_spawn_env_never_carries_the_controller_token(environ: dict[str, str]) -> None:
    """TRINITY_AGENT_AUTH_TOKEN and AGENT_SERVER_* from the process env never reach a spawn."""
    environ["TRINITY_AGENT_AUTH_TOKEN"] = "controller-secret-123"
    services = _services(environ)
    env = services.spawn_env(services.store.current).env
    assert "TRINITY_AGENT_AUTH_TOKEN" not in env
    assert not [name for name in env if name.startswith("AGENT_SERVER_")]
