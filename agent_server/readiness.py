"""Whether a turn can run here at all: what makes `/health` say `degraded` (contract §8).

An installed CLI may still refuse every turn: Claude Code as root without
`IS_SANDBOX=1`, a Gemini CLI in restricted mode, a Codex or Gemini CLI with no key,
which no per-turn credential can fix (they take none). Each adapter says why from the
environment a spawn would get and the uid it would run as (`readiness_problems`,
pure); this module feeds it those, once at boot and again after every reload-token,
and keeps the answer for `/health`. Problems name variables and files, never a value.
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Mapping
from pathlib import Path

from agent_server.credentials.store import CredentialStore
from agent_server.runtimes.base import RuntimeAdapter, SpawnHost
from agent_server.spawn_env.builder import SpawnEnvBuilder
from agent_server.spawn_env.layers import build_spawn_env

logger = logging.getLogger("agent_server.readiness")


def runtime_available(command: str) -> bool:
    """True when the runtime command resolves to an executable file."""
    if os.sep in command:
        return os.path.isfile(command) and os.access(command, os.X_OK)
    return shutil.which(command) is not None


class Readiness:
    """The last check of whether a turn could run, and how to check again."""

    def __init__(
        self,
        adapter: RuntimeAdapter,
        store: CredentialStore,
        spawn_envs: SpawnEnvBuilder,
        *,
        permission_mode: str,
        spawn_uid: int,
    ) -> None:
        self._adapter = adapter
        self._store = store
        self._spawn_envs = spawn_envs
        self._host = SpawnHost(uid=spawn_uid, permission_mode=permission_mode, present=Path.exists)
        self.problems: tuple[str, ...] = ()

    async def check(self) -> tuple[str, ...]:
        """Check the next plain spawn's environment now; log what would fail it.

        The environment is built as a spawn's is, but quietly: a spawn warns about `.env`."""
        return self._check(await self._spawn_envs.read_dotenv())

    def check_at_boot(self) -> tuple[str, ...]:
        """`check` before the server serves: `.env` read on the loop, since nothing waits
        on it yet (a worker thread made now would stay, and cost the idle server its
        memory arena)."""
        return self._check(self._spawn_envs.dotenv.read())

    def _check(self, dotenv: Mapping[str, str]) -> tuple[str, ...]:
        state = self._store.current
        spawn = build_spawn_env(state.baseline, dotenv, state.overrides)
        problems = tuple(self._adapter.readiness_problems(spawn.env, self._host))
        if problems != self.problems:
            for problem in problems:
                logger.warning("no turn can run: %s", problem)
            if not problems:
                logger.info("the runtime can run turns again")
        self.problems = problems
        return problems
