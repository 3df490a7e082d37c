"""How a result callback is signed (contract §6.8), for the server that signs and the
controller that checks:

    X-Agent-Server-Signature: t=<unix time>,v1=<hex HMAC-SHA256 of "<t>." + body>

under a key derived from the controller token (which no spawn holds), so the token
itself never signs anything.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable

from pydantic import SecretStr

from agent_server.wire.names import CALLBACK_KEY_LABEL


def callback_key(controller_token: SecretStr) -> bytes:
    """The signing key of callbacks: HMAC-SHA256 of a fixed label under the controller
    token."""
    secret = controller_token.get_secret_value().encode()
    return hmac.new(secret, CALLBACK_KEY_LABEL, hashlib.sha256).digest()


def signature(key: bytes, timestamp: int, chunks: Iterable[bytes]) -> str:
    """The `X-Agent-Server-Signature` value of a body given as `chunks`."""
    mac = hmac.new(key, f"{timestamp}.".encode(), hashlib.sha256)
    for chunk in chunks:
        mac.update(chunk)
    return f"t={timestamp},v1={mac.hexdigest()}"


def parse_signature(header: str) -> tuple[int, str] | None:
    """The `(t, v1)` of a signature header, or None when it has no such fields."""
    fields = dict(part.strip().split("=", 1) for part in header.split(",") if "=" in part)
    stamp, given = fields.get("t", ""), fields.get("v1", "")
    if not stamp.isdigit() or not given:
        return None
    return int(stamp), given
