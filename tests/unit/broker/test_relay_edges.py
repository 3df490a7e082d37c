"""Answers an API should not send, relayed so the CLI is never told a cut answer is whole.

The upstream is a raw loopback listener on the test's loop that writes exact bytes and
closes, so each framing case is what the broker sees.
"""

from __future__ import annotations

import asyncio

import httpx
import pytest
from pydantic import SecretStr

from agent_server.broker import Broker, Grant
from tests.unit.broker.test_broker import REAL, run_with_broker

LIMITED = b'{"type": "error", "error": {"type": "rate_limit_error", "message": "slow"}}'


def through_raw_upstream(answer: bytes) -> tuple[int | str, bytes, Grant]:
    """Post through the broker to an upstream that writes `answer` and closes."""
    turn: list[Grant] = []

    async def reply(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(answer)
        await writer.drain()
        writer.close()

    async def test(broker: Broker, client: httpx.AsyncClient) -> tuple[int | str, bytes]:
        upstream = await asyncio.start_server(reply, "127.0.0.1", 0)
        port = upstream.sockets[0].getsockname()[1]
        turn.append(Grant("authorization", SecretStr(REAL), f"http://127.0.0.1:{port}"))
        headers = {"authorization": f"Bearer {broker.grants.issue(turn[0], '')}"}
        async with upstream:
            try:
                got = await client.post("/v1/messages", headers=headers)
            except httpx.TransportError as cut:
                return type(cut).__name__, b""
        return got.status_code, got.content

    status, body = run_with_broker(test)
    return status, body, turn[0]


def test_an_answer_framed_by_its_close_reaches_the_cli_whole() -> None:
    """Neither length nor chunks: the body is everything until the upstream closes."""
    status, body, _ = through_raw_upstream(b"HTTP/1.1 200 OK\r\n\r\nhello until close")
    assert (status, body) == (200, b"hello until close")


def test_a_refusal_framed_by_its_close_is_read_into_the_exchange() -> None:
    """The API's error is recorded from a body that ends with the connection."""
    status, _, turn = through_raw_upstream(b"HTTP/1.1 429 Too Many\r\n\r\n" + LIMITED)
    assert status == 429
    assert turn.exchanges.last is not None
    assert turn.exchanges.last.error_type == "rate_limit_error"


@pytest.mark.parametrize(
    ("case", "answer"),
    [
        ("a chunk cut short", b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhel"),
        ("a length not reached", b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nhel"),
    ],
)
def test_an_answer_cut_short_is_cut_short_for_the_cli(case: str, answer: bytes) -> None:
    """The CLI's connection breaks: a cut answer never looks whole."""
    status, _, _ = through_raw_upstream(answer)
    assert status in ("RemoteProtocolError", "ReadError"), case


def test_an_answer_that_is_not_http_is_a_502() -> None:
    """Garbage before any head: the upstream gave no answer."""
    status, _, turn = through_raw_upstream(b"SSH-2.0-OpenSSH\r\n\r\n")
    assert status == 502
    assert turn.exchanges.last is not None
    assert turn.exchanges.last.status is None
