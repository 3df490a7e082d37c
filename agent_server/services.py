"""The composition root: every long-lived object of one server, built once and wired.

Nothing below this module imports it. `create_app` hands each route its
collaborators through `app.state`; a turn gets exactly what it uses in `TurnRunner`.
Nothing here is a module global, so every test builds its own.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from pydantic import SecretStr

from agent_server.auth import resolve_controller_token
from agent_server.broker import Broker
from agent_server.config import Settings
from agent_server.credentials.override_file import OverrideFile
from agent_server.credentials.state import CredentialState
from agent_server.credentials.store import CredentialStore, overrides_secrets
from agent_server.execution.chat_session import ChatSession
from agent_server.execution.registry import Registry
from agent_server.execution.turn import TurnRunner
from agent_server.metrics import Metrics
from agent_server.process.group import Reaper
from agent_server.readiness import Readiness
from agent_server.records.callback import CallbackSender
from agent_server.records.pending import PendingResults
from agent_server.records.results import Results
from agent_server.records.retained import RetainedResults
from agent_server.redaction.redactor import Redactor
from agent_server.runtimes import adapter_for
from agent_server.runtimes.base import RuntimeAdapter
from agent_server.spawn_env.builder import SpawnEnvBuilder
from agent_server.spawn_env.dotenv_file import DotenvFile
from agent_server.spawn_env.spawn_files import SpawnFiles
from agent_server.wire.names import CONTROLLER_TOKEN, is_credential_name
from agent_server.wire.signing import callback_key


@dataclass(frozen=True)
class Services:
    """The objects of one server, wired together."""

    settings: Settings
    redactor: Redactor
    metrics: Metrics
    store: CredentialStore
    spawn_envs: SpawnEnvBuilder
    adapter: RuntimeAdapter
    registry: Registry
    chat: ChatSession
    reaper: Reaper
    results: Results
    turns: TurnRunner
    spawn_files: SpawnFiles
    readiness: Readiness
    controller_token: SecretStr | None
    broker: Broker | None = None
    """The credential broker, when the settings ask for it (every runtime's CLI, §4.8)."""

    @classmethod
    def build(
        cls, settings: Settings, redactor: Redactor | None = None, *, serving: bool = True
    ) -> Services:
        """Build and wire everything for `settings`; load the override file.

        `serving=False` (for `agent-server status`) creates no file: no state dir, no
        generated controller token, no sweep of temp files a live server may own.
        """
        redactor = redactor if redactor is not None else Redactor()
        baseline = settings.baseline_env
        redactor.add(baseline[n] for n in baseline if is_credential_name(n))
        redactor.add([settings.auth_token, baseline.get(CONTROLLER_TOKEN), settings.callback_key])
        metrics = Metrics()

        adapter = adapter_for(settings.runtime)
        store = _credential_store(settings, adapter, redactor, metrics, serving=serving)
        controller_token = (
            resolve_controller_token(
                settings.auth_token, settings.insecure_no_auth, settings.state_dir
            )
            if serving
            else settings.auth_token
        )
        redactor.add([controller_token])
        spawn_envs = SpawnEnvBuilder(DotenvFile(settings.env_file, settings.spawn_user), redactor)
        registry = Registry(settings.max_parallel)
        reaper = Reaper(files_as=settings.spawn_user)
        results = _results(settings, redactor, metrics, controller_token)
        spawn_files = SpawnFiles.for_server() if serving else SpawnFiles(None)
        broker = Broker() if serving and settings.broker and adapter.brokered else None
        turns = TurnRunner(
            adapter=adapter,
            store=store,
            spawn_envs=spawn_envs,
            registry=registry,
            metrics=metrics,
            redactor=redactor,
            command=settings.runtime_command,
            workdir=settings.workdir,
            permission_mode=settings.permission_mode,
            max_log_bytes=settings.max_log_bytes,
            reaper=reaper,
            results=results,
            spawn_files=spawn_files,
            launcher=settings.spawn_user.launcher(settings.workdir) if settings.spawn_user else (),
            broker=broker,
            setting_sources=settings.setting_sources,
        )
        return cls(
            settings=settings,
            redactor=redactor,
            metrics=metrics,
            store=store,
            spawn_envs=spawn_envs,
            adapter=adapter,
            registry=registry,
            chat=ChatSession(settings.state_dir / "chat-session-id"),
            reaper=reaper,
            results=results,
            turns=turns,
            spawn_files=spawn_files,
            readiness=_readiness(settings, adapter, store, spawn_envs),
            controller_token=controller_token,
            broker=broker,
        )


def _credential_store(
    settings: Settings,
    adapter: RuntimeAdapter,
    redactor: Redactor,
    metrics: Metrics,
    *,
    serving: bool,
) -> CredentialStore:
    """The credential store at boot; each new state's secrets join the redactor."""

    def remember(state: CredentialState) -> None:
        redactor.add(overrides_secrets(state.overrides))
        redactor.own([str(state.generation)])
        metrics.generation.set(state.generation)

    return CredentialStore.boot(
        adapter.supports_auth_override,
        settings.baseline_env,
        OverrideFile(settings.override_file),
        on_change=remember,
        prepare=serving,
    )


def _results(
    settings: Settings, redactor: Redactor, metrics: Metrics, controller_token: SecretStr | None
) -> Results:
    """Where terminal answers go besides HTTP: retained, and called back when configured."""
    callbacks = (
        CallbackSender(
            backend_url=settings.callback_url,
            agent_name=settings.agent_name,
            key=settings.callback_key,
            signing_key=callback_key(controller_token) if controller_token else None,
            pending=PendingResults(settings.state_dir / "pending-results"),
            metrics=metrics,
        )
        if settings.callback_url and settings.callback_key
        else None
    )
    return Results(RetainedResults(settings.state_dir / "results"), redactor, metrics, callbacks)


def _readiness(
    settings: Settings, adapter: RuntimeAdapter, store: CredentialStore, spawn_envs: SpawnEnvBuilder
) -> Readiness:
    """Whether a turn can run here, judged for the uid the spawns run as."""
    return Readiness(
        adapter,
        store,
        spawn_envs,
        permission_mode=settings.permission_mode,
        spawn_uid=settings.spawn_user.uid if settings.spawn_user else os.geteuid(),
    )
