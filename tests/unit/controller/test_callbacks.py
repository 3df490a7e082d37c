"""The controller's check of a callback's signature, against the server's own signing."""

from __future__ import annotations

import time

import pytest
from pydantic import SecretStr

from agent_server.controller.callbacks import signed_by_server
from agent_server.wire.signing import callback_key, signature

TOKEN = SecretStr("unit-controller-token-0123456789")
BODY = b'{"execution_id":"e-1","status":"success","response":"done"}'


def _signed(body: bytes = BODY, token: SecretStr = TOKEN, at: int | None = None) -> str:
    return signature(callback_key(token), int(time.time()) if at is None else at, (body,))


def test_the_servers_signature_checks_out() -> None:
    """What the server sends, the controller believes."""
    assert signed_by_server(BODY, _signed(), TOKEN)


@pytest.mark.parametrize(
    ("body", "header"),
    [
        pytest.param(BODY, None, id="no signature: the agent's own POST"),
        pytest.param(BODY, "t=1,v1=" + "0" * 64, id="a made-up signature"),
        pytest.param(BODY.replace(b"done", b"forged"), "server", id="a body changed after"),
        pytest.param(BODY, "other-token", id="signed under another controller token"),
        pytest.param(BODY, "stale", id="signed two days ago"),
        pytest.param(BODY, "garbage", id="not a signature at all"),
    ],
)
def test_anything_else_is_refused(body: bytes, header: str | None) -> None:
    """Forged, altered, foreign, stale or malformed: not the server's."""
    made = {
        "server": _signed(),
        "other-token": _signed(token=SecretStr("another-controller-token-0123456")),
        "stale": _signed(at=int(time.time()) - 2 * 24 * 3600),
        "garbage": "v1=zz,t=soon",
    }
    assert not signed_by_server(body, made.get(header or "", header), TOKEN)
