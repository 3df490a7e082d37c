"""One turn, end to end: snapshot, spawn env, spawn, parse, classify, answer (contract §6, §7).

    credential snapshot -> per-spawn layer -> spawn env -> adapter argv
        -> runner (process group) -> parser -> classify_outcome -> answer

Everything that leaves here (response text, execution_log, error messages) has
passed through the redactor, which knows every staged override secret.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from agent_server.credentials.state import CredentialState, fingerprint
from agent_server.errors import ApiError
from agent_server.execution.outcome import (
    Outcome,
    OutcomeKind,
    classify_outcome,
    error_detail,
    retry_after_seconds,
)
from agent_server.execution.registry import Execution
from agent_server.execution.runner import run_process
from agent_server.execution.stream import ProcessFacts, TurnStream
from agent_server.execution.transcript import Transcript
from agent_server.logs import execution_id_var
from agent_server.models import AuthOverride, TurnMetadata, TurnResponse
from agent_server.runtimes.base import RuntimeAdapter, TurnSpec
from agent_server.services import Services
from agent_server.spawn_env.per_spawn import SpawnCredential, spawn_credential

logger = logging.getLogger("agent_server.turn")

AUTH_OVERRIDE_HEADER = "X-Trinity-Auth-Override"
UNKNOWN_SESSION_MARKERS = ("no conversation found with session id",)
SHUTDOWN_KILLED = Outcome(
    kind=OutcomeKind.KILLED,
    status=504,
    error_code="killed",
    retryable=False,
    switch_credential=False,
    api_error_status=None,
    resets_at=None,
    rate_limit_type=None,
    message="The server shut down and stopped this turn after its shutdown grace",
)
"""A turn still running when the shutdown grace ran out (contract §1, §7 row 4)."""


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
    reset_unknown_session: bool = False
    """Chat only: when the CLI no longer knows the session, start a new one once."""


@dataclass
class TurnAnswer:
    """The HTTP answer of one turn: status, JSON body, headers, and its outcome."""

    status: int
    body: dict[str, Any]
    outcome: Outcome
    session_id: str | None
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class _Attempt:
    stream: TurnStream
    facts: ProcessFacts
    transcript: Transcript


async def run_turn(
    services: Services, ask: TurnAsk, client_gone: asyncio.Event | None = None
) -> TurnAnswer:
    """Run one turn of the runtime CLI with exactly the credential it was given."""
    adapter = services.adapter
    execution_id = ask.execution_id or uuid.uuid4().hex
    override = ask.auth_override
    if override is not None and not adapter.supports_auth_override:
        logger.warning(
            "runtime %s cannot take a Claude credential: auth_override ignored",
            adapter.name,
            extra={"execution_id": execution_id},
        )
        override = None
    credential = spawn_credential(execution_id, override)
    services.redactor.add(credential.secrets())
    state = services.store.current  # the one snapshot this spawn uses
    try:
        execution = services.registry.start(execution_id, credential.auth_route, state.generation)
    except ApiError as refused:  # busy or execution_in_progress: still this turn's answer
        if credential.auth_route != "baseline":
            refused.headers[AUTH_OVERRIDE_HEADER] = credential.auth_route
        raise
    context = execution_id_var.set(execution_id)
    services.metrics.active_turns.inc()
    linked = _link(client_gone, execution.cancel)
    try:
        answer = await _run(services, adapter, ask, execution, credential, state)
        if credential.auth_route != "baseline":
            answer.headers[AUTH_OVERRIDE_HEADER] = credential.auth_route
        services.metrics.turns.labels(
            outcome=answer.outcome.error_code or answer.outcome.kind.value,
            auth_route=credential.auth_route,
        ).inc()
        services.metrics.turn_seconds.observe(time.monotonic() - execution.started)
        logger.info(
            "turn finished: outcome=%s status=%s auth_route=%s generation=%s",
            answer.outcome.kind.value,
            answer.status,
            credential.auth_route,
            state.generation,
        )
        return answer
    finally:
        if linked is not None:
            linked.cancel()
        services.metrics.active_turns.dec()
        services.registry.finish(execution)
        execution_id_var.reset(context)


async def _run(
    services: Services,
    adapter: RuntimeAdapter,
    ask: TurnAsk,
    execution: Execution,
    credential: SpawnCredential,
    state: CredentialState,
) -> TurnAnswer:
    settings = services.settings
    spawn = services.spawn_env(state, credential.layer)
    for key in spawn.suppressed:
        services.metrics.suppressed_keys.labels(key=key).inc()
    spec = TurnSpec(
        prompt=ask.message,
        permission_mode=settings.permission_mode,
        model=credential.model or ask.model,
        system_prompt=ask.system_prompt,
        allowed_tools=ask.allowed_tools,
        max_turns=ask.max_turns,
        resume_session_id=ask.resume_session_id,
        new_session_id=None if ask.resume_session_id else str(uuid.uuid4()),
        persist_session=ask.persist_session,
    )
    deadline = time.monotonic() + ask.timeout_s
    attempt = await _spawn(services, adapter, spec, spawn.env, deadline, execution)
    session_reset = False
    if ask.reset_unknown_session and spec.resume_session_id and _session_unknown(attempt):
        logger.warning(
            "the CLI no longer knows chat session %s: starting a new one", spec.resume_session_id
        )
        spec = replace(spec, resume_session_id=None, new_session_id=str(uuid.uuid4()))
        attempt = await _spawn(services, adapter, spec, spawn.env, deadline, execution)
        session_reset = True
    if attempt.facts.terminated and execution.shut_down and not execution.terminated:
        # Only the terminate route makes a turn "cancelled" (200): a turn the shutdown
        # killed failed, and the controller must be able to re-issue it elsewhere.
        outcome = SHUTDOWN_KILLED
    else:
        outcome = classify_outcome(
            attempt.stream,
            attempt.facts,
            runtime_label=adapter.label,
            expected_permission_mode=(
                spec.permission_mode if adapter.reports_permission_mode else None
            ),
            now=datetime.now(UTC),
        )
    return _answer(
        services,
        outcome,
        attempt,
        execution=execution,
        credential=credential,
        state=state,
        session_id=attempt.stream.session_id or spec.resume_session_id or spec.new_session_id,
        session_reset=session_reset,
    )


async def _spawn(
    services: Services,
    adapter: RuntimeAdapter,
    spec: TurnSpec,
    env: dict[str, str],
    deadline: float,
    execution: Execution,
) -> _Attempt:
    settings = services.settings
    parser = adapter.new_parser()
    transcript = Transcript(settings.max_log_bytes)

    def on_line(line: bytes) -> None:
        transcript.append(line, is_result=parser.feed(line))

    result = await run_process(
        adapter.argv(settings.runtime_command, spec),
        env=env,
        cwd=settings.workdir,
        stdin=adapter.stdin(spec),
        timeout_s=max(deadline - time.monotonic(), 0.001),
        on_line=on_line,
        cancel=execution.cancel,
    )
    facts = replace(result.facts, stderr=services.redactor.redact(result.facts.stderr))
    return _Attempt(parser.stream, facts, transcript)


def _session_unknown(attempt: _Attempt) -> bool:
    """True when a `--resume` failed because the CLI has no such session."""
    if attempt.stream.has_result and not attempt.stream.is_error:
        return False
    texts = [attempt.facts.stderr, *attempt.stream.error_texts]
    return any(marker in text.lower() for text in texts for marker in UNKNOWN_SESSION_MARKERS)


def _answer(
    services: Services,
    outcome: Outcome,
    attempt: _Attempt,
    *,
    execution: Execution,
    credential: SpawnCredential,
    state: CredentialState,
    session_id: str | None,
    session_reset: bool,
) -> TurnAnswer:
    """Build the one HTTP answer of a turn, every string redacted."""
    redactor = services.redactor
    stream = attempt.stream
    secret = next(iter(credential.secrets()), None)
    metadata = TurnMetadata(
        execution_id=execution.execution_id,
        session_id=session_id,
        model=stream.model,
        cost_usd=stream.cost_usd,
        duration_ms=stream.duration_ms,
        num_turns=stream.num_turns,
        input_tokens=stream.input_tokens,
        output_tokens=stream.output_tokens,
        exit_code=attempt.facts.exit_code,
        auth_route=credential.auth_route,
        generation=state.generation,
        fingerprint=fingerprint(secret) if secret is not None else state.fingerprint,
        api_key_source=stream.api_key_source,
        log_truncated=attempt.transcript.truncated,
        session_reset=session_reset,
    )
    log = redactor.redact_value(_events(attempt.transcript))
    if outcome.kind in (OutcomeKind.SUCCESS, OutcomeKind.CANCELLED):
        text = (
            stream.result_text if stream.result_text is not None else "".join(stream.assistant_text)
        )
        body = TurnResponse(
            status="success" if outcome.kind is OutcomeKind.SUCCESS else "cancelled",
            response=redactor.redact(text),
            execution_log=log,
            session_id=session_id,
            timestamp=datetime.now(UTC).isoformat(),
            metadata=metadata,
        ).model_dump()
        return TurnAnswer(200, body, outcome, session_id)
    detail = error_detail(
        outcome,
        execution_id=execution.execution_id,
        auth_route=credential.auth_route,
        metadata=metadata.model_dump(),
        execution_log=log,
    )
    detail["message"] = redactor.redact(str(detail["message"]))
    headers = {}
    retry_after = retry_after_seconds(outcome, datetime.now(UTC))
    if retry_after is not None:
        headers["Retry-After"] = str(retry_after)
    return TurnAnswer(outcome.status, {"detail": detail}, outcome, session_id, headers)


def _events(transcript: Transcript) -> list[Any]:
    """The kept stdout lines as JSON events (a non-JSON line stays a string)."""
    events: list[Any] = []
    for line in transcript.lines():
        text = line.decode("utf-8", errors="replace")
        try:
            events.append(json.loads(text))
        except ValueError:
            events.append(text)
    return events


def _link(source: asyncio.Event | None, target: asyncio.Event) -> asyncio.Task[None] | None:
    """Set `target` once `source` is set (a client that went away cancels its turn)."""
    if source is None:
        return None

    async def forward() -> None:
        with contextlib.suppress(asyncio.CancelledError):
            await source.wait()
            target.set()

    return asyncio.create_task(forward())
