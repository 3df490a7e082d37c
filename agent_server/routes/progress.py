"""A turn's live events (contract §6.7): `…/events` names them, `…/stream` is Trinity's shape."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

from starlette.requests import Request
from starlette.responses import Response

from agent_server.errors import NotFound
from agent_server.execution.registry import Registry
from agent_server.records.progress import STREAM_END, Progress
from agent_server.routes.respond import answer_events

_STREAM_END_DATA = json.dumps({"type": STREAM_END}, separators=(",", ":"))


async def events(request: Request) -> Response:
    """Server-sent events named by the CLI's event type, `id` their sequence number; a
    reconnecting client's `Last-Event-ID` resumes after it. The last is `terminal`."""
    progress = _progress(request)
    after = _last_event_id(request)

    async def named() -> AsyncIterator[tuple[str | None, str, str | None]]:
        async for event in progress.follow(after):
            yield event.name, event.data, str(event.seq)

    return answer_events(request, named())


async def stream(request: Request) -> Response:
    """The same events unnamed, then `{"type": "stream_end"}`, as Trinity's agent streams."""
    progress = _progress(request)

    async def unnamed() -> AsyncIterator[tuple[str | None, str, str | None]]:
        async for event in progress.follow():
            yield None, event.data, None
        yield None, _STREAM_END_DATA, None

    return answer_events(request, unnamed())


def _progress(request: Request) -> Progress:
    registry: Registry = request.app.state.registry
    execution_id = request.path_params["execution_id"]
    progress = registry.progress(execution_id)
    if progress is None:
        msg = f"no running or recently finished execution {execution_id}"
        raise NotFound(msg)
    return progress


def _last_event_id(request: Request) -> int:
    value = request.headers.get("last-event-id", "").strip()
    return int(value) if value.isdigit() and len(value) < 19 else 0
