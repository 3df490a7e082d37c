"""The broker forwards a placeholder's request with the real credential, and only that.

Real listeners on loopback: the broker on its own thread and loop, and a
recording upstream in a thread.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import httpx
import pytest
from pydantic import SecretStr

from agent_server.broker import Broker, Grant
from agent_server.broker.grants import Rung
from tests.support.recording_upstream import Answer, RecordingUpstream

REAL = "sk-ant-oat01-the-real-credential-0123456789"


@pytest.fixture(name="upstream")
def upstream_fixture() -> Iterator[RecordingUpstream]:
    with RecordingUpstream() as upstream:
        yield upstream


def run_with_broker(
    test: Callable[[Broker, httpx.AsyncClient], Awaitable[Any]], *, max_bytes: int | None = None
) -> Any:
    """Run `test` with a started broker and a client of it, and stop both after."""

    async def main() -> Any:
        broker = Broker() if max_bytes is None else Broker(max_bytes)
        await broker.start()
        try:
            async with httpx.AsyncClient(base_url=broker.url, timeout=10) as client:
                return await test(broker, client)
        finally:
            await broker.stop()

    return asyncio.run(main())


def grant(upstream: RecordingUpstream, header: str = "authorization") -> Grant:
    return Grant(header, SecretStr(REAL), upstream.base_url)  # type: ignore[arg-type]


def test_the_upstream_gets_the_request_with_the_real_credential(
    upstream: RecordingUpstream,
) -> None:
    """Method, path, query, body and headers arrive as sent; only the credential differs."""
    sent_headers = {
        "anthropic-beta": "oauth-2025-04-20,extended-cache-ttl-2025-04-11",
        "anthropic-version": "2023-06-01",
        "user-agent": "claude-cli/2.1.328 (external, sdk-cli)",
        "x-app": "cli",
        "content-type": "application/json",
    }
    body = b'{"model": "claude-sonnet-5-5", "stream": true}'

    async def test(broker: Broker, client: httpx.AsyncClient) -> httpx.Response:
        placeholder = broker.grants.issue(grant(upstream), "sk-ant-oat01-")
        headers = {**sent_headers, "authorization": f"Bearer {placeholder}"}
        return await client.post("/v1/messages?beta=true", content=body, headers=headers)

    response = run_with_broker(test)
    assert response.status_code == 200
    assert response.content == b"ok"
    (got,) = upstream.received
    assert (got.method, got.path, got.query, got.body) == (
        "POST",
        "/v1/messages",
        "beta=true",
        body,
    )
    headers = dict(got.headers)
    assert headers["authorization"] == f"Bearer {REAL}"
    for name, value in sent_headers.items():
        assert headers[name] == value
    # Nothing the client did not send, but the credential and the transport's own.
    assert set(headers) - set(sent_headers) <= {
        "authorization",
        "host",
        "content-length",
        "accept",
        "accept-encoding",
        "connection",
    }
    assert headers["content-length"] == str(len(body))


def test_an_api_key_grant_goes_in_x_api_key_and_no_bearer_is_left(
    upstream: RecordingUpstream,
) -> None:
    """The grant's header carries the credential; the other credential header is dropped."""

    async def test(broker: Broker, client: httpx.AsyncClient) -> None:
        placeholder = broker.grants.issue(grant(upstream, "x-api-key"), "")
        await client.post(
            "/v1/messages", headers={"x-api-key": placeholder, "authorization": "Bearer own"}
        )

    run_with_broker(test)
    headers = dict(upstream.received[0].headers)
    assert headers["x-api-key"] == REAL
    assert "authorization" not in headers


def test_a_gateway_upstream_keeps_its_path_prefix(upstream: RecordingUpstream) -> None:
    """An upstream base URL with a path gets the CLI's path after it."""

    async def test(broker: Broker, client: httpx.AsyncClient) -> None:
        gateway = Grant("authorization", SecretStr(REAL), upstream.base_url + "/gateway")
        placeholder = broker.grants.issue(gateway, "")
        await client.post(
            "/v1/messages?beta=true", headers={"authorization": f"Bearer {placeholder}"}
        )

    run_with_broker(test)
    assert upstream.received[0].path == "/gateway/v1/messages"


