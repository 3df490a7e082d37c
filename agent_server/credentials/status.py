"""What the next spawn would authenticate with, and where `.env` and the process differ.

The report of `GET /api/credentials/status` and `agent-server status` (contract §4.5):
pure functions over one credential state and one `.env` parse. Names and
fingerprints of credentials only, never a value.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from agent_server.credentials.state import CredentialState, fingerprint
from agent_server.credentials.store import CredentialStore
from agent_server.spawn_env.layers import SpawnEnv, build_spawn_env
from agent_server.spawn_env.route import effective_credential
from agent_server.wire.credentials import (
    CredentialFiles,
    CredentialStatus,
    DriftRow,
    EffectiveAuth,
    OverrideFileStatus,
)
from agent_server.wire.names import (
    API_KEY,
    AUTH_TOKEN,
    BASE_URL,
    CLAUDE_OAUTH,
    PROVIDER_SWITCHES,
    is_credential_name,
)


def credential_status(
    store: CredentialStore,
    dotenv: Mapping[str, str],
    *,
    agent_name: str,
    runtime: str,
    env_file: Path,
    env_file_problem: str | None = None,
) -> CredentialStatus:
    """The whole status report for the store's current state and this `.env` parse."""
    state = store.current
    preview = spawn_preview(state, dotenv)
    auth = effective_auth(preview)
    info = store.override_file.info()
    return CredentialStatus(
        agent_name=agent_name,
        runtime=runtime,
        generation=state.generation,
        fingerprint=state.fingerprint,
        auth_mode=auth_mode(auth),
        guard_armed=state.guard_armed,
        files=CredentialFiles(
            env_file=str(env_file),
            env_file_problem=env_file_problem,
            override_file=OverrideFileStatus(
                exists=info.exists,
                mode=info.mode,
                size=info.size,
                mtime=info.mtime,
                problem=info.problem,
            ),
        ),
        effective_auth=auth,
        env_drift=env_drift(state, dotenv, preview),
    )


def effective_auth(spawn: SpawnEnv) -> EffectiveAuth | None:
    """Which credential a spawn with this env authenticates with, or None."""
    credential = effective_credential(spawn.env, spawn.sources)
    if credential is None:
        return None
    variable = credential.variable
    return EffectiveAuth(
        variable=variable,
        layer=credential.layer,
        fingerprint=None if variable in PROVIDER_SWITCHES else fingerprint(spawn.env[variable]),
        conflicts=list(credential.others),
    )


def auth_mode(auth: EffectiveAuth | None) -> str:
    """A one-word summary of `auth`: subscription, api_key, gateway, provider or none."""
    if auth is None:
        return "none"
    return {CLAUDE_OAUTH: "subscription", API_KEY: "api_key", AUTH_TOKEN: "gateway"}.get(
        auth.variable, "provider"
    )


def env_drift(state: CredentialState, dotenv: Mapping[str, str], spawn: SpawnEnv) -> list[DriftRow]:
    """One row per `.env` key, baseline credential name and overridden name."""
    baseline = state.baseline
    names = set(dotenv) | set(state.overrides)
    names |= {n for n in baseline if is_credential_name(n) or n in (*PROVIDER_SWITCHES, BASE_URL)}
    names |= spawn.rerouted
    rows = []
    for name in sorted(names):
        in_file, in_env = name in dotenv, name in baseline
        overridden = name in state.overrides
        unset = overridden and state.overrides[name] is None
        rows.append(
            DriftRow(
                key=name,
                in_file=in_file,
                in_process_env=in_env,
                equal=(dotenv[name] == baseline[name]) if in_file and in_env else None,
                overridden_for_spawn=overridden and not unset,
                suppressed_for_spawn=unset or (name in spawn.rerouted and name not in spawn.env),
                spawn_source=spawn.sources.get(name),
                note=_note(name, spawn) if in_file else None,
            )
        )
    return rows


def _note(name: str, spawn: SpawnEnv) -> str | None:
    """Why the next spawn does not take `name` from `.env`, or None when it does."""
    if name in spawn.suppressed:
        return "force-unset: the credential guard removes it"
    if name in spawn.replaced:
        return "replaced by the server's credential"
    if name in spawn.rerouted:
        return "not used: .env may not route a credential it did not set"
    if name in spawn.ignored:
        return "protected: .env may not set it"
    return None


def env_shadow(state: CredentialState, dotenv: Mapping[str, str]) -> list[str]:
    """The `.env` names the next spawn does not take: force-unset or not allowed to route."""
    spawn = spawn_preview(state, dotenv)
    force_unset = {name for name, value in state.overrides.items() if value is None}
    return sorted((force_unset & dotenv.keys()) | spawn.rerouted)


def spawn_preview(state: CredentialState, dotenv: Mapping[str, str]) -> SpawnEnv:
    """The env a plain spawn (no per-spawn override) would get now."""
    return build_spawn_env(state.baseline, dotenv, state.overrides)
