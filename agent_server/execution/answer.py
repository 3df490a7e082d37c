"""The HTTP answer of one turn: the success body, or the error body of contract §7.

Its strings come from CLI output that was redacted as it arrived; the route renders
the body through `Redactor.dumps`, the one gate every answer passes. The §7 body's
keys are written here only: `error_detail` for a turn that ran, `turn_refusal` for
one refused.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from agent_server.errors import ApiError
from agent_server.execution.exchanges import Seen
from agent_server.execution.transcript import Transcript
from agent_server.outcome.classify import ROWS, Outcome
from agent_server.redaction.redactor import Redactor, Serialised
from agent_server.runtimes.context import context_window_for
from agent_server.runtimes.events import load_event
from agent_server.runtimes.stream import TurnStream
from agent_server.wire.instants import format_instant
from agent_server.wire.names import AUTH_OVERRIDE_HEADER, AuthRoute, OutcomeKind
from agent_server.wire.turns import (
    ChatContext,
    CredentialRefusal,
    CredentialUse,
    TurnMetadata,
    TurnResponse,
)


@dataclass
class TurnAnswer:
    """The HTTP answer of one turn: status, JSON body, headers, and its outcome."""

    status: int
    body: dict[str, Any]
    outcome: Outcome
    session_id: str | None
    headers: dict[str, str] = field(default_factory=dict)
    serialised: Serialised | None = None
    """The body's JSON, when a large answer was made aside (`body` is never changed after)."""
    credited: bool = True
    """False when the API answered no request on the turn's credential through the broker
    (contract §4.8): the answer then names no credential."""


@dataclass(frozen=True)
class FinishedTurn:
    """What one finished turn's answer is built from."""

    execution_id: str
    auth_route: AuthRoute
    generation: int
    fingerprint: str | None
    """Of the override's secret when one was given, else of the state's token."""
    stream: TurnStream
    exit_code: int | None
    transcript: Transcript
    session_reset: bool = False
    chat: bool = False
    """An `/api/chat` turn: its answer carries the `session` context."""
    not_enforced: tuple[str, ...] = ()
    """The asked turn fields its runtime took without enforcing them."""
    seen: Seen | None = None
    """What the broker saw of the turn's requests (None: it ran without the broker)."""
    ladder: tuple[tuple[AuthRoute, str | None], ...] = ()
    """With an `auth_ladder`: each credential's route and fingerprint, its own first."""

    @property
    def served_by(self) -> str | None:
        """The fingerprint the answer names: the credential the turn ended on."""
        if not self.credited:
            return None
        if self.ladder and self.seen is not None:
            return self.ladder[self.seen.last_rung][1]
        return self.fingerprint

    @property
    def credited(self) -> bool:
        """False when the broker saw the API answer no request on this turn's credential."""
        return self.seen is None or self.seen.answered


def build_answer(outcome: Outcome, turn: FinishedTurn, now: datetime) -> TurnAnswer:
    """The one HTTP answer of a turn (its route renders it through the redactor)."""
    stream = turn.stream
    # Only a session id the CLI itself reported: never one it did not see.
    session_id = stream.session_id
    context_window = stream.context_window or context_window_for(stream.model)
    metadata = TurnMetadata(
        execution_id=turn.execution_id,
        session_id=session_id,
        model=stream.model,
        cost_usd=stream.cost_usd,
        duration_ms=stream.duration_ms,
        num_turns=stream.num_turns,
        input_tokens=stream.input_tokens,
        output_tokens=stream.output_tokens,
        cache_read_tokens=stream.cache_read_tokens or 0,
        cache_creation_tokens=stream.cache_creation_tokens or 0,
        context_window=context_window,
        exit_code=turn.exit_code,
        auth_route=turn.auth_route,
        generation=turn.generation,
        fingerprint=turn.served_by,
        api_key_source=stream.api_key_source,
        log_truncated=turn.transcript.truncated,
        session_reset=turn.session_reset,
        # With the broker, the headroom is the API's own headers', never the CLI's report.
        rate_limit=stream.rate_limit if turn.seen is None else turn.seen.reading,
        not_enforced=list(turn.not_enforced),
        api_requests=None if turn.seen is None else turn.seen.requests,
        credentials=_credentials(turn) if turn.ladder else None,
    )
    log = _events(turn.transcript)
    if outcome.kind in (OutcomeKind.SUCCESS, OutcomeKind.CANCELLED):
        text = (
            stream.result_text if stream.result_text is not None else "".join(stream.assistant_text)
        )
        body = TurnResponse(
            status="success" if outcome.kind is OutcomeKind.SUCCESS else "cancelled",
            response=text,
            execution_log=[],
            session_id=session_id,
            timestamp=now.isoformat(),
            metadata=metadata,
            session=_chat_context(stream, context_window) if turn.chat else None,
        ).model_dump(exclude=set() if turn.chat else {"session"})
        body["execution_log"] = log  # as it is: a dump would copy every event
        return TurnAnswer(200, body, outcome, session_id, credited=turn.credited)
    detail = error_detail(
        outcome,
        execution_id=turn.execution_id,
        auth_route=turn.auth_route,
        metadata=metadata.model_dump(),
        execution_log=log,
    )
    headers = {}
    retry_after = retry_after_seconds(outcome, now)
    if retry_after is not None:
        headers["Retry-After"] = str(retry_after)
    return TurnAnswer(
        outcome.status, {"detail": detail}, outcome, session_id, headers, credited=turn.credited
    )