@pytest.mark.parametrize(
    "presented",
    [None, "Bearer not-a-placeholder", "Bearer revoked"],
    ids=["no credential", "an unknown one", "a revoked placeholder"],
)
def test_a_request_without_a_live_placeholder_goes_nowhere(
    upstream: RecordingUpstream, presented: str | None
) -> None:
    """401 in the API's error shape, and the upstream never hears of it."""

    async def test(broker: Broker, client: httpx.AsyncClient) -> httpx.Response:
        headers = {}
        if presented == "Bearer revoked":
            placeholder = broker.grants.issue(grant(upstream), "")
            broker.grants.revoke(placeholder)
            headers["authorization"] = f"Bearer {placeholder}"
        elif presented is not None:
            headers["authorization"] = presented
        return await client.post("/v1/messages", headers=headers)

    response = run_with_broker(test)
    assert response.status_code == 401
    assert response.json()["error"]["type"] == "authentication_error"
    assert upstream.received == []


def test_the_answer_streams_through_as_it_arrives(upstream: RecordingUpstream) -> None:
    """The first chunk reaches the client while the upstream still holds the rest."""
    upstream.answer = Answer(chunks=(b"first", b"rest"), hold_after_first=True)

    async def test(broker: Broker, client: httpx.AsyncClient) -> tuple[bytes, bytes]:
        placeholder = broker.grants.issue(grant(upstream), "")
        headers = {"authorization": f"Bearer {placeholder}"}
        async with client.stream("POST", "/v1/messages", headers=headers) as response:
            chunks = response.aiter_raw()
            first = await asyncio.wait_for(chunks.__anext__(), 5)
            upstream.release()
            rest = b"".join([chunk async for chunk in chunks])
        return first, rest

    first, rest = run_with_broker(test)
    assert first == b"first"
    assert rest == b"rest"


def test_a_body_over_the_bound_is_refused_and_not_forwarded(upstream: RecordingUpstream) -> None:
    """413 request_too_large; the upstream gets nothing."""

    async def test(broker: Broker, client: httpx.AsyncClient) -> httpx.Response:
        placeholder = broker.grants.issue(grant(upstream), "")
        headers = {"authorization": f"Bearer {placeholder}"}
        return await client.post("/v1/messages", content=b"x" * 2048, headers=headers)

    response = run_with_broker(test, max_bytes=1024)
    assert response.status_code == 413
    assert upstream.received == []


def test_each_exchange_is_recorded_with_its_status_headers_and_error(
    upstream: RecordingUpstream,
) -> None:
    """A refusal's status, its unified rate-limit headers and the API's error type."""
    reset = int(time.time()) + 3600
    upstream.answer = Answer(
        status=429,
        headers={
            "anthropic-ratelimit-unified-status": "rejected",
            "anthropic-ratelimit-unified-reset": str(reset),
            "anthropic-ratelimit-unified-representative-claim": "five_hour",
            "x-unrelated": "kept out of the record",
        },
        chunks=(b'{"type": "error", "error": {"type": "rate_limit_error", "message": "slow"}}',),
    )
    turn = grant(upstream)

    async def test(broker: Broker, client: httpx.AsyncClient) -> httpx.Response:
        placeholder = broker.grants.issue(turn, "")
        return await client.post("/v1/messages", headers={"authorization": f"Bearer {placeholder}"})

    response = run_with_broker(test)
    assert response.status_code == 429
    assert response.headers["anthropic-ratelimit-unified-reset"] == str(reset)
    exchange = turn.exchanges.last
    assert exchange is not None
    assert exchange.status == 429
    assert exchange.error_type == "rate_limit_error"
    assert exchange.headers["anthropic-ratelimit-unified-representative-claim"] == "five_hour"
    assert "x-unrelated" not in exchange.headers
    assert turn.exchanges.count == 1


