"""Async turns' result callbacks (contract §6.8), against a real loopback receiver:
persisted first, delivered once and signed, retried with Retry-After, dropped on a
permanent refusal, kept past the deadline, and re-sent by the startup sweep, streamed
from a pending file that is bounded and never trusted."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import SecretStr

from agent_server.metrics import Metrics
from agent_server.records.callback import CallbackSender
from agent_server.records.pending import Kept, PendingResults
from agent_server.records.retained import RESULT_TTL_S
from agent_server.wire.signing import callback_key
from tests.support.callback_receiver import CallbackReceiver
from tests.support.fake_cli import fingerprint

pytestmark = pytest.mark.timeout(60)

KEY = "unit-callback-key-0123456789"
CONTROLLER = "unit-controller-token-0123456789"


@pytest.fixture
def receiver() -> Iterator[CallbackReceiver]:
    with CallbackReceiver(KEY, CONTROLLER) as running:
        yield running


def _sender(tmp_path: Path, url: str, key: str = KEY, agent: str = "agent one") -> CallbackSender:
    tmp_path.chmod(0o700)
    return CallbackSender(
        backend_url=url,
        agent_name=agent,
        key=SecretStr(key),
        signing_key=callback_key(SecretStr(CONTROLLER)),
        pending=PendingResults(tmp_path / "pending-results"),
        metrics=Metrics(),
        pause=lambda low, high: 0.01,  # no jitter waits: Retry-After still floors them
    )


def _envelope(execution_id: str = "e-1") -> dict[str, Any]:
    return {"execution_id": execution_id, "status": "success", "response": "done"}


def _body(execution_id: str = "e-1") -> bytes:
    return json.dumps(_envelope(execution_id)).encode()


def _dir(sender: CallbackSender) -> Path:
    return sender.pending.files.directory


def _count(sender: CallbackSender, result: str) -> float:
    return sender.metrics.callbacks.labels(result=result)._value.get()


async def _send(sender: CallbackSender, execution_id: str, deadline: float) -> None:
    await sender.persist(execution_id, _body(execution_id), deadline)
    sender.deliver_later(execution_id, _body(execution_id), deadline)
    await sender.close(30)


def test_a_result_is_persisted_then_delivered_once(
    tmp_path: Path, receiver: CallbackReceiver
) -> None:
    """One POST to the agent's URL with the bearer; the pending file is gone after the 2xx."""
    sender = _sender(tmp_path, receiver.base_url)
    seen_pending: list[bool] = []

    async def scenario() -> None:
        await sender.persist("e-1", _body(), time.time() + 30)
        seen_pending.append((_dir(sender) / "e-1.json").exists())
        sender.deliver_later("e-1", _body(), time.time() + 30)
        await sender.close(30)

    asyncio.run(scenario())
    assert seen_pending == [True]
    (delivery,) = receiver.deliveries
    assert (delivery.agent, delivery.execution_id, delivery.status) == ("agent one", "e-1", 200)
    assert delivery.body == _envelope()
    assert delivery.bearer_fp == fingerprint(KEY)
    assert delivery.signed is True
    assert list(_dir(sender).iterdir()) == []
    assert _count(sender, "delivered") == 1


def test_a_transient_refusal_is_retried_no_sooner_than_retry_after(
    tmp_path: Path, receiver: CallbackReceiver
) -> None:
    """503 with Retry-After: 1, then 500: the third attempt lands, a second or more later."""
    receiver.fail_next(503, headers={"Retry-After": "1"})
    receiver.fail_next(500)
    sender = _sender(tmp_path, receiver.base_url)
    asyncio.run(_send(sender, "e-1", time.time() + 30))
    first, second, third = receiver.deliveries
    assert [d.status for d in (first, second, third)] == [503, 500, 200]
    assert second.received_at - first.received_at >= 1.0
    assert list(_dir(sender).iterdir()) == []


