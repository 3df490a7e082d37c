"""TurnRunner: one turn over a real registry, real spawn env and the fake CLI."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest
from pydantic import SecretStr

from agent_server.errors import RequestInvalid
from agent_server.execution.answer import TurnAnswer
from agent_server.execution.ask import TurnAsk
from agent_server.services import Services
from agent_server.wire.names import AUTH_OVERRIDE_HEADER
from agent_server.wire.turns import AuthOverride, ImageInput
from tests.conftest import agent_environ
from tests.support.images import ONE_IMAGE
from tests.support.in_process import fake_cli_services
from tests.support.server import FAKE_CODEX, FAKE_GEMINI

ONE_IMAGE_INPUT = ImageInput.model_validate(ONE_IMAGE)

pytestmark = pytest.mark.timeout(60)


def services_for(tmp_path: Path, **extra: str) -> Services:
    """Services of a server whose runtime command is the fake CLI, with a baseline token."""
    return fake_cli_services(
        agent_environ(tmp_path), CLAUDE_CODE_OAUTH_TOKEN="unit-baseline-oauth-0001", **extra
    )


def test_a_runtime_without_override_support_ignores_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Codex: the override is dropped with a WARNING; no header, auth_route baseline."""
    services = services_for(tmp_path, AGENT_RUNTIME="codex")
    override = AuthOverride(oauth_token=SecretStr("unit-override-oauth-0001"))
    with caplog.at_level(logging.WARNING, logger="agent_server.turn"):
        answer = asyncio.run(
            services.turns.run(TurnAsk(message="x", execution_id="cx", auth_override=override))
        )
    assert AUTH_OVERRIDE_HEADER not in answer.headers
    detail = answer.body.get("detail") or answer.body["metadata"]
    assert detail["auth_route"] == "baseline"
    warnings = [r for r in caplog.records if "auth_override ignored" in r.getMessage()]
    assert [r.levelno for r in warnings] == [logging.WARNING]
    assert "unit-override-oauth-0001" not in caplog.text
    assert services.registry.recently_completed() == ["cx"]


def test_a_turn_stamps_its_override_on_success_and_on_error(tmp_path: Path) -> None:
    """The header goes with every answer of an override turn."""
    services = services_for(tmp_path)
    override = AuthOverride(api_key=SecretStr("unit-override-key-0001"))

    async def both() -> tuple[int, int, str | None, str | None]:
        ok = await services.turns.run(TurnAsk(message="fine", auth_override=override))
        bad = await services.turns.run(TurnAsk(message="@exit 2", auth_override=override))
        return (
            ok.status,
            bad.status,
            ok.headers.get(AUTH_OVERRIDE_HEADER),
            bad.headers.get(AUTH_OVERRIDE_HEADER),
        )

    assert asyncio.run(both()) == (200, 500, "api_key", "api_key")


@pytest.mark.parametrize(
    ("stop", "status", "outcome"),
    [("terminate", 200, "cancelled"), ("drain", 504, "killed")],
    ids=["the terminate route cancels", "the shutdown drain kills"],
)
def test_a_stopped_turn_answers_by_who_stopped_it(
    tmp_path: Path, stop: str, status: int, outcome: str
) -> None:
    """Only the terminate route makes a turn 'cancelled'; a shutdown kill is a failure."""
    services = services_for(tmp_path)

    async def scenario() -> tuple[int, str]:
        turn = asyncio.create_task(
            services.turns.run(TurnAsk(message="@sleep 30", execution_id="stopme"))
        )
        while not services.registry.running():
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.3)
        if stop == "terminate":
            services.registry.terminate("stopme")
        else:
            await services.registry.drain(0.1)
        answer = await asyncio.wait_for(turn, 15)
        if answer.status == 200:
            return answer.status, str(answer.body["status"])
        return answer.status, str(answer.body["detail"]["error_code"])

    assert asyncio.run(scenario()) == (status, outcome)


