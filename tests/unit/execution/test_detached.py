"""An async turn run detached (contract §6.8): its envelope goes by callback, a 500 one
when the turn raised where no turn should."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agent_server.execution.ask import AcceptedTurn, TurnAsk
from agent_server.execution.detached import detach
from agent_server.services import Services
from tests.conftest import agent_environ
from tests.support.callback_receiver import CallbackReceiver, Delivery
from tests.support.in_process import fake_cli_services

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def receiver() -> Iterator[CallbackReceiver]:
    with CallbackReceiver("unit-callback-key-0001") as running:
        yield running


def _services(tmp_path: Path, **extra: str) -> Services:
    return fake_cli_services(
        agent_environ(tmp_path), CLAUDE_CODE_OAUTH_TOKEN="unit-baseline-oauth-0001", **extra
    )


def _run_detached(services: Services, receiver: CallbackReceiver, ask: TurnAsk) -> Delivery:
    """Detach `ask`, and return its callback once the receiver accepted it."""

    async def scenario() -> Delivery:
        accepted = detach(services.turns, services.results, ask)
        assert accepted is not None
        delivery = await asyncio.to_thread(receiver.wait_for_id, accepted.execution_id, 20)
        await services.results.close(5)
        return delivery

    return asyncio.run(scenario())


def test_a_detached_turn_sends_its_envelope_by_callback(
    tmp_path: Path, receiver: CallbackReceiver
) -> None:
    """The turn runs after `detach` returned; its success envelope is the callback's body."""
    services = _services(tmp_path, **receiver.environ())
    delivery = _run_detached(services, receiver, TurnAsk(message="@result", execution_id="d-1"))
    assert (delivery.body["status"], delivery.body["http_status"]) == ("success", 200)


def test_a_detached_turn_that_raised_sends_a_500_envelope(
    tmp_path: Path, receiver: CallbackReceiver, caplog: pytest.LogCaptureFixture
) -> None:
    """A bug after the turn ran still tells the controller it is over: a 500 internal
    error, logged with its traceback."""
    services = _services(tmp_path, **receiver.environ())
    conclude = services.turns.conclude

    async def raising(turn: AcceptedTurn) -> Any:
        await conclude(turn)
        msg = "a bug past the turn's end"
        raise RuntimeError(msg)

    services.turns.conclude = raising  # type: ignore[method-assign]
    with caplog.at_level(logging.ERROR, logger="agent_server.executions"):
        delivery = _run_detached(services, receiver, TurnAsk(message="@result", execution_id="d-2"))
    assert (delivery.body["status"], delivery.body["http_status"]) == ("failed", 500)
    assert delivery.body["detail"]["error_code"] == "internal_error"
    assert any(r.getMessage() == "async turn failed" and r.exc_info for r in caplog.records)


@pytest.mark.parametrize(
    ("configured", "execution_id", "why"),
    [
        (False, "d-3", "no callback configured"),
        (True, None, "no execution_id"),
    ],
    ids=["no callback", "no id"],
)
def test_a_turn_that_cannot_be_detached_is_left_to_run_in_line(
    tmp_path: Path,
    receiver: CallbackReceiver,
    caplog: pytest.LogCaptureFixture,
    configured: bool,
    execution_id: str | None,
    why: str,
) -> None:
    """Nothing is accepted (nothing listed), and an INFO line says why."""
    services = _services(tmp_path, **(receiver.environ() if configured else {}))
    with caplog.at_level(logging.INFO, logger="agent_server.executions"):
        detached = detach(services.turns, services.results, TurnAsk("x", execution_id))
    assert detached is None
    assert services.registry.running() == []
    assert f"async_result asked, answered synchronously: {why}" in caplog.messages
