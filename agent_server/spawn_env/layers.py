"""The environment of one spawn, built from five explicit layers (contract §4.2).

Lowest first: baseline (the process env at boot) < `.env` < credential overrides
< the per-spawn layer < the drop set; then the route guard (`route.guard_route`,
contract §4.6) keeps the chosen credential on the route that belongs to it.
`build_spawn_env` is pure: the same inputs always give the same env, so every
precedence rule is a table test.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from pydantic import SecretStr

from agent_server.spawn_env.route import guard_route
from agent_server.wire.names import Layer, is_protected, is_server_only

Overrides = Mapping[str, SecretStr | None]
"""Credential overrides: name -> value, or name -> None for a force-unset."""


@dataclass(frozen=True)
class PerSpawn:
    """The top value layer of one spawn, and the names it drops last."""

    values: Mapping[str, SecretStr | str] = field(default_factory=dict)
    drop: frozenset[str] = frozenset()


@dataclass(frozen=True)
class SpawnEnv:
    """One spawn's environment and where each name came from."""

    env: dict[str, str]
    sources: dict[str, Layer]
    suppressed: frozenset[str]
    """Names `.env` supplied that a credential force-unset swallowed."""
    ignored: frozenset[str]
    """Protected names `.env` tried to set."""
    rerouted: frozenset[str] = frozenset()
    """Routing names `.env` set that the route guard took back (contract §4.6)."""
    replaced: frozenset[str] = frozenset()
    """Credential names `.env` set that a credential override replaced."""


def build_spawn_env(
    baseline: Mapping[str, str],
    dotenv: Mapping[str, str],
    overrides: Overrides,
    per_spawn: PerSpawn | None = None,
) -> SpawnEnv:
    """Build one spawn's environment from the five layers, lowest first."""
    per_spawn = per_spawn or PerSpawn()
    base = {name: value for name, value in baseline.items() if not is_server_only(name)}
    env: dict[str, str] = dict(base)
    sources: dict[str, Layer] = dict.fromkeys(base, "baseline")
    ignored = set()
    for name, value in dotenv.items():
        if is_protected(name):
            ignored.add(name)
            continue
        env[name], sources[name] = value, "env_file"
    suppressed, replaced = set(), set()
    for name, secret in overrides.items():
        from_dotenv = sources.get(name) == "env_file"
        if secret is None:
            if from_dotenv:
                suppressed.add(name)
            env.pop(name, None)
            sources.pop(name, None)
        else:
            value = secret.get_secret_value()
            if from_dotenv and env[name] != value:
                replaced.add(name)
            # A pin of the baseline's own value (the guards) still reports where it is from.
            env[name], sources[name] = value, "baseline" if base.get(name) == value else "override"
    for name, given in per_spawn.values.items():
        env[name] = given.get_secret_value() if isinstance(given, SecretStr) else given
        sources[name] = "per_spawn"
    for name in per_spawn.drop:
        env.pop(name, None)
        sources.pop(name, None)
    rerouted = guard_route(base, env, sources)
    return SpawnEnv(
        env, sources, frozenset(suppressed), frozenset(ignored), rerouted, frozenset(replaced)
    )