@pytest.mark.parametrize(
    ("runtime", "ask", "refused"),
    [
        pytest.param(
            "codex",
            TurnAsk(message="x", system_prompt="terse", allowed_tools=("Read",), max_turns=2,
                    images=(ONE_IMAGE_INPUT,)),
            ["max_turns", "images"],
            id="codex has no turn cap and takes no images on stdin",
        ),
        pytest.param(
            "gemini-cli",
            TurnAsk(message="x", max_turns=2, persist_session=False, allowed_tools=("Read",),
                    images=(ONE_IMAGE_INPUT,)),
            ["max_turns", "images"],
            id="gemini has no turn cap and takes no images on stdin",
        ),
        pytest.param(
            "claude-code",
            TurnAsk(message="x", system_prompt="s", max_turns=2, persist_session=False),
            [],
            id="claude code honours every field",
        ),
    ],
)  # fmt: skip
def test_a_field_the_runtime_cannot_honour_is_refused_before_anything_runs(
    tmp_path: Path, runtime: str, ask: TurnAsk, refused: list[str]
) -> None:
    """A 422 per field, naming field and runtime; the registry never sees the turn."""
    services = services_for(tmp_path, AGENT_RUNTIME=runtime)
    if not refused:
        ask.refuse_unhonoured(services.turns.adapter)
        return
    with pytest.raises(RequestInvalid) as caught:
        asyncio.run(services.turns.run(ask))
    assert [issue["loc"] for issue in caught.value.errors] == [["body", f] for f in refused]
    assert all(runtime in str(issue["msg"]) for issue in caught.value.errors)
    assert services.registry.recently_completed() == []


@pytest.mark.parametrize(
    ("runtime", "command", "ask", "unenforced"),
    [
        pytest.param(
            "codex", FAKE_CODEX,
            TurnAsk(message="x", execution_id="ne-codex", allowed_tools=("Read", "Bash")),
            ["allowed_tools"],
            id="codex runs without its tool list",
        ),
        pytest.param(
            "gemini-cli", FAKE_GEMINI,
            TurnAsk(message="x", execution_id="ne-gemini", allowed_tools=("Read",),
                    persist_session=False),
            ["allowed_tools", "persist_session"],
            id="gemini runs without its tool list and keeps its session",
        ),
    ],
)  # fmt: skip
def test_a_field_the_runtime_cannot_enforce_runs_and_says_so(
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    runtime: str,
    command: Path,
    ask: TurnAsk,
    unenforced: list[str],
) -> None:
    """The turn runs; a WARNING names the fields, and so does `metadata.not_enforced`."""
    services = services_for(
        tmp_path, AGENT_RUNTIME=runtime, AGENT_SERVER_RUNTIME_COMMAND=str(command)
    )
    with caplog.at_level(logging.WARNING, logger="agent_server.turn"):
        answer = asyncio.run(services.turns.run(ask))
    assert answer.status == 200, answer.body
    assert answer.body["metadata"]["not_enforced"] == unenforced
    warned = [r.getMessage() for r in caplog.records if "cannot enforce" in r.getMessage()]
    assert warned == [f"runtime {runtime} cannot enforce {', '.join(unenforced)}: the turn "
                      "runs without it"]  # fmt: skip


@pytest.mark.parametrize(
    ("message", "stop", "expected"),
    [
        ("@result\n@exit 3", None, {"exit_code": 3}),
        ("@result\n@echo-env HOME", None, {"last_event": "assistant"}),
        ("@result\n@sleep 30", "terminate", {"status": "cancelled"}),
        ("@result\n@sleep 30", "timeout", {"error_code": "timeout"}),
    ],
    ids=["a failing exit", "a line after the result", "a terminate", "the timeout"],
)
def test_what_follows_a_result_makes_the_answer_at_the_exit(
    tmp_path: Path, message: str, stop: str | None, expected: dict[str, object]
) -> None:
    """The answer is made at the exit, of what the exit said, not of the result alone."""
    services = services_for(tmp_path)

    async def scenario() -> TurnAnswer:
        ask = TurnAsk(message=message, execution_id="x1", timeout_s=2 if stop else 900)
        turn = asyncio.create_task(services.turns.run(ask))
        if stop == "terminate":
            await result_read(services, "x1")
            services.registry.terminate("x1")
        return await asyncio.wait_for(turn, 20)

    answer = asyncio.run(scenario())
    assert answer.serialised is None
    body = answer.body.get("detail") or answer.body
    seen = {
        "exit_code": body["metadata"]["exit_code"],
        "last_event": body["execution_log"][-1]["type"],
        "status": answer.body.get("status"),
        "error_code": body.get("error_code"),
    }
    assert {key: seen[key] for key in expected} == expected


async def result_read(services: Services, execution_id: str) -> None:
    """Return once the turn's CLI printed its result event (and before it exits)."""
    async with asyncio.timeout(20):
        while True:
            running = {e.execution_id: e for e in services.registry.running()}
            last = running[execution_id].progress.last if execution_id in running else None
            if last is not None and last[0] == "result":
                return
            await asyncio.sleep(0.01)
