"""Async turns' results, delivered to the controller durably and signed (contract §6.8).

The body is written to `pending-results/<id>.json` (`pending.PendingResults`) before
the first POST, so no result is lost to a crash of either side. Delivery is
`POST {TRINITY_BACKEND_URL}/api/agents/{agent}/executions/{id}/result` with
`Authorization: Bearer {TRINITY_MCP_API_KEY}` and `X-Agent-Server-Signature:
t=<unix time>,v1=<hex>`, HMAC-SHA256 of `<t>.<body>` under a key derived from the
controller token, which no spawn holds: the agent has the bearer key (its own tools
use it) and can POST an envelope of its own, but never one the controller verifies.

- a 2xx is delivered, and a permanent refusal (400, 401, 403, 404, 409, 413, 422)
  will never change: either way the pending file is deleted;
- anything else (a 5xx, 429, no connection, 15 s without an answer) is retried after
  a decorrelated-jitter pause (uniform between 1 s and three times the last pause, at
  most 60 s, never shorter than the answer's `Retry-After`) until the turn's lease
  deadline; past it the file is kept for the next start;
- at start, every kept file is sent again after a jittered pause of up to 5 s, with
  a window of at least 3 minutes, its body streamed from the file.

A 2xx deletes the file before anything else happens, so a delivered result is sent
again only when the server dies between the controller's 2xx and that unlink (the
controller answers such a replay `200 {replayed: true}`).
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from pydantic import SecretStr

from agent_server.metrics import Metrics
from agent_server.records.pending import PendingResults
from agent_server.wire.names import CALLBACK_SIGNATURE_HEADER
from agent_server.wire.signing import signature

if TYPE_CHECKING:
    import httpx

logger = logging.getLogger("agent_server.callback")

PERMANENT_STATUSES = frozenset({400, 401, 403, 404, 409, 413, 422})
ATTEMPT_TIMEOUT_S = 15.0
FIRST_PAUSE_S = 1.0
MAX_PAUSE_S = 60.0
SWEEP_JITTER_S = 5.0
SWEEP_WINDOW_S = 180.0

Body = bytes | Callable[[], tuple[int, Iterator[bytes]] | None]
"""What a delivery sends: the body in memory, or how to open a kept one (size, chunks)."""


class CallbackSender:
    """Sends the envelopes of async turns to one controller, and keeps them until sent."""

    def __init__(
        self,
        *,
        backend_url: str,
        agent_name: str,
        key: SecretStr,
        signing_key: bytes | None,
        pending: PendingResults,
        metrics: Metrics,
        pause: Callable[[float, float], float] = random.uniform,
    ) -> None:
        self.backend_url = backend_url.rstrip("/")
        self.agent_name = agent_name
        self.key = key
        self.signing_key = signing_key
        self.pending = pending
        self.metrics = metrics
        self.pause = pause
        self._tasks: set[asyncio.Task[None]] = set()
        self._client: httpx.AsyncClient | None = None
        self._own: set[str] = set()
        """Ids whose result this run persisted and is delivering: the sweep leaves them."""

    def url(self, execution_id: str) -> str:
        """Where the result of `execution_id` is POSTed (a validated execution id)."""
        agent = quote(self.agent_name, safe="")
        return f"{self.backend_url}/api/agents/{agent}/executions/{execution_id}/result"

    async def persist(self, execution_id: str, body: bytes, deadline: float) -> None:
        """Write the pending file of `execution_id` (raises OSError when it cannot)."""
        self._own.add(execution_id)
        await asyncio.to_thread(self.pending.write, execution_id, deadline, body)

    def deliver_later(self, execution_id: str, body: bytes, deadline: float) -> None:
        """Deliver `body` in the background (persisted already, or not at all)."""
        self._own.add(execution_id)
        self._spawn(self._deliver(execution_id, body, deadline))

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

    async def _deliver(self, execution_id: str, body: Body, deadline: float) -> None:
        try:
            await self._attempts(execution_id, body, deadline)
        finally:
            self._own.discard(execution_id)

    async def _attempts(self, execution_id: str, body: Body, deadline: float) -> None:
        last_pause = FIRST_PAUSE_S
        attempt = 0
        while True:
            attempt += 1
            try:
                status, retry_after = await self._post(execution_id, body)
            except _Gone:
                logger.warning(
                    "pending result is gone or unsound; dropped",
                    extra={"execution_id": execution_id},
                )
                return
            if status is not None and (200 <= status < 300 or status in PERMANENT_STATUSES):
                await asyncio.to_thread(self.pending.remove, execution_id)
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

    async def _post(self, execution_id: str, body: Body) -> tuple[int | None, float | None]:
        """One attempt: the status (None without an answer) and its Retry-After; `_Gone`
        when a kept body is no longer there to send."""
        # Imported on first use: a server without callbacks never pays its start-up
        # time and memory (about 0.1 s and 5 MiB with what httpx pulls in).
        import httpx

        if self._client is None:
            self._client = httpx.AsyncClient(timeout=ATTEMPT_TIMEOUT_S)
        headers = {
            "Authorization": f"Bearer {self.key.get_secret_value()}",
            "Content-Type": "application/json",
        }
        content: bytes | AsyncIterator[bytes]
        if isinstance(body, bytes):
            content = body
            if self.signing_key is not None:
                headers[CALLBACK_SIGNATURE_HEADER] = signature(
                    self.signing_key, int(time.time()), (body,)
                )
        else:
            opened = await self._open_kept(body, headers)
            if opened is None:
                raise _Gone
            content = opened
        try:
            response = await self._client.post(
                self.url(execution_id), content=content, headers=headers
            )
        except httpx.HTTPError as exc:
            logger.info(
                "result callback attempt failed: %s",
                type(exc).__name__,
                extra={"execution_id": execution_id},
            )
            return None, None
        return response.status_code, _retry_after(response.headers.get("retry-after"))

    async def _open_kept(
        self, opener: Callable[[], tuple[int, Iterator[bytes]] | None], headers: dict[str, str]
    ) -> AsyncIterator[bytes] | None:
        """A kept body as a stream, its length and signature in `headers` (the signature
        is a first pass over the file, the POST a second)."""
        if self.signing_key is not None:
            key = self.signing_key
            stamp = int(time.time())

            def sign() -> str | None:
                opened = opener()
                return None if opened is None else signature(key, stamp, opened[1])

            signed = await asyncio.to_thread(sign)
            if signed is None:
                return None
            headers[CALLBACK_SIGNATURE_HEADER] = signed
        opened = await asyncio.to_thread(opener)
        if opened is None:
            return None
        size, chunks = opened
        headers["Content-Length"] = str(size)
        return _in_threads(chunks)

    async def _sweep(self) -> None:
        await asyncio.sleep(self.pause(0.0, SWEEP_JITTER_S))
        for kept in await asyncio.to_thread(self.pending.kept):
            # This run's own result (persisted since the listing) has a delivery of its
            # own: an id in `_own` is never sent twice. Its delivery deletes the file
            # before it leaves `_own`.
            if kept.execution_id in self._own:
                continue
            deadline = max(kept.deadline, time.time() + SWEEP_WINDOW_S)
            opener = _opener(self.pending, kept.execution_id)
            await self._deliver(kept.execution_id, opener, deadline)

    def _spawn(self, work: Any) -> None:
        task = asyncio.create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


class _Gone(Exception):
    """A kept body vanished, or turned unsound, since it was listed."""


def _opener(
    pending: PendingResults, execution_id: str
) -> Callable[[], tuple[int, Iterator[bytes]] | None]:
    return lambda: pending.body(execution_id)


async def _in_threads(chunks: Iterator[bytes]) -> AsyncIterator[bytes]:
    """`chunks` read in a worker thread, one at a time: the loop never reads the file."""
    try:
        while (chunk := await asyncio.to_thread(next, chunks, None)) is not None:
            yield chunk
    finally:
        close = getattr(chunks, "close", None)
        if close is not None:
            close()


def _retry_after(value: str | None) -> float | None:
    """Seconds from a `Retry-After` of whole seconds (an HTTP date is ignored)."""
    if value is None or not value.strip().isdigit():
        return None
    return float(value.strip())
