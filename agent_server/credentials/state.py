"""The one immutable credential state, and the fingerprint of a secret.

A change never mutates a state: it builds a new one with a larger generation and
the store swaps the reference. A spawn reads the reference once, so it sees either
the whole old state or the whole new one (contract §4).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from pydantic import SecretStr

from agent_server.spawn_env.layers import Overrides
from agent_server.wire.fingerprint import fingerprint as fingerprint  # its home is the seam
from agent_server.wire.names import CLAUDE_OAUTH, SUBSCRIPTION_SHADOW_KEYS


def next_generation(previous: int | None = None) -> int:
    """A generation larger than `previous` and than any earlier boot's (epoch ms)."""
    now_ms = time.time_ns() // 1_000_000
    return now_ms if previous is None else max(previous + 1, now_ms)


@dataclass(frozen=True)
class CredentialState:
    """Baseline env, credential overrides and the generation: one coherent snapshot."""

    baseline: Mapping[str, str]
    overrides: Overrides
    generation: int

    @classmethod
    def create(
        cls, baseline: Mapping[str, str], overrides: Overrides, generation: int
    ) -> CredentialState:
        """A state over read-only copies of its mappings."""
        return cls(MappingProxyType(dict(baseline)), MappingProxyType(dict(overrides)), generation)

    @property
    def guard_armed(self) -> bool:
        """True when every subscription shadow key is force-unset."""
        return all(
            name in self.overrides and self.overrides[name] is None
            for name in SUBSCRIPTION_SHADOW_KEYS
        )

    @property
    def active_token(self) -> SecretStr | None:
        """The subscription OAuth token a spawn would carry (override, else baseline)."""
        if CLAUDE_OAUTH in self.overrides:
            return self.overrides[CLAUDE_OAUTH]
        value = self.baseline.get(CLAUDE_OAUTH, "")
        return SecretStr(value) if value else None

    @property
    def fingerprint(self) -> str | None:
        """Fingerprint of the active OAuth token, or None without one."""
        token = self.active_token
        return fingerprint(token) if token is not None else None

    def same_overrides(self, other: Overrides) -> bool:
        """True when `other` sets and unsets exactly what this state does."""
        return _plain(self.overrides) == _plain(other)


def _plain(overrides: Overrides) -> dict[str, str | None]:
    return {k: (v.get_secret_value() if v is not None else None) for k, v in overrides.items()}