def made_aside(make: Callable[[], TurnAnswer], redactor: Redactor) -> TurnAnswer:
    """`make()`, with its JSON made ahead: for a worker thread, so that a large answer
    (its log parsed, its body serialised) never holds the event loop."""
    made = make()
    made.serialised = redactor.serialise(made.body)
    return made


def error_detail(
    outcome: Outcome,
    *,
    execution_id: str,
    auth_route: str,
    metadata: dict[str, Any] | None,
    execution_log: list[Any] | None,
) -> dict[str, Any]:
    """The inner `detail` of a §7 error body (the caller wraps it as `{"detail": …}`)."""
    return {
        "message": outcome.message,
        "error_code": outcome.error_code,
        "retryable": outcome.retryable,
        "switch_credential": outcome.switch_credential,
        "execution_id": execution_id,
        "auth_route": auth_route,
        "api_error_status": outcome.api_error_status,
        "resets_at": format_instant(outcome.resets_at) if outcome.resets_at is not None else None,
        "rate_limit_type": outcome.rate_limit_type,
        "metadata": metadata,
        "execution_log": execution_log,
    }


def turn_refusal(refused: ApiError, execution_id: str | None, auth_route: AuthRoute) -> ApiError:
    """A refusal of a turn (409 busy, 413 spawn_too_large, …) with the whole §7 body, and
    the override header when the turn had one."""
    refused.detail.update(
        execution_id=execution_id,
        auth_route=auth_route,
        api_error_status=None,
        resets_at=None,
        rate_limit_type=None,
        metadata=None,
        execution_log=None,
    )
    if auth_route != "baseline":
        refused.headers[AUTH_OVERRIDE_HEADER] = auth_route
    return refused


def retry_after_seconds(outcome: Outcome, now: datetime) -> int | None:
    """Seconds for a `Retry-After` header: until `resets_at`, rounded up, at least 1."""
    if outcome.resets_at is None:
        return None
    aware_now = now if now.tzinfo is not None else now.replace(tzinfo=UTC)
    seconds = (outcome.resets_at - aware_now).total_seconds()
    return max(1, math.ceil(seconds))


def _credentials(turn: FinishedTurn) -> list[CredentialUse]:
    """Every credential of a laddered turn the broker sent a request with (§6.2)."""
    uses = turn.seen.rungs if turn.seen is not None else ()
    return [
        CredentialUse(
            rung=use.rung,
            auth_route=turn.ladder[use.rung][0],
            fingerprint=turn.ladder[use.rung][1],
            served=use.served,
            refusals=[
                CredentialRefusal(
                    error_code=(ROWS[v.kind].error_code if v.kind else None) or "execution_error",
                    api_error_status=v.api_error_status,
                    resets_at=format_instant(v.resets_at) if v.resets_at else None,
                    rate_limit_type=v.rate_limit_type,
                )
                for v in use.refusals
            ],
        )
        for use in uses
    ]


def _chat_context(stream: TurnStream, context_window: int) -> ChatContext:
    """The chat session and its fill: the last model call's whole prompt, in tokens."""
    used = sum(
        value or 0
        for value in (
            stream.call_input_tokens,
            stream.cache_read_tokens,
            stream.cache_creation_tokens,
        )
    )
    return ChatContext(
        session_id=stream.session_id, context_tokens=used, context_window=context_window
    )


_JSON_STARTS = frozenset(b'{["-0123456789tfn \t\r')
"""The bytes a line that is JSON can start with: any other line is text unparsed."""


def _events(transcript: Transcript) -> list[Any]:
    """The kept stdout lines as JSON values; a line that is no sound JSON stays text."""
    events: list[Any] = []
    for line, parsed in transcript.entries():
        event = parsed
        if event is None and line and line[0] in _JSON_STARTS:
            event = load_event(line)
        events.append(event if event is not None else line.decode("utf-8", errors="replace"))
    return events
