"""The environment of one spawn, built from five explicit layers (contract §4).

Lowest first: baseline (the process env at boot) < `.env` < credential overrides
< the per-spawn layer < the drop set. `build_spawn_env` is pure: the same inputs
always give the same env, so every precedence rule is a table test.
"""

from __future__ import annotations

import functools
import logging
import re
from collections.abc import Container, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal

from pydantic import SecretStr

CLAUDE_OAUTH = "CLAUDE_CODE_OAUTH_TOKEN"
API_KEY = "ANTHROPIC_API_KEY"
AUTH_TOKEN = "ANTHROPIC_AUTH_TOKEN"  # noqa: S105 - a variable name
BASE_URL = "ANTHROPIC_BASE_URL"
PROVIDER_SWITCHES = ("CLAUDE_CODE_USE_BEDROCK", "CLAUDE_CODE_USE_VERTEX", "CLAUDE_CODE_USE_FOUNDRY")
SUBSCRIPTION_SHADOW_KEYS = (API_KEY, AUTH_TOKEN, *PROVIDER_SWITCHES)
"""The names Claude Code prefers over `CLAUDE_CODE_OAUTH_TOKEN` (the recorded transcripts)."""
CLAUDE_CREDENTIALS = (API_KEY, AUTH_TOKEN, CLAUDE_OAUTH)
"""In the order the CLI prefers them (`apiKeySource` reports the first)."""

CONTROLLER_TOKEN = "TRINITY_AGENT_AUTH_TOKEN"  # noqa: S105 - a variable name
EXECUTION_ID = "TRINITY_EXECUTION_ID"

# `.env` must never redirect what a spawn executes or loads: exec hooks and loaders.
_PROTECTED_EXACT = frozenset(
    {"PATH", "HOME", "NODE_OPTIONS", "BASH_ENV", "ENV", "IFS", "SHELL", CONTROLLER_TOKEN}
)
_PROTECTED_PATTERN = re.compile(
    r"^(LD_.*|PYTHON.*|AGENT_SERVER_.*|GIT_(SSH|SSH_COMMAND|EXEC_PATH|EDITOR|SEQUENCE_EDITOR"
    r"|PAGER|ASKPASS|PROXY_COMMAND|EXTERNAL_DIFF|TEMPLATE_DIR|CONFIG.*))$"
)
_CREDENTIAL_SUFFIXES = ("_API_KEY", "_TOKEN", "_SECRET", "_PASSWORD")

Layer = Literal["baseline", "env_file", "override", "per_spawn"]


def is_server_only(name: str) -> bool:
    """The server's own secret and settings: no spawn ever receives them."""
    return name == CONTROLLER_TOKEN or name.startswith("AGENT_SERVER_")


@functools.lru_cache(maxsize=16384)
def is_protected(name: str) -> bool:
    """Names `.env` may not set (contract §4): loaders, exec hooks, the server's own."""
    return name in _PROTECTED_EXACT or _PROTECTED_PATTERN.match(name) is not None


@functools.lru_cache(maxsize=16384)
def is_credential_name(name: str) -> bool:
    """A variable whose value is a secret (contract §8's redactor list)."""
    return name in CLAUDE_CREDENTIALS or name.endswith(_CREDENTIAL_SUFFIXES)


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


def build_spawn_env(
    baseline: Mapping[str, str],
    dotenv: Mapping[str, str],
    overrides: Overrides,
    per_spawn: PerSpawn | None = None,
    *,
    protect_baseline: bool = True,
) -> SpawnEnv:
    """Build one spawn's environment from the five layers of contract §4, lowest first."""
    per_spawn = per_spawn or PerSpawn()
    env: dict[str, str] = {}
    sources: dict[str, Layer] = {}
    for name, value in baseline.items():
        if protect_baseline and is_server_only(name):
            continue
        env[name], sources[name] = value, "baseline"
    ignored = set()
    for name, value in dotenv.items():
        if is_protected(name):
            ignored.add(name)
            continue
        env[name], sources[name] = value, "env_file"
    suppressed = set()
    for name, secret in overrides.items():
        if secret is None:
            if sources.get(name) == "env_file":
                suppressed.add(name)
            env.pop(name, None)
            sources.pop(name, None)
        else:
            env[name], sources[name] = secret.get_secret_value(), "override"
    for name, given in per_spawn.values.items():
        env[name] = given.get_secret_value() if isinstance(given, SecretStr) else given
        sources[name] = "per_spawn"
    for name in per_spawn.drop:
        env.pop(name, None)
        sources.pop(name, None)
    return SpawnEnv(env, sources, frozenset(suppressed), frozenset(ignored))


class OnceWarner:
    """Warns once per key name while the key stays present; again after it returns."""

    def __init__(self, logger: logging.Logger, template: str) -> None:
        self._logger = logger
        self._template = template
        self._warned: set[str] = set()

    def observe(self, hits: Iterable[str], present: Container[str]) -> list[str]:
        """Warn for new `hits`; forget keys no longer `present`. Returns the names warned."""
        self._warned = {name for name in self._warned if name in present}
        new = sorted(set(hits) - self._warned)
        for name in new:
            self._logger.warning(self._template, name, extra={"key": name})
        self._warned.update(new)
        return new
