"""Async turns' results, delivered to the controller durably (contract §6.8).

The envelope is written to `pending-results/<id>.json` (0600, crash-safe) before the
first POST, so no result is lost to a crash of either side. Delivery is
`POST {TRINITY_BACKEND_URL}/api/agents/{agent}/executions/{id}/result` with
`Authorization: Bearer {TRINITY_MCP_API_KEY}`:

- a 2xx is delivered, and a permanent refusal (400, 401, 403, 404, 409, 413, 422)
  will never change: either way the pending file is deleted;
- anything else (a 5xx, 429, no connection, 15 s without an answer) is retried after
  a decorrelated-jitter pause (uniform between 1 s and three times the last pause, at
  most 60 s, never shorter than the answer's `Retry-After`) until the turn's lease
  deadline; past it the file is kept for the next start;
- at start, every kept file is sent again after a jittered pause of up to 5 s, with
  a window of at least 3 minutes; files older than the retention TTL are dropped.

A 2xx deletes the file before anything else happens, so a delivered result is sent
again only when the server dies between the controller's 2xx and that unlink (the
controller answers such a replay `200 {replayed: true}`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from pydantic import SecretStr

from agent_server.metrics import Metrics
from agent_server.records.retained import RESULT_TTL_S
from agent_server.secret_file import check_dir, read_json_file, write_json_file

if TYPE_CHECKING:
    import httpx

logger = logging.getLogger("agent_server.callback")

PERMANENT_STATUSES = frozenset({400, 401, 403, 404, 409, 413, 422})
ATTEMPT_TIMEOUT_S = 15.0
FIRST_PAUSE_S = 1.0
MAX_PAUSE_S = 60.0
SWEEP_JITTER_S = 5.0
SWEEP_WINDOW_S = 180.0
MAX_PENDING_BYTES = 64 * 1024 * 1024


class CallbackSender:
    """Sends the envelopes of async turns to one controller, and keeps them until sent."""

    def __init__(
        self,
        *,
        backend_url: str,
        agent_name: str,
        key: SecretStr,
        directory: Path,
        metrics: Metrics,
        pause: Callable[[float, float], float] = random.uniform,
    ) -> None:
        self.backend_url = backend_url.rstrip("/")
        self.agent_name = agent_name
        self.key = key
        self.directory = directory
        self.metrics = metrics
        self.pause = pause
        self._tasks: set[asyncio.Task[None]] = set()
        self._client: httpx.AsyncClient | None = None
        self._own: set[str] = set()
        """Ids whose result this run persisted and is delivering: the sweep leaves them."""

    def url(self, execution_id: str) -> str:
        """Where the result of `execution_id` is POSTed."""
        agent = quote(self.agent_name, safe="")
        return f"{self.backend_url}/api/agents/{agent}/executions/{execution_id}/result"

    async def persist(self, envelope: dict[str, Any], deadline: float) -> None:
        """Write the pending file of `envelope` (raises OSError when it cannot)."""
        record = {"deadline": deadline, "envelope": envelope}
        path = self._path(envelope["execution_id"])
        self._own.add(envelope["execution_id"])
        await asyncio.to_thread(_write, path, record)

    def deliver_later(self, envelope: dict[str, Any], deadline: float) -> None:
        """Deliver `envelope` in the background (already persisted)."""
        self._spawn(self._deliver(envelope, deadline))

    def sweep_later(self) -> None:
        """Re-send, in the background, every envelope a previous run kept."""
        self._spawn(self._sweep())

    async def close(self, budget_s: float) -> None:
        """Give deliveries in flight `budget_s`, then stop them (their files stay)."""
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=budget_s)
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=1.0)
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    async def _deliver(self, envelope: dict[str, Any], deadline: float) -> None:
        try:
            await self._attempts(envelope, deadline)
        finally:
            self._own.discard(envelope["execution_id"])

    async def _attempts(self, envelope: dict[str, Any], deadline: float) -> None:
        execution_id = envelope["execution_id"]
        last_pause = FIRST_PAUSE_S
        attempt = 0
        while True:
            attempt += 1
            status, retry_after = await self._post(execution_id, envelope)
            if status is not None and (200 <= status < 300 or status in PERMANENT_STATUSES):
                await asyncio.to_thread(_unlink, self._path(execution_id))
                result = "delivered" if status < 300 else "rejected"
                self.metrics.callbacks.labels(result=result).inc()
                log = logger.info if status < 300 else logger.warning
                log(
                    "result callback %s: HTTP %d after %d attempt(s)",
                    result,
                    status,
                    attempt,
                    extra={"execution_id": execution_id},
                )
                return
            last_pause = min(MAX_PAUSE_S, self.pause(FIRST_PAUSE_S, last_pause * 3))
            wait = max(last_pause, retry_after or 0.0)
            if time.time() + wait > deadline:
                self.metrics.callbacks.labels(result="kept").inc()
                logger.warning(
                    "result callback not delivered by its deadline (last: %s); kept for the "
                    "next start",
                    f"HTTP {status}" if status is not None else "no answer",
                    extra={"execution_id": execution_id},
                )
                return
            await asyncio.sleep(wait)

    async def _post(
        self, execution_id: str, envelope: dict[str, Any]
    ) -> tuple[int | None, float | None]:
        """One attempt: the status (None without an answer) and its Retry-After."""
        # Imported on first use: a server without callbacks never pays its start-up
        # time and memory (about 0.1 s and 5 MiB with what httpx pulls in).
        import httpx

        if self._client is None:
            self._client = httpx.AsyncClient(timeout=ATTEMPT_TIMEOUT_S)
        headers = {"Authorization": f"Bearer {self.key.get_secret_value()}"}
        try:
            response = await self._client.post(
                self.url(execution_id), json=envelope, headers=headers
            )
        except httpx.HTTPError as exc:
            logger.info(
                "result callback attempt failed: %s",
                type(exc).__name__,
                extra={"execution_id": execution_id},
            )
            return None, None
        return response.status_code, _retry_after(response.headers.get("retry-after"))

    async def _sweep(self) -> None:
        await asyncio.sleep(self.pause(0.0, SWEEP_JITTER_S))
        for path, record in await asyncio.to_thread(self._kept):
            envelope = record.get("envelope")
            if not isinstance(envelope, dict) or self._path_of(envelope) != path:
                logger.warning("pending result %s is unreadable; dropped", path.name)
                await asyncio.to_thread(_unlink, path)
                continue
            # This run's own result (persisted since the listing) has a delivery of its
            # own: a file gone, or an id in `_own`, is never sent twice. Its delivery
            # deletes the file before it leaves `_own`.
            if envelope["execution_id"] in self._own or not path.exists():
                continue
            stored = record.get("deadline")
            deadline = max(stored if isinstance(stored, int | float) else 0.0, time.time())
            await self._deliver(envelope, max(deadline, time.time() + SWEEP_WINDOW_S))

    def _kept(self) -> list[tuple[Path, dict[str, Any]]]:
        """The kept records, oldest first; those past the retention TTL are deleted."""
        try:
            check_dir(self.directory)
            entries = sorted(os.scandir(self.directory), key=lambda e: e.name)
        except OSError:
            return []
        kept = []
        for entry in entries:
            if not entry.name.endswith(".json"):
                continue
            path = Path(entry.path)
            record = read_json_file(path, MAX_PENDING_BYTES)
            if record is None or time.time() - path.stat().st_mtime > RESULT_TTL_S:
                _unlink(path)
                continue
            kept.append((path, record))
        return kept

    def _path(self, execution_id: str) -> Path:
        return self.directory / f"{execution_id}.json"

    def _path_of(self, envelope: dict[str, Any]) -> Path | None:
        execution_id = envelope.get("execution_id")
        return self._path(execution_id) if isinstance(execution_id, str) else None

    def _spawn(self, work: Any) -> None:
        task = asyncio.create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


def _retry_after(value: str | None) -> float | None:
    """Seconds from a `Retry-After` of whole seconds (an HTTP date is ignored)."""
    if value is None or not value.strip().isdigit():
        return None
    return float(value.strip())


def _write(path: Path, record: dict[str, Any]) -> None:
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    write_json_file(path, record)


def _unlink(path: Path | None) -> None:
    if path is not None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
