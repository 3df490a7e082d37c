"""Who may call the service: the operator's bearer, and each agent's own for its heartbeat.

Tokens are compared in constant time (`hmac.compare_digest`), as bytes; a missing,
malformed or wrong header is the same 401, which names no token.
"""

from __future__ import annotations

import hmac

from pydantic import SecretStr
from starlette.requests import Request

BEARER = "Bearer "


def presented(request: Request) -> str | None:
    """The bearer token of `Authorization: Bearer …`, if the request carries one."""
    header = request.headers.get("authorization", "")
    if not header.startswith(BEARER):
        return None
    return header.removeprefix(BEARER).strip() or None


def bearer_matches(request: Request, expected: SecretStr) -> bool:
    """The request carries exactly `expected` as its bearer (constant-time compare)."""
    given = presented(request)
    if given is None:
        return False
    return hmac.compare_digest(given.encode(), expected.get_secret_value().encode())