@pytest.mark.parametrize("status", [400, 401, 403, 404, 409, 413, 422])
def test_a_permanent_refusal_is_not_retried_and_drops_the_file(
    tmp_path: Path, receiver: CallbackReceiver, status: int
) -> None:
    """One attempt; the file goes (it would never be taken), counted as rejected."""
    receiver.fail_next(status)
    sender = _sender(tmp_path, receiver.base_url)
    asyncio.run(_send(sender, "e-1", time.time() + 30))
    assert [d.status for d in receiver.deliveries] == [status]
    assert list(_dir(sender).iterdir()) == []
    assert _count(sender, "rejected") == 1


def test_a_wrong_key_is_refused_403_and_never_retried(
    tmp_path: Path, receiver: CallbackReceiver
) -> None:
    """The controller's 403 is permanent."""
    sender = _sender(tmp_path, receiver.base_url, key="unit-wrong-key-0123456789")
    asyncio.run(_send(sender, "e-1", time.time() + 30))
    assert [d.status for d in receiver.deliveries] == [403]


def test_past_the_deadline_the_file_is_kept_for_the_next_start(
    tmp_path: Path, receiver: CallbackReceiver
) -> None:
    """Always 503: attempts stop at the lease deadline; the pending file stays."""
    receiver.fail_next(*[503] * 50, headers={"Retry-After": "1"})
    sender = _sender(tmp_path, receiver.base_url)
    asyncio.run(_send(sender, "e-1", time.time() + 1.5))
    assert 1 <= len(receiver.deliveries) <= 3
    assert [k.execution_id for k in sender.pending.kept()] == ["e-1"]
    assert _count(sender, "kept") == 1


def test_no_listener_is_retried_like_a_5xx(tmp_path: Path) -> None:
    """Connection refused: tried again until the deadline, then kept."""
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    sender = _sender(tmp_path, f"http://127.0.0.1:{port}")
    asyncio.run(_send(sender, "e-1", time.time() + 0.5))
    assert (_dir(sender) / "e-1.json").exists()
    assert _count(sender, "kept") == 1


def test_the_startup_sweep_sends_what_a_previous_run_kept(
    tmp_path: Path, receiver: CallbackReceiver
) -> None:
    """Kept files are delivered, streamed and signed, and deleted; unsound, planted or
    expired ones are dropped unsent."""
    first = _sender(tmp_path, receiver.base_url)
    asyncio.run(first.persist("kept-1", _body("kept-1"), time.time() - 10))  # deadline passed
    asyncio.run(first.persist("kept-2", _body("kept-2") * 1, time.time() + 60))
    asyncio.run(first.persist("expired", _body("expired"), time.time() + 60))
    asyncio.run(first.persist("future", _body("future"), time.time() + 60))
    old = time.time() - RESULT_TTL_S - 5
    os.utime(_dir(first) / "expired.json", (old, old))
    ahead = time.time() + 3600
    os.utime(_dir(first) / "future.json", (ahead, ahead))
    (_dir(first) / "garbage.json").write_text("{")
    (_dir(first) / "liar.json").write_text('{"execution_id":"other","deadline":1}\n{}')
    (_dir(first) / "evil?injected=1&x=#.json").write_text('{"execution_id":"x","deadline":1}\n')
    restarted = _sender(tmp_path, receiver.base_url)

    async def scenario() -> None:
        restarted.sweep_later()
        await asyncio.sleep(0.2)
        await restarted.close(30)

    asyncio.run(scenario())
    assert sorted(d.execution_id for d in receiver.deliveries) == ["kept-1", "kept-2"]
    assert all(d.signed for d in receiver.deliveries)
    assert [d.body for d in receiver.deliveries if d.execution_id == "kept-2"] == [
        _envelope("kept-2")
    ]
    assert sorted(p.name for p in _dir(restarted).iterdir()) == ["evil?injected=1&x=#.json"]


