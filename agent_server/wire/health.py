"""The health schema (contract §8): `/health`, what a probe and an operator read."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel

from agent_server.wire.names import AuthOverrideKind


class Capabilities(BaseModel):
    """What this server can do for the controller."""

    auth_override: list[AuthOverrideKind]
    """The `auth_override` kinds this runtime takes (none for Codex and Gemini CLI)."""
    turn_options: list[str]
    """The optional turn fields this runtime honours."""
    not_enforced: list[str] = []
    """The turn fields it takes without enforcing them; asking for any other is a 422."""
    reload_token: bool = True
    credential_status: bool = True


class Health(BaseModel):
    """`GET /health`: always 200 while serving; the body says what is wrong."""

    status: Literal["ok", "degraded"]
    problems: list[str] = []
    """Why no turn can run here (`degraded`): names of variables and files, never values."""
    agent_name: str
    runtime: str
    runtime_available: bool
    version: str
    active_executions: int
    auth: Literal["token", "insecure"]
    isolation: Literal["same_uid", "spawn_user"]
    """`spawn_user`: turns run as another user than the server (contract §10)."""
    spawn_user: str | None = None
    """That user's name, when separated."""
    containment: Literal["subreaper_sweep", "process_group"]
    """What ends a turn's processes (contract §10): `subreaper_sweep`, its group and
    every process that left it; `process_group`, its group only."""
    capabilities: Capabilities
