"""Controller authentication (contract §2): one shared token, compared in constant time.

Fail closed: with no token configured and no explicit `AGENT_SERVER_INSECURE_NO_AUTH=1`,
`resolve_controller_token` generates one and writes it to a 0600 file whose path
(never the value) is logged; a later start uses the one that file holds.
"""

from __future__ import annotations

import hmac
import json
import logging
import os
import secrets
from pathlib import Path

from pydantic import SecretStr
from starlette.types import ASGIApp, Receive, Scope, Send

from agent_server.secret_file import check_dir, open_bounded, write_secret_file
from agent_server.wire.names import AUTHENTICATED_CONNECTION, CONTROLLER_TOKEN_HEADER
from agent_server.wire.values import token_problem

logger = logging.getLogger("agent_server.auth")

HEADER = CONTROLLER_TOKEN_HEADER.lower().encode()
EXEMPT_PATHS = frozenset({"/health", "/metrics"})
_UNAUTHORIZED = json.dumps({"detail": "Unauthorized"}).encode()
GENERATED_TOKEN_MIN_CHARS = 32
"""A generated token is 43 characters; a file holding less was not generated here."""
GENERATED_TOKEN_MAX_BYTES = 1024


def resolve_controller_token(
    configured: SecretStr | None, insecure: bool, state_dir: Path
) -> SecretStr | None:
    """The token the controller must send, or None when auth is explicitly off."""
    if insecure:
        logger.warning(
            "AGENT_SERVER_INSECURE_NO_AUTH=1: controller authentication is OFF "
            "(local development only)"
        )
        return None
    if configured is not None:
        return configured
    path = state_dir / "agent-auth-token"
    kept = _generated_before(path)
    if kept is not None:
        logger.warning(
            "TRINITY_AGENT_AUTH_TOKEN is not set: using the controller token generated "
            "before, in %s (0600)",
            path,
        )
        return kept
    generated = SecretStr(secrets.token_urlsafe(32))
    try:
        state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        write_secret_file(path, generated.get_secret_value())
        logger.warning(
            "TRINITY_AGENT_AUTH_TOKEN is not set: generated a controller token in %s (0600)", path
        )
    except OSError as exc:
        # Still fail closed: nobody can call the API, which beats an open one.
        logger.error("TRINITY_AGENT_AUTH_TOKEN is not set and %s cannot be written: %s", path, exc)
    return generated


def _generated_before(path: Path) -> SecretStr | None:
    """The token a previous start generated, if the file holds one: the same token across
    restarts, so a `T=$(cat …)` of the README keeps working."""
    try:
        check_dir(path.parent)
        fd, st = open_bounded(path, GENERATED_TOKEN_MAX_BYTES)
        with os.fdopen(fd, "rb") as handle:
            value = handle.read(GENERATED_TOKEN_MAX_BYTES).decode("ascii").strip()
    except (OSError, UnicodeDecodeError):
        return None
    private = st.st_uid == os.geteuid() and not st.st_mode & 0o077
    if not private or len(value) < GENERATED_TOKEN_MIN_CHARS or token_problem(value):
        return None  # not ours, shown to others, or not a token: a new one is generated
    return SecretStr(value)


class ControllerAuth:
    """ASGI middleware: every route but /health, /metrics and OPTIONS needs the token.

    A request that carries the token (on any route; every request when authentication
    is off) marks its connection as the controller's: it keeps its slot at the
    connection cap (contract §8, Slow clients).
    """

    def __init__(self, app: ASGIApp, token: SecretStr | None) -> None:
        self.app = app
        self._expected = token.get_secret_value().encode() if token is not None else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Answer 401 unless the request is exempt or carries the right token."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if self._expected is None or self._authorized(scope):
            _mark_authenticated(scope)
            await self.app(scope, receive, send)
            return
        if scope["method"] == "OPTIONS" or scope["path"] in EXEMPT_PATHS:
            await self.app(scope, receive, send)
            return
        await send(
            {
                "type": "http.response.start",
                "status": 401,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(_UNAUTHORIZED)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": _UNAUTHORIZED})

    def _authorized(self, scope: Scope) -> bool:
        assert self._expected is not None  # noqa: S101 - checked by the caller
        presented = b""
        for name, value in scope["headers"]:
            if name == HEADER:
                presented = value
                break
        return hmac.compare_digest(presented, self._expected)


def _mark_authenticated(scope: Scope) -> None:
    extension = (scope.get("extensions") or {}).get(AUTHENTICATED_CONNECTION)
    if extension is not None:  # served by the guarded protocol (not by an in-process client)
        extension["mark"]()
