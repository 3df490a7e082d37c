"""The broker verifies its upstream's TLS, against the trust store of the server's environment.

A real TLS listener on loopback with a certificate made for the test (openssl), so
only `SSL_CERT_FILE` naming it makes the upstream trusted.
"""

from __future__ import annotations

import asyncio
import shutil
import ssl
import subprocess
from pathlib import Path

import httpx
import pytest
from pydantic import SecretStr

from agent_server.broker import Broker, Grant
from tests.conftest import unavailable
from tests.unit.broker.test_broker import REAL, run_with_broker


@pytest.fixture(name="certificate")
def certificate_fixture(tmp_path: Path) -> tuple[Path, Path]:
    if shutil.which("openssl") is None:
        unavailable("openssl is not installed")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        [
            *("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"),
            *("-keyout", str(key), "-out", str(cert), "-subj", "/CN=127.0.0.1"),
            *("-addext", "subjectAltName=IP:127.0.0.1"),
        ],
        check=True,
        capture_output=True,
        timeout=30,
    )
    return cert, key


async def _answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(
        (
            int(line.split(b":")[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        ),
        0,
    )
    await reader.readexactly(length)
    writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
    await writer.drain()
    writer.close()


def _through_tls_upstream(certificate: tuple[Path, Path]) -> tuple[int, Grant]:
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_context.load_cert_chain(*certificate)
    turn: list[Grant] = []

    async def test(broker: Broker, client: httpx.AsyncClient) -> int:
        upstream = await asyncio.start_server(_answer, "127.0.0.1", 0, ssl=server_context)
        port = upstream.sockets[0].getsockname()[1]
        turn.append(Grant("authorization", SecretStr(REAL), f"https://127.0.0.1:{port}"))
        placeholder = broker.grants.issue(turn[0], "")
        async with upstream:
            answer = await client.post(
                "/v1/messages", headers={"authorization": f"Bearer {placeholder}"}
            )
        return answer.status_code

    return run_with_broker(test), turn[0]


def test_an_upstream_the_trust_store_does_not_vouch_for_gets_nothing(
    certificate: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A certificate no trusted authority signed: 502, and no answer recorded."""
    for name in ("SSL_CERT_FILE", "SSL_CERT_DIR"):
        monkeypatch.delenv(name, raising=False)
    status, turn = _through_tls_upstream(certificate)
    assert status == 502
    assert turn.exchanges.last is not None
    assert turn.exchanges.last.status is None


def test_ssl_cert_file_of_the_servers_environment_is_trusted(
    certificate: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`SSL_CERT_FILE` naming the upstream's certificate: the request goes through."""
    monkeypatch.setenv("SSL_CERT_FILE", str(certificate[0]))
    status, turn = _through_tls_upstream(certificate)
    assert status == 200
    assert turn.exchanges.last is not None
    assert turn.exchanges.last.status == 200