def test_a_large_kept_body_is_sent_a_chunk_at_a_time(
    tmp_path: Path, receiver: CallbackReceiver
) -> None:
    """Eight megabytes go out as they are, signed, without the sender holding them whole."""
    big = json.dumps({"execution_id": "big", "response": "x" * (8 << 20)}).encode()
    asyncio.run(_sender(tmp_path, receiver.base_url).persist("big", big, time.time() + 60))
    sender = _sender(tmp_path, receiver.base_url)  # a restart: it finds the file kept
    opened = sender.pending.body("big")
    assert opened is not None
    size, chunks = opened
    assert size == len(big)
    assert max(len(chunk) for chunk in chunks) <= 64 * 1024

    async def scenario() -> None:
        sender.sweep_later()
        await asyncio.sleep(0.2)
        await sender.close(30)

    asyncio.run(scenario())
    (delivery,) = receiver.deliveries
    assert (delivery.execution_id, delivery.signed) == ("big", True)
    assert len(delivery.body["response"]) == 8 << 20


def test_pending_results_are_bounded_like_retained_ones(
    tmp_path: Path, receiver: CallbackReceiver
) -> None:
    """With the controller down, the oldest go past the count: the directory never grows
    without bound."""
    sender = _sender(tmp_path, receiver.base_url)
    sender.pending.files.bounds = dataclasses.replace(sender.pending.files.bounds, max_count=3)
    for index in range(5):
        asyncio.run(sender.persist(f"e-{index}", _body(f"e-{index}"), time.time() + 60))
        stamp = time.time() - 100 + index
        os.utime(_dir(sender) / f"e-{index}.json", (stamp, stamp))
    assert [k.execution_id for k in sender.pending.kept()] == ["e-2", "e-3", "e-4"]


def test_an_envelope_the_agent_posts_is_not_signed(receiver: CallbackReceiver) -> None:
    """The agent holds the bearer key, never the controller token: its POST fails the check."""
    envelope = json.dumps(_envelope("forged")).encode()
    forged_signature = "t=1,v1=" + "0" * 64
    with httpx.Client() as client:
        for headers in ({}, {"X-Agent-Server-Signature": forged_signature}):
            client.post(
                f"{receiver.base_url}/api/agents/a/executions/forged/result",
                content=envelope,
                headers={"Authorization": f"Bearer {KEY}", **headers},
            )
    assert [d.signed for d in receiver.deliveries] == [None, False]


@pytest.mark.parametrize("delivered_first", [False, True], ids=["in flight", "delivered"])
def test_the_startup_sweep_never_sends_this_runs_own_result_again(
    tmp_path: Path, receiver: CallbackReceiver, delivered_first: bool
) -> None:
    """A result persisted since the start is delivered once, whether the sweep lists it
    before its delivery began or after it ended (the file read, then deleted)."""
    sender = _sender(tmp_path, receiver.base_url)
    kept = sender.pending.kept

    def listed_then_delivered() -> list[Kept]:
        listing = kept()
        if delivered_first:
            done.wait(10)
        return listing

    done = threading.Event()
    sender.pending.kept = listed_then_delivered  # type: ignore[method-assign]

    async def scenario() -> None:
        deadline = time.time() + 60
        await sender.persist("now-1", _body("now-1"), deadline)
        sender.sweep_later()
        await asyncio.sleep(0.2)  # the sweep has listed the file (and waits, or not)
        sender.deliver_later("now-1", _body("now-1"), deadline)
        while not receiver.deliveries:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)  # the delivery deletes the file, then leaves `_own`
        done.set()
        await sender.close(30)

    asyncio.run(scenario())
    assert [d.execution_id for d in receiver.deliveries] == ["now-1"]


def test_the_agent_name_is_one_path_segment(tmp_path: Path) -> None:
    """A name with `/` or spaces cannot reach another route of the controller."""
    sender = _sender(tmp_path, "https://backend.test/", agent="a/../b c")
    assert (
        sender.url("e-1") == "https://backend.test/api/agents/a%2F..%2Fb%20c/executions/e-1/result"
    )
