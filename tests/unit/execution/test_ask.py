"""TurnAsk.from_request: the one place a task or a chat body becomes a turn's ask."""

from __future__ import annotations

from dataclasses import fields

import pytest

from agent_server.execution.ask import TurnAsk
from agent_server.wire.turns import ChatRequest, ParallelTaskRequest
from tests.support.images import ONE_IMAGE

OVERRIDE = {"api_key": "unit-ask-key-0001"}
LADDER = [{"api_key": "unit-ask-key-0002"}]
SHARED = {
    "message": "hello",
    "execution_id": "ask-1",
    "model": "claude-sonnet-4-5",
    "system_prompt": "be brief",
    "auth_override": OVERRIDE,
    "auth_ladder": LADDER,
    "images": [ONE_IMAGE],
}
TASK_ONLY = {
    "allowed_tools": ["Read", "Bash"],
    "max_turns": 3,
    "timeout_seconds": 42,
    "resume_session_id": "sess-1",
    "persist_session": False,
}


def test_a_task_body_asks_for_every_field_it_sets() -> None:
    """Each task field lands in the ask; lists become tuples; no chat session reset."""
    ask = TurnAsk.from_request(ParallelTaskRequest.model_validate({**SHARED, **TASK_ONLY}))
    assert (ask.message, ask.execution_id, ask.model, ask.system_prompt) == (
        "hello", "ask-1", "claude-sonnet-4-5", "be brief",
    )  # fmt: skip
    assert ask.auth_override is not None and ask.auth_override.kind == "api_key"
    assert [rung.kind for rung in ask.auth_ladder] == ["api_key"]
    assert ask.images is not None and len(ask.images) == 1
    assert ask.allowed_tools == ("Read", "Bash")
    assert (ask.max_turns, ask.timeout_s, ask.resume_session_id) == (3, 42, "sess-1")
    assert ask.persist_session is False
    assert ask.reset_unknown_session is False


def test_a_chat_body_asks_for_the_shared_fields_and_a_session_reset() -> None:
    """A chat turn takes the fields it shares with a task, the task-only ones at their
    defaults, and a new session once when the CLI lost the chat's."""
    from_chat = TurnAsk.from_request(ChatRequest.model_validate(SHARED))
    from_task = TurnAsk.from_request(ParallelTaskRequest.model_validate(SHARED))
    differing = {
        f.name for f in fields(TurnAsk) if getattr(from_chat, f.name) != getattr(from_task, f.name)
    }
    assert differing == {"reset_unknown_session"}
    assert from_chat.reset_unknown_session is True


@pytest.mark.parametrize("body_type", [ParallelTaskRequest, ChatRequest], ids=["task", "chat"])
def test_a_body_of_a_message_alone_asks_for_the_defaults(
    body_type: type[ParallelTaskRequest] | type[ChatRequest],
) -> None:
    """Nothing asked is nothing set: no options, an empty ladder, the 900 s deadline."""
    ask = TurnAsk.from_request(body_type.model_validate({"message": "hi"}))
    assert ask.options_asked() == []
    assert (ask.auth_override, ask.auth_ladder, ask.images) == (None, (), None)
    assert ask.timeout_s == 900