def test_an_unreachable_upstream_is_a_502_and_an_exchange_without_an_answer() -> None:
    """No answer at all is recorded as such (status None): the upstream's fault."""
    turn = Grant("authorization", SecretStr(REAL), "http://127.0.0.1:9")

    async def test(broker: Broker, client: httpx.AsyncClient) -> httpx.Response:
        placeholder = broker.grants.issue(turn, "")
        return await client.post("/v1/messages", headers={"authorization": f"Bearer {placeholder}"})

    response = run_with_broker(test)
    assert response.status_code == 502
    assert turn.exchanges.last is not None
    assert turn.exchanges.last.status is None


def test_a_lease_revokes_its_placeholder_at_its_end(upstream: RecordingUpstream) -> None:
    """The placeholder works inside the lease and is refused after it."""

    async def test(broker: Broker, client: httpx.AsyncClient) -> tuple[int, int]:
        env = {"CLAUDE_CODE_OAUTH_TOKEN": REAL, "ANTHROPIC_BASE_URL": upstream.base_url}
        sources = dict.fromkeys(env, "baseline")
        with broker.lease(env, sources) as placed:  # type: ignore[arg-type]
            assert placed is not None
            headers = {"authorization": f"Bearer {placed.placeholder}"}
            inside = (await client.post("/v1/messages", headers=headers)).status_code
        after = (await client.post("/v1/messages", headers=headers)).status_code
        return inside, after

    assert run_with_broker(test) == (200, 401)


LIMITED = Answer(
    status=429,
    headers={"anthropic-ratelimit-unified-representative-claim": "five_hour"},
    chunks=(b'{"type": "error", "error": {"type": "rate_limit_error", "message": "limit"}}',),
)


def laddered(upstream: RecordingUpstream, *secrets: str) -> Grant:
    """A grant on `REAL`, then a rung for each of `secrets`."""
    rungs = tuple(Rung("authorization", SecretStr(s), upstream.base_url) for s in secrets)
    return Grant("authorization", SecretStr(REAL), upstream.base_url, ladder=rungs)


def test_a_switchable_refusal_sends_the_same_request_on_the_next_rung(
    upstream: RecordingUpstream,
) -> None:
    """A's 429 never reaches the client: B serves the same request, and both are recorded."""
    upstream.by_credential[REAL] = LIMITED
    turn = laddered(upstream, "rung-b")

    async def test(broker: Broker, client: httpx.AsyncClient) -> list[int]:
        placeholder = broker.grants.issue(turn, "")
        headers = {"authorization": f"Bearer {placeholder}"}
        first = await client.post("/v1/messages?beta=true", content=b"{}", headers=headers)
        second = await client.post("/v1/messages?beta=true", content=b"{}", headers=headers)
        return [first.status_code, second.status_code]

    assert run_with_broker(test) == [200, 200]
    sent = [dict(r.headers)["authorization"] for r in upstream.received]
    # The turn stays on B: A is asked once.
    assert sent == [f"Bearer {REAL}", "Bearer rung-b", "Bearer rung-b"]
    assert [r.body for r in upstream.received] == [b"{}"] * 3
    assert [(e.rung, e.status) for e in turn.exchanges.all()] == [(0, 429), (1, 200), (1, 200)]


@pytest.mark.parametrize(
    ("case", "answer"),
    [
        ("an overload is no credential's", Answer(status=529)),
        (
            "a 400 not about the credit balance",
            Answer(
                status=400,
                chunks=(b'{"error": {"type": "invalid_request_error", "message": "bad"}}',),
            ),
        ),
    ],
)
def test_a_refusal_no_switch_fixes_reaches_the_cli_whole(
    upstream: RecordingUpstream, case: str, answer: Answer
) -> None:
    """The CLI gets the refusal as the API sent it; the next rung is never asked."""
    upstream.by_credential[REAL] = answer
    turn = laddered(upstream, "rung-b")

    async def test(broker: Broker, client: httpx.AsyncClient) -> httpx.Response:
        placeholder = broker.grants.issue(turn, "")
        return await client.post("/v1/messages", headers={"authorization": f"Bearer {placeholder}"})

    response = run_with_broker(test)
    assert response.status_code == answer.status, case
    assert response.content == b"".join(answer.chunks)
    assert len(upstream.received) == 1


