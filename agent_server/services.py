"""The long-lived objects of one server, built once from its settings.

Routes reach them through `request.app.state.services`; nothing here is a module
global, so every test builds its own.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field

from pydantic import SecretStr

from agent_server.auth import resolve_controller_token
from agent_server.config import Settings
from agent_server.credentials.override_file import OverrideFile
from agent_server.credentials.state import CredentialState
from agent_server.credentials.store import CredentialStore, overrides_secrets
from agent_server.execution.chat_session import ChatSession
from agent_server.execution.registry import Registry
from agent_server.metrics import Metrics
from agent_server.redaction import Redactor
from agent_server.runtimes import adapter_for
from agent_server.runtimes.base import RuntimeAdapter
from agent_server.spawn_env.dotenv_file import DotenvFile
from agent_server.spawn_env.layers import (
    CONTROLLER_TOKEN,
    OnceWarner,
    PerSpawn,
    SpawnEnv,
    build_spawn_env,
    is_credential_name,
)

logger = logging.getLogger("agent_server.spawn_env")


@dataclass
class Services:
    """Settings, redactor, `.env`, and the credential store of one server."""

    settings: Settings
    redactor: Redactor
    dotenv: DotenvFile
    store: CredentialStore
    controller_token: SecretStr | None
    adapter: RuntimeAdapter
    registry: Registry
    metrics: Metrics
    chat: ChatSession
    _redacted_dotenv: Mapping[str, str] | None = field(default=None, init=False)
    _suppressed_warner: OnceWarner = field(init=False)
    _protected_warner: OnceWarner = field(init=False)

    def __post_init__(self) -> None:
        self._suppressed_warner = OnceWarner(
            logger, "spawn env: %s from .env is force-unset by the credential guard"
        )
        self._protected_warner = OnceWarner(logger, "spawn env: ignoring protected key %s in .env")

    @classmethod
    def build(
        cls, settings: Settings, redactor: Redactor | None = None, *, serving: bool = True
    ) -> Services:
        """Create the `.env` reader and credential store; load the override file.

        `serving=False` (for `agent-server status`) never generates a controller token.
        """
        redactor = redactor or Redactor()
        redactor.add(
            settings.baseline_env[n] for n in settings.baseline_env if is_credential_name(n)
        )
        redactor.add([settings.auth_token, settings.baseline_env.get(CONTROLLER_TOKEN)])

        metrics = Metrics()

        def remember(state: CredentialState) -> None:
            redactor.add(overrides_secrets(state.overrides))
            metrics.generation.set(state.generation)

        store = CredentialStore.boot(
            settings.runtime,
            settings.baseline_env,
            OverrideFile(settings.override_file),
            on_change=remember,
            prepare=serving,
        )
        controller_token = (
            resolve_controller_token(
                settings.auth_token, settings.insecure_no_auth, settings.state_dir
            )
            if serving
            else settings.auth_token
        )
        redactor.add([controller_token])
        return cls(
            settings,
            redactor,
            DotenvFile(settings.env_file),
            store,
            controller_token,
            adapter_for(settings.runtime),
            Registry(settings.max_parallel),
            metrics,
            ChatSession(settings.state_dir / "chat-session-id"),
        )

    @property
    def supports_auth_override(self) -> bool:
        """True when the runtime can take a Claude credential for one spawn."""
        return self.adapter.supports_auth_override

    def active_executions(self) -> int:
        """How many turns are running now."""
        return len(self.registry)

    def read_dotenv(self) -> Mapping[str, str]:
        """The current `.env` values; their credentials join the redactor."""
        values = self.dotenv.read()
        # The reader hands back the same mapping while the file is unchanged: scan it once.
        if values is not self._redacted_dotenv:
            self.redactor.add(values[n] for n in values if is_credential_name(n))
            self._redacted_dotenv = values
        return values

    def spawn_env(self, state: CredentialState, per_spawn: PerSpawn | None = None) -> SpawnEnv:
        """Build one spawn's env over `state`, warning once per suppressed or protected key."""
        dotenv = self.read_dotenv()
        spawn = build_spawn_env(state.baseline, dotenv, state.overrides, per_spawn)
        self._suppressed_warner.observe(spawn.suppressed, dotenv)
        self._protected_warner.observe(spawn.ignored, dotenv)
        return spawn
