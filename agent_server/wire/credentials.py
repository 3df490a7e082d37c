"""The credential schemas (contract §3, §4): reload-token, and the status report."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, SecretStr

from agent_server.wire.names import Layer
from agent_server.wire.values import TOKEN_SCHEMA, Strict


class ReloadTokenRequest(Strict):
    """`POST /api/credentials/reload-token`."""

    # The schema says what a token is; the route answers a blank one 400 token_required,
    # anything else that cannot be a token 400 token_invalid.
    token: Annotated[SecretStr, TOKEN_SCHEMA]
    remove_api_key: bool = False
    expected_generation: int | None = None


class ReloadTokenResponse(BaseModel):
    """A reload that took effect (or was already in effect: `changed: false`)."""

    status: Literal["success"] = "success"
    reloaded: Literal[True] = True
    changed: bool
    generation: int
    fingerprint: str
    persisted: Literal[True] = True
    env_shadow: list[str]


class OverrideFileStatus(BaseModel):
    """The override file's metadata, never its content."""

    exists: bool
    mode: str | None = None
    size: int | None = None
    mtime: float | None = None
    problem: str | None = None
    """Why the file is not used (e.g. a FIFO, a symlink), or null."""


class CredentialFiles(BaseModel):
    """Where the credential inputs live."""

    env_file: str
    env_file_problem: str | None = None
    """Why `.env` counts as empty or lost lines (a FIFO, over 1 MiB, NUL bytes), or null."""
    override_file: OverrideFileStatus


class EffectiveAuth(BaseModel):
    """The credential the next spawn authenticates with."""

    variable: str
    layer: Layer
    fingerprint: str | None
    conflicts: list[str]


class DriftRow(BaseModel):
    """One name's presence across `.env`, the process env and the spawn env."""

    key: str
    in_file: bool
    in_process_env: bool
    equal: bool | None
    overridden_for_spawn: bool
    suppressed_for_spawn: bool
    spawn_source: Layer | None
    note: str | None = None
    """Why the spawn does not take the name from `.env`, when it does not (in words)."""


class CredentialStatus(BaseModel):
    """`GET /api/credentials/status`."""

    agent_name: str
    runtime: str
    generation: int
    fingerprint: str | None
    auth_mode: str
    guard_armed: bool
    files: CredentialFiles
    effective_auth: EffectiveAuth | None
    env_drift: list[DriftRow]
