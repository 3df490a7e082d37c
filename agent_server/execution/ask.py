"""One turn as the routes ask for it, and the turn once accepted (contract §6)."""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass, replace

from agent_server.errors import RequestInvalid
from agent_server.execution.chat_session import ChatSession
from agent_server.execution.registry import Execution
from agent_server.runtimes.base import RuntimeAdapter, TurnSpec
from agent_server.spawn_env.per_spawn import SpawnCredential
from agent_server.wire.turns import AuthOverride, ChatRequest, ImageInput, ParallelTaskRequest

logger = logging.getLogger("agent_server.turn")


def new_session_id(adapter: RuntimeAdapter) -> str | None:
    """A fresh session id for a CLI that takes one on argv, else None."""
    return str(uuid.uuid4()) if adapter.assigns_session_id else None


@dataclass(frozen=True)
class TurnAsk:
    """One turn as the routes ask for it (task and chat alike)."""

    message: str
    execution_id: str | None = None
    model: str | None = None
    system_prompt: str | None = None
    allowed_tools: tuple[str, ...] | None = None
    max_turns: int | None = None
    timeout_s: float = 900
    resume_session_id: str | None = None
    persist_session: bool = True
    auth_override: AuthOverride | None = None
    auth_ladder: tuple[AuthOverride, ...] = ()
    """More credentials after `auth_override`, for the broker (contract §6.2)."""
    images: tuple[ImageInput, ...] | None = None
    reset_unknown_session: bool = False
    """Chat only: when the CLI no longer knows the session, start a new one once."""

    @classmethod
    def from_request(cls, body: ParallelTaskRequest | ChatRequest) -> TurnAsk:
        """The turn a task or a chat request body asks for: a chat turn takes the fields
        a task shares with it, and a new session once when the CLI lost the chat's."""
        ask = cls(
            message=body.message,
            execution_id=body.execution_id,
            model=body.model,
            system_prompt=body.system_prompt,
            auth_override=body.auth_override,
            auth_ladder=tuple(body.auth_ladder) if body.auth_ladder else (),
            images=tuple(body.images) if body.images else None,
            reset_unknown_session=isinstance(body, ChatRequest),
        )
        if isinstance(body, ChatRequest):
            return ask
        return replace(
            ask,
            allowed_tools=tuple(body.allowed_tools) if body.allowed_tools is not None else None,
            max_turns=body.max_turns,
            timeout_s=body.timeout_seconds,
            resume_session_id=body.resume_session_id,
            persist_session=body.persist_session,
        )

    def spec(self, permission_mode: str, model: str | None, adapter: RuntimeAdapter) -> TurnSpec:
        """The turn as `adapter` builds its argv and stdin from it (a fresh session id,
        when not resuming and the CLI takes one on argv)."""
        return TurnSpec(
            prompt=self.message,
            permission_mode=permission_mode,
            model=model,
            system_prompt=self.system_prompt,
            allowed_tools=self.allowed_tools,
            max_turns=self.max_turns,
            resume_session_id=self.resume_session_id,
            new_session_id=None if self.resume_session_id else new_session_id(adapter),
            persist_session=self.persist_session,
            images=tuple((i.media_type, i.data) for i in self.images) if self.images else (),
        )

    def options_asked(self) -> list[str]:
        """The optional turn fields this ask sets (a default is not asking)."""
        asked = {
            "model": self.model is not None,
            "system_prompt": self.system_prompt is not None,
            "allowed_tools": self.allowed_tools is not None,
            "max_turns": self.max_turns is not None,
            "resume_session_id": self.resume_session_id is not None,
            "persist_session": not self.persist_session,
            "images": self.images is not None,
        }
        return [name for name, given in asked.items() if given]

    def refused_by(self, adapter: RuntimeAdapter) -> list[str]:
        """The asked fields `adapter` neither honours nor runs without (contract §6.1)."""
        taken = adapter.honours | adapter.not_enforced
        return [name for name in self.options_asked() if name not in taken]

    def refuse_unhonoured(self, adapter: RuntimeAdapter) -> None:
        """422 naming each asked field `adapter` can neither honour nor run without
        (nothing is spawned); a field it takes unenforced is no refusal (contract §6.1)."""
        if refused := self.refused_by(adapter):
            raise RequestInvalid(
                [
                    {
                        "type": "unsupported_by_runtime",
                        "loc": ["body", name],
                        "msg": f"{name} is not supported by runtime {adapter.name}",
                    }
                    for name in refused
                ]
            )

    def usable_ladder(self, brokered: bool) -> tuple[tuple[AuthOverride, ...], str | None]:
        """The `auth_ladder` entries the broker can use, and why any were left out: all,
        without the broker or an `auth_override` to go after; those of another kind than
        the override (the CLI's requests differ by credential mode)."""
        if not self.auth_ladder:
            return (), None
        kind = self.auth_override.kind if self.auth_override is not None else None
        if not brokered:
            return (), "it needs the broker (AGENT_SERVER_BROKER=0 turned it off)"
        if kind is None:
            return (), "it needs an auth_override to go after"
        usable = tuple(rung for rung in self.auth_ladder if rung.kind == kind)
        if len(usable) < len(self.auth_ladder):
            return usable, f"only entries of the auth_override's kind ({kind}) are used"
        return usable, None

    def keeping_usable_ladder(self, brokered: bool, execution_id: str) -> TurnAsk:
        """This ask with only the ladder entries the broker can use; a WARNING says why
        any were left out (the turn runs, as on a runtime that takes no override)."""
        ladder, left_out = self.usable_ladder(brokered)
        if left_out is None:
            return self
        logger.warning("auth_ladder: %s", left_out, extra={"execution_id": execution_id})
        return replace(self, auth_ladder=ladder)

    def unenforced_by(self, adapter: RuntimeAdapter) -> tuple[str, ...]:
        """The asked fields `adapter` takes without enforcing them."""
        return tuple(name for name in self.options_asked() if name in adapter.not_enforced)


@dataclass
class AcceptedTurn:
    """A turn registered (listed, counted, terminable) and not yet run."""

    ask: TurnAsk
    execution: Execution
    credential: SpawnCredential
    chat: ChatSession | None

    @property
    def execution_id(self) -> str:
        """The id it runs under (the one asked for, or a generated one)."""
        return self.execution.execution_id
