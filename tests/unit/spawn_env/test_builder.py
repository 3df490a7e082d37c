"""SpawnEnvBuilder: `.env` read for every spawn, its secrets redacted, warnings given once."""

from __future__ import annotations

import asyncio
import logging
import os
import time
from pathlib import Path

import pytest

from agent_server.config import Settings
from agent_server.execution.ask import TurnAsk
from agent_server.redaction.redactor import DEPARTED_LIMIT, MASK
from agent_server.services import Services
from agent_server.spawn_env.builder import OnceWarner
from agent_server.spawn_env.layers import SpawnEnv


def _spawn(services: Services) -> SpawnEnv:
    state = services.store.current
    return asyncio.run(services.spawn_envs.build(state.baseline, state.overrides))


def test_once_warner_warns_once_and_again_after_the_key_returns(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """One warning per key while present; a key that leaves and returns warns again."""
    warner = OnceWarner("hit %s")
    with caplog.at_level(logging.WARNING, "agent_server.spawn_env"):
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
            spawn = _spawn(services)
            assert "ANTHROPIC_API_KEY" not in spawn.env
        assert len(_warnings(caplog, "ANTHROPIC_API_KEY")) == 1
        env_file.write_text("OTHER=1\n")
        _spawn(services)
        env_file.write_text("ANTHROPIC_API_KEY=dotenv-api-key-value2\n")
        _spawn(services)
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
            spawn = _spawn(services)
            assert spawn.env["PATH"] == environ["PATH"]
            assert "LD_PRELOAD" not in spawn.env
            assert spawn.env["OK"] == "1"
    assert len(_warnings(caplog, "PATH")) == 1
    assert len(_warnings(caplog, "LD_PRELOAD")) == 1


def test_spawn_env_never_carries_the_controller_token(environ: dict[str, str]) -> None:
    """TRINITY_AGENT_AUTH_TOKEN and AGENT_SERVER_* from the process env never reach a spawn."""
    environ["TRINITY_AGENT_AUTH_TOKEN"] = "controller-secret-123"
    services = _services(environ)
    env = _spawn(services).env
    assert "TRINITY_AGENT_AUTH_TOKEN" not in env
    assert not [name for name in env if name.startswith("AGENT_SERVER_")]


def test_a_churning_dotenv_cannot_grow_the_redactor_without_bound(
    environ: dict[str, str],
) -> None:
    """5,000 token lines rewritten four times: the redactor holds the current ones plus
    at most DEPARTED_LIMIT departed values, and a departed value is still masked."""
    env_file = Path(environ["AGENT_SERVER_ENV_FILE"])
    services = _services(environ)
    baseline = services.redactor.size
    first_value = ""
    for round_ in range(4):
        lines = [f"SVC_{i}_TOKEN=round{round_}-value-{i:05d}-abcdefgh" for i in range(5000)]
        env_file.write_text("\n".join(lines) + "\n")
        os.utime(env_file, (time.time() - 60 * (4 - round_),) * 2)  # a new identity each round
        _spawn(services)
        first_value = first_value or lines[-1].partition("=")[2]
        assert services.redactor.size <= baseline + 5000 + DEPARTED_LIMIT
    assert services.redactor.redact(f"x {lines[0].partition('=')[2]} y") == f"x {MASK} y"
    # The first round's values left .env three rounds ago: 15,000 departures later they
    # have aged out.
    assert services.redactor.redact(first_value) == first_value


def test_a_suppressed_key_counts_under_its_name_or_other(environ: dict[str, str]) -> None:
    """The suppressed-keys metric takes its label from a fixed set of names only."""
    environ["CLAUDE_CODE_OAUTH_TOKEN"] = "baseline-oauth-token-1"
    Path(environ["AGENT_SERVER_ENV_FILE"]).write_text("ANTHROPIC_API_KEY=stale-key-0123456789\n")
    services = _services(environ)
    asyncio.run(services.turns.run(TurnAsk(message="x", execution_id="m1")))
    text = services.metrics.render().decode()
    assert 'agent_server_spawn_suppressed_keys_total{key="ANTHROPIC_API_KEY"} 1.0' in text
