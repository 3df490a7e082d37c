"""The credential store: holds the current state and carries out reload-token.

The order is the contract (contract §4): validate, write the override file, THEN swap
the state. A failed write raises `PersistFailed` and memory is untouched.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from pydantic import SecretStr

from agent_server.credentials.guard import arm_subscription_auth_guard, pin_provider
from agent_server.credentials.override_file import OverrideFile
from agent_server.credentials.state import CredentialState, next_generation
from agent_server.errors import GenerationMismatch, PersistFailed
from agent_server.spawn_env.layers import Overrides
from agent_server.wire.names import CLAUDE_OAUTH, SUBSCRIPTION_SHADOW_KEYS

logger = logging.getLogger("agent_server.credentials")


@dataclass(frozen=True)
class ReloadResult:
    """The state after a reload, and whether the reload changed it."""

    state: CredentialState
    changed: bool


class CredentialStore:
    """The one place the credential state changes; readers take `current` once."""

    def __init__(
        self,
        state: CredentialState,
        override_file: OverrideFile,
        on_change: Callable[[CredentialState], None] = lambda _state: None,
    ) -> None:
        self._state = state
        self._file = override_file
        self._lock = asyncio.Lock()
        self._on_change = on_change
        on_change(state)

    @classmethod
    def boot(
        cls,
        claude_credentials: bool,
        baseline: Mapping[str, str],
        override_file: OverrideFile,
        on_change: Callable[[CredentialState], None] = lambda _state: None,
        *,
        prepare: bool = True,
    ) -> CredentialStore:
        """Load the override file and arm the boot guards (contract §3, §4.3).

        `claude_credentials`: the runtime authenticates with Claude credentials.

        `prepare=False` (a read-only look, e.g. `agent-server status` next to a running
        server) neither creates the state dir nor removes temp files a live write may own.
        """
        token: SecretStr | None = None
        try:
            if prepare:
                override_file.prepare()
            token = override_file.read()
        except (OSError, UnicodeDecodeError) as exc:
            logger.error("ignoring the token override file %s: %s", override_file.path, exc)
        overrides: dict[str, SecretStr | None] = {}
        armed = arm_subscription_auth_guard(claude_credentials, baseline, token)
        overrides.update(armed)
        overrides.update(pin_provider(claude_credentials, baseline))
        if token is None and armed:
            # The baseline token is pinned too: a stale one in .env never beats it.
            token = SecretStr(baseline[CLAUDE_OAUTH])
        if token is not None:
            overrides[CLAUDE_OAUTH] = token
        state = CredentialState.create(baseline, overrides, next_generation())
        if state.guard_armed:
            logger.info("subscription auth guard armed: API-key variables are unset for spawns")
        return cls(state, override_file, on_change)

    @property
    def override_file(self) -> OverrideFile:
        """The persisted token file this store writes."""
        return self._file

    @property
    def current(self) -> CredentialState:
        """The state every new spawn uses (one atomic reference read)."""
        return self._state

    async def reload(
        self, token: SecretStr, *, remove_api_key: bool, expected_generation: int | None
    ) -> ReloadResult:
        """Persist `token`, then make it the credential of every next spawn."""
        async with self._lock:
            state = self._state
            if expected_generation is not None and expected_generation != state.generation:
                msg = (
                    f"expected generation {expected_generation}, "
                    f"current generation is {state.generation}"
                )
                raise GenerationMismatch(msg)
            overrides: dict[str, SecretStr | None] = dict(state.overrides)
            overrides[CLAUDE_OAUTH] = token
            if remove_api_key:
                overrides.update(dict.fromkeys(SUBSCRIPTION_SHADOW_KEYS))
            changed = not state.same_overrides(overrides)
            if changed or not await asyncio.to_thread(self._file.holds, token):
                await self._persist(token)
            if not changed:
                return ReloadResult(state, changed=False)
            new = CredentialState.create(
                state.baseline, overrides, next_generation(state.generation)
            )
            self._state = new
            self._on_change(new)
            return ReloadResult(new, changed=True)

    async def _persist(self, token: SecretStr) -> None:
        try:
            # fsync can take a while on a busy disk: keep the event loop serving turns.
            await asyncio.to_thread(self._file.write_atomic, token)
        except OSError as exc:
            reason = exc.strerror or str(exc) or type(exc).__name__
            logger.error("could not persist the rotated token to %s: %s", self._file.path, reason)
            msg = f"could not write the token override file: {reason}"
            raise PersistFailed(msg) from None


def overrides_secrets(overrides: Overrides) -> list[SecretStr]:
    """Every value an override layer sets (for the redactor)."""
    return [value for value in overrides.values() if value is not None]
