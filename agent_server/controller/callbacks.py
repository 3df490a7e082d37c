"""Checking a result callback's signature: was it the server that sent it (contract §6.8)?

The agent holds the callback's bearer key (its own tools use it) and can POST an
envelope of its own. The server signs each callback under a key only the controller
and the server can make (derived from the controller token, which no spawn holds):

    X-Agent-Server-Signature: t=<unix time>,v1=<hex HMAC-SHA256 of "<t>." + body>

A controller's callback endpoint verifies it before it believes the envelope:

    if not signed_by_server(await request.body(), request.headers.get(...), token):
        return 403
"""

from __future__ import annotations

import hmac
import time

from pydantic import SecretStr

from agent_server.wire.signing import callback_key, parse_signature, signature

MAX_AGE_S = 24 * 3600
"""A signature older than this is refused (a pending result is kept at most 6 hours,
and its re-send is signed again)."""


def signed_by_server(
    body: bytes,
    header: str | None,
    controller_token: SecretStr,
    *,
    max_age_s: float = MAX_AGE_S,
    now: float | None = None,
) -> bool:
    """True when `header` (the `X-Agent-Server-Signature` value) signs `body` under the
    callback key of `controller_token`, and is no older than `max_age_s`."""
    if not header:
        return False
    parsed = parse_signature(header)
    if parsed is None:
        return False
    stamp, given = parsed
    if abs((time.time() if now is None else now) - stamp) > max_age_s:
        return False
    expected = signature(callback_key(controller_token), stamp, (body,))
    return hmac.compare_digest(expected, f"t={stamp},v1={given}")
