"""The server's liveness to its controller: a heartbeat POSTed every few seconds.

When `TRINITY_BACKEND_URL` and `TRINITY_MCP_API_KEY` are set, the server POSTs
`/api/agents/{name}/heartbeat` with `memory_mb`, `active_executions`, `uptime_s` and
up to `MAX_EXECUTIONS` running turns (`execution_id`, `tool`, `summary`, `since`).
The running turns come from a snapshot callable given by the composition root (this
layer may not import execution). Tool names and summaries are agent output: bounded,
stripped of control characters and redacted here. A heartbeat never blocks a turn and
fails silently (a DEBUG line and a counter).

The interval is `INTERVAL_S` unless `AGENT_SERVER_HEARTBEAT_INTERVAL_S` says otherwise
(config.py bounds it to `MIN_INTERVAL_S`..`MAX_INTERVAL_S`): a controller that wants
liveness sooner, or a test that cannot wait 5 s a beat.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import SecretStr

from agent_server.metrics import Metrics

logger = logging.getLogger(__name__)

INTERVAL_S = 5.0
"""How often the heartbeat is sent."""
MIN_INTERVAL_S = 0.5
"""No faster: a beat a turn's tool change would flood the controller."""
MAX_INTERVAL_S = 300.0
"""No slower: a controller would take the agent for dead."""
ATTEMPT_TIMEOUT_S = 2.0
"""How long one heartbeat may take; a slow controller never holds the next one up."""
STOP_S = 1.0
"""How long stopping the sender may take at shutdown."""
MAX_EXECUTIONS = 20
SUMMARY_CHARS = 120
TOOL_CHARS = 64

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


@dataclass(frozen=True)
class RunningTurn:
    """One running turn as the heartbeat reports it (text fields still raw)."""

    execution_id: str
    tool: str | None
    summary: str | None
    since: str


def bounded(text: str | None, limit: int, redact: Callable[[str], str]) -> str | None:
    """`text` without control characters, redacted, then cut to `limit` characters."""
    if text is None:
        return None
    return redact(_CONTROL.sub(" ", text))[:limit]


def heartbeat_body(
    turns: Sequence[RunningTurn], started: float, redact: Callable[[str], str]
) -> dict[str, Any]:
    """The JSON body of one heartbeat."""
    return {
        "memory_mb": _memory_mb(),
        "active_executions": len(turns),
        "uptime_s": round(time.monotonic() - started, 1),
        "executions": [
            {
                "execution_id": turn.execution_id,
                "tool": bounded(turn.tool, TOOL_CHARS, redact),
                "summary": bounded(turn.summary, SUMMARY_CHARS, redact),
                "since": turn.since,
            }
            for turn in turns[:MAX_EXECUTIONS]
        ],
    }


class Heartbeat:
    """Sends the heartbeat in a background task until stopped."""

    def __init__(
        self,
        url: str,
        key: SecretStr,
        running: Callable[[], Sequence[RunningTurn]],
        redact: Callable[[str], str],
        interval_s: float = INTERVAL_S,
        metrics: Metrics | None = None,
    ) -> None:
        self.url = url
        self._key = key
        self._running = running
        self._redact = redact
        self._interval_s = interval_s
        self._started = time.monotonic()
        self._task: asyncio.Task[None] | None = None
        self._metrics = metrics
        self.failures = 0

    def start(self) -> None:
        """Begin sending (on the running loop)."""
        self._task = asyncio.get_running_loop().create_task(self._loop())

    async def stop(self) -> None:
        """Stop sending within `STOP_S`, whatever the controller does."""
        if self._task is None:
            return
        self._task.cancel()
        await asyncio.wait({self._task}, timeout=STOP_S)
        self._task = None

    async def _loop(self) -> None:
        # httpx is imported here: an agent without a controller never pays for it.
        import httpx

        headers = {"Authorization": f"Bearer {self._key.get_secret_value()}"}
        async with httpx.AsyncClient(timeout=ATTEMPT_TIMEOUT_S) as client:
            while True:
                body = heartbeat_body(self._running(), self._started, self._redact)
                try:
                    answer = await client.post(self.url, json=body, headers=headers)
                    outcome = None if answer.is_success else f"HTTP {answer.status_code}"
                except (httpx.HTTPError, OSError) as exc:
                    outcome = type(exc).__name__
                if outcome is not None:
                    self.failures += 1
                    logger.debug("heartbeat not delivered: %s", outcome)
                if self._metrics is not None:
                    result = "sent" if outcome is None else "failed"
                    self._metrics.heartbeats.labels(result=result).inc()
                await asyncio.sleep(self._interval_s)


def heartbeat_url(backend_url: str, agent_name: str) -> str:
    """Where the heartbeat of `agent_name` goes."""
    return f"{backend_url.rstrip('/')}/api/agents/{agent_name}/heartbeat"


def _memory_mb() -> float | None:
    try:
        with open("/proc/self/statm", encoding="ascii") as statm:
            pages = int(statm.read().split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return round(pages * 4096 / 2**20, 1)
