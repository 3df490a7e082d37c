"""The one gate every answer passes: its body through the redactor, then JSON.

Every route and error handler answers through `answer` (and /metrics through
`answer_text`, a turn's live events through `answer_events`), so no body leaves
without the redactor: every string value masked, lone surrogates replaced,
non-finite numbers null, depth bounded. The JSON is then always valid, whatever a
CLI printed. Headers are the server's own words (a route, a number of seconds) and
pass as they are: nothing the agent writes may mask the protocol (contract §8).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import Response

from agent_server.redaction.redactor import Redactor, Serialised

if TYPE_CHECKING:
    from sse_starlette import ServerSentEvent

SSE_LINE_BREAKS = str.maketrans(
    {"\r": " ", "\n": " "}
    | {char: f"\\u{ord(char):04x}" for char in "\v\f\x1c\x1d\x1e\x85\u2028\u2029"}
)
"""An event's data holds no line break of any reader's: sse-starlette splits at CR and
LF, `httpx.aiter_lines` also at every other break `str.splitlines` knows. CR and LF
are JSON's blanks (a JSON line holds them nowhere else): a space; every other is
written as the `\\u` escape JSON reads back as itself (inside a string, the only
place a JSON line may hold one)."""


def answer(
    request: Request,
    body: Any,
    status_code: int = 200,
    headers: Mapping[str, str] | None = None,
    serialised: Serialised | None = None,
) -> Response:
    """A JSON answer of `body`, redacted and sanitised (`serialised`: as `Redactor.dumps`)."""
    redactor: Redactor = request.app.state.redactor
    return Response(
        redactor.dumps(body, serialised),
        status_code=status_code,
        headers=headers,
        media_type="application/json",
    )


def answer_text(request: Request, text: str, media_type: str) -> Response:
    """A text answer (Prometheus exposition), redacted."""
    redactor: Redactor = request.app.state.redactor
    return Response(redactor.redact(text).encode("utf-8"), media_type=media_type)


SSE_PING_S = 15
"""A comment line this often keeps proxies from closing an idle stream."""


def answer_events(
    request: Request, events: AsyncIterator[tuple[str | None, str, str | None]]
) -> Response:
    """A server-sent event stream of `(name, data, id)`, each data redacted as it goes.

    A subscriber that stops reading is reset by the connection guard's send deadline
    (`client_limits.SEND_TIMEOUT_S`, one INFO line), and the stream then ends as for
    any client that left: no send timeout here, whose error would be a traceback.
    """
    # Imported on first use, as httpx is: an idle server does not hold it (0.4 MiB).
    from sse_starlette import EventSourceResponse, ServerSentEvent

    redactor: Redactor = request.app.state.redactor

    async def clean() -> AsyncIterator[ServerSentEvent]:
        async for name, data, event_id in events:
            safe = redactor.redact(data).translate(SSE_LINE_BREAKS)
            yield ServerSentEvent(safe, event=name, id=event_id)

    return EventSourceResponse(clean(), ping=SSE_PING_S)
