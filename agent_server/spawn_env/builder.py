"""Spawn environments as the server builds them: `.env` read fresh, warnings given once.

`build_spawn_env` is pure; this is the stateful edge around it. It re-reads `.env`
for every spawn (cached by the file's identity), tells the redactor which credential
values `.env` holds now, and warns once per key name about `.env` keys that a
force-unset swallowed or that are protected (contract §4.2).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Container, Iterable, Mapping

from agent_server.logs import logged_name
from agent_server.redaction.redactor import Redactor
from agent_server.spawn_env.dotenv_file import DotenvFile
from agent_server.spawn_env.layers import Overrides, PerSpawn, SpawnEnv, build_spawn_env
from agent_server.wire.names import is_credential_name

logger = logging.getLogger("agent_server.spawn_env")


class OnceWarner:
    """Warns once per key name while the key stays present; again after it returns."""

    def __init__(self, template: str) -> None:
        self._template = template
        self._warned: set[str] = set()

    def observe(self, hits: Iterable[str], present: Container[str]) -> list[str]:
        """Warn for new `hits`; forget keys no longer `present`. Returns the names warned."""
        self._warned = {name for name in self._warned if name in present}
        new = sorted(set(hits) - self._warned)
        for name in new:  # the agent chose it: never logged raw
            logger.warning(self._template, logged_name(name), extra={"key": logged_name(name)})
        self._warned.update(new)
        return new


class SpawnEnvBuilder:
    """Builds each spawn's environment over the current `.env`."""

    def __init__(self, dotenv: DotenvFile, redactor: Redactor) -> None:
        self.dotenv = dotenv
        self._redactor = redactor
        self._redacted: Mapping[str, str] | None = None
        self._suppressed = OnceWarner(
            "spawn env: %s from .env is force-unset by the credential guard"
        )
        self._protected = OnceWarner("spawn env: ignoring protected key %s in .env")
        self._replaced = OnceWarner(
            "spawn env: %s from .env is replaced by the server's credential"
        )
        self._rerouted = OnceWarner(
            "spawn env: %s from .env is not used: .env may not route a credential it did not set"
        )

    async def read_dotenv(self) -> Mapping[str, str]:
        """The current `.env` values; the redactor tracks their credentials.

        An unchanged file costs one `stat` here; a parse runs in a worker thread, so
        a large or hostile `.env` never holds the event loop.
        """
        values = self.dotenv.cached()
        if values is None:
            values = await asyncio.to_thread(self.dotenv.read)
        # The reader hands back the same mapping while the file is unchanged: scan it once.
        if values is not self._redacted:
            self._redactor.track_dotenv(values[n] for n in values if is_credential_name(n))
            self._redacted = values
        return values

    async def build(
        self, baseline: Mapping[str, str], overrides: Overrides, per_spawn: PerSpawn | None = None
    ) -> SpawnEnv:
        """One spawn's env over the current `.env`, warning once per swallowed or protected key."""
        dotenv = await self.read_dotenv()
        spawn = build_spawn_env(baseline, dotenv, overrides, per_spawn)
        self._suppressed.observe(spawn.suppressed, dotenv)
        self._protected.observe(spawn.ignored, dotenv)
        self._replaced.observe(spawn.replaced, dotenv)
        self._rerouted.observe(spawn.rerouted, dotenv)
        return spawn
