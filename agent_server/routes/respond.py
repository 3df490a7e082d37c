"""The one gate every answer passes: body and headers through the redactor, then JSON.

Every route and error handler answers through `answer` (and /metrics through
`answer_text`), so no body leaves without `Redactor.clean`: every string masked,
lone surrogates replaced, non-finite numbers null, depth bounded. The JSON is then
always valid, whatever a CLI printed.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from agent_server.redaction import Redactor


def answer(
    request: Request,
    body: Any,
    status_code: int = 200,
    headers: Mapping[str, str] | None = None,
) -> Response:
    """A JSON answer of `body`, redacted and sanitised."""
    redactor: Redactor = request.app.state.redactor
    content = json.dumps(
        redactor.clean(body), ensure_ascii=False, allow_nan=False, separators=(",", ":")
    )
    return Response(
        content.encode("utf-8"),
        status_code=status_code,
        headers=_headers(redactor, headers),
        media_type="application/json",
    )


def answer_text(request: Request, text: str, media_type: str) -> Response:
    """A text answer (Prometheus exposition), redacted."""
    redactor: Redactor = request.app.state.redactor
    return Response(redactor.redact(text).encode("utf-8"), media_type=media_type)


def _headers(redactor: Redactor, headers: Mapping[str, str] | None) -> dict[str, str]:
    return {name: redactor.redact(value) for name, value in (headers or {}).items()}
