"""A gateway whose model Claude Code does not know (`glm-4.6`), end to end on the pinned
CLI: its refusals are what the gateway said, so the walk fails over and waits."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent_server.controller import WalkEvent, WalkTurn
from tests.support.messages_api import KEY_RETRY_AFTER_S, MessagesApiStandIn, Scenario
from tests.support.server import ServerProcess
from tests.support.walk_harness import (  # noqa: F401 - the *_fixture names are fixtures
    HOUR,
    Credentials,
    about,
    agent_fixture,
    anyio_backend_fixture,
    api_fixture,
    assert_quiet,
    attempts,
    cli_env_fixture,
    creds_fixture,
    make_pool,
    walking,
)

pytestmark = [pytest.mark.realcli, pytest.mark.anyio, pytest.mark.timeout(240)]
GLM = "glm-4.6"


@pytest.mark.parametrize(
    ("scenario", "code", "due_in_s"),
    [
        pytest.param(
            Scenario.RATE_LIMIT_API_KEY, "rate_limit", KEY_RETRY_AFTER_S, id="429: its retry-after"
        ),
        pytest.param(Scenario.AUTH_401, "auth", HOUR, id="401: the subscription's reset"),
    ],
)
async def test_a_glm_gateways_refusal_is_the_gateways(
    agent: ServerProcess,
    api: MessagesApiStandIn,
    creds: Credentials,
    tmp_path: Path,
    scenario: Scenario,
    code: str,
    due_in_s: int,
) -> None:
    """The subscription is capped and the gateway (model glm-4.6) refuses: the gateway's
    failure is recorded as what it said (not `model_unsupported`), and the agent waits,
    its retry at the earliest window known (the gateway's `retry-after` after a 429)."""
    sub, gw = creds.new("ratelimit"), creds.new("good")
    api.on(gw, scenario)
    pool = make_pool(
        ("a", "subscription", sub),
        ("gw", "gateway", gw),
        gateway_url=api.gateway_url,
        gateway_model=GLM,
    )
    events: list[WalkEvent] = []
    async with walking(agent, pool, f"sqlite:///{tmp_path}/pool.db", events) as (walker, store):
        result = await walker.walk(WalkTurn("glm-bot", "hi", timeout_s=120))
        failures = (await store.snapshot()).failures
    assert attempts(result) == [("a", "rate_limit"), ("gw", code)]
    assert result.outcome == "waiting_for_capacity"
    assert result.retry is not None
    assert about(result.retry.due_at, due_in_s)
    assert set(failures["gw"]) == {code}
    assert api.message_requests[-1].model == GLM
    assert_quiet(events, creds)