def test_the_last_rungs_refusal_reaches_the_cli(upstream: RecordingUpstream) -> None:
    """With no rung left, the refusal is the turn's: relayed as the API sent it."""
    upstream.by_credential[REAL] = LIMITED
    upstream.by_credential["rung-b"] = LIMITED
    turn = laddered(upstream, "rung-b")

    async def test(broker: Broker, client: httpx.AsyncClient) -> httpx.Response:
        placeholder = broker.grants.issue(turn, "")
        return await client.post("/v1/messages", headers={"authorization": f"Bearer {placeholder}"})

    response = run_with_broker(test)
    assert response.status_code == 429
    assert response.json()["error"]["type"] == "rate_limit_error"
    assert [(e.rung, e.error_type) for e in turn.exchanges.all()] == [
        (0, "rate_limit_error"),
        (1, "rate_limit_error"),
    ]


def test_a_plain_upstream_goes_through_the_servers_proxy(
    upstream: RecordingUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`HTTP_PROXY` in the server's environment carries the request, in absolute form."""
    for name in ("no_proxy", "HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy", "http_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HTTP_PROXY", upstream.base_url)  # the recording upstream is the proxy
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")  # the test's own client reaches the broker direct
    turn = Grant("authorization", SecretStr(REAL), "http://api.example.invalid/gateway")

    async def test(broker: Broker, client: httpx.AsyncClient) -> int:
        placeholder = broker.grants.issue(turn, "")
        headers = {"authorization": f"Bearer {placeholder}"}
        return (await client.post("/v1/messages?beta=true", headers=headers)).status_code

    assert run_with_broker(test) == 200
    (got,) = upstream.received
    assert (got.path, got.query) == ("/gateway/v1/messages", "beta=true")
    headers = dict(got.headers)
    assert headers["host"] == "api.example.invalid"
    assert headers["authorization"] == f"Bearer {REAL}"


def test_answers_a_slow_reader_falls_behind_on_leave_the_connection_usable(
    upstream: RecordingUpstream,
) -> None:
    """A big answer read slowly pauses the upstream; the next request is still answered."""
    upstream.answer = Answer(chunks=(b"x" * (4 * 1024 * 1024),))

    async def test(broker: Broker, client: httpx.AsyncClient) -> list[int]:
        placeholder = broker.grants.issue(grant(upstream), "")
        headers = {"authorization": f"Bearer {placeholder}"}
        sizes = []
        for _ in range(3):
            async with client.stream("POST", "/v1/messages", headers=headers) as response:
                size = 0
                async for chunk in response.aiter_raw(16 * 1024):
                    size += len(chunk)
                    await asyncio.sleep(0.001)  # behind: the answer's end fills the broker's buffer
                sizes.append(size)
        return sizes

    assert run_with_broker(test) == [4 * 1024 * 1024] * 3


@pytest.mark.parametrize(
    ("case", "request_bytes"),
    [
        ("not HTTP", b"NOT HTTP AT ALL\r\n\r\n"),
        (
            "a head past its bound",
            b"POST / HTTP/1.1\r\n" + b"x-pad: " + b"p" * 70_000 + b"\r\n\r\n",
        ),
    ],
)
def test_a_request_that_is_not_http_is_a_400_and_goes_nowhere(
    upstream: RecordingUpstream, case: str, request_bytes: bytes
) -> None:
    """The CLI's bytes are hostile: a broken or endless head ends its connection."""

    async def test(broker: Broker, _client: httpx.AsyncClient) -> bytes:
        port = int(broker.url.rsplit(":", 1)[1])
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(request_bytes)
        answer = await asyncio.wait_for(reader.read(), 5)
        writer.close()
        return answer

    assert run_with_broker(test).startswith(b"HTTP/1.1 400 "), case
    assert upstream.received == []
