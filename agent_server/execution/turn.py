"""One turn, end to end: snapshot, spawn env, spawn, parse, classify, answer (contract §6).

    credential snapshot -> per-spawn layer -> spawn env -> adapter argv
        -> runner (process group) -> parser -> classify_outcome -> answer

`TurnRunner` is built once by the composition root with exactly the collaborators a
turn uses. Its answer is built once, after the CLI's exit (a large one on a worker
thread). All that leaves here passed the redactor, which knows every override secret
before the spawn.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio

from agent_server.broker import Broker, TurnExchanges
from agent_server.credentials.state import CredentialState, fingerprint
from agent_server.credentials.store import CredentialStore
from agent_server.errors import ApiError
from agent_server.execution.answer import (
    FinishedTurn,
    TurnAnswer,
    build_answer,
    made_aside,
    turn_refusal,
)
from agent_server.execution.ask import AcceptedTurn, TurnAsk, new_session_id
from agent_server.execution.chat_session import ChatSession
from agent_server.execution.exchanges import judge, ladder_named, placed_env, seen
from agent_server.execution.registry import Execution, Registry
from agent_server.execution.transcript import INLINE_ANSWER_BYTES, MAX_LINE_BYTES, Transcript
from agent_server.logs import execution_id_var
from agent_server.metrics import OTHER_LABEL, Metrics
from agent_server.outcome.classify import Outcome, cancelled, classify_outcome, shutdown_killed
from agent_server.process.group import Reaper
from agent_server.process.runner import ProcessFacts, run_process
from agent_server.process.spawn_user import launcher_failed
from agent_server.records.results import Results
from agent_server.redaction.redactor import Redactor
from agent_server.runtimes.base import RuntimeAdapter, TurnSpec, override_kinds
from agent_server.runtimes.stream import TurnStream
from agent_server.spawn_env.builder import SpawnEnvBuilder
from agent_server.spawn_env.descriptors import by_descriptor
from agent_server.spawn_env.per_spawn import SpawnCredential, spawn_credential
from agent_server.spawn_env.spawn_files import SpawnFiles
from agent_server.wire.names import (
    AUTH_OVERRIDE_HEADER,
    EXECUTION_ID,
    SUBSCRIPTION_SHADOW_KEYS,
    OutcomeKind,
)

logger = logging.getLogger("agent_server.turn")


@dataclass
class _Attempt:
    stream: TurnStream
    facts: ProcessFacts
    transcript: Transcript
    session_reset: bool


@dataclass
class TurnRunner:
    """Runs turns of one runtime CLI, each with exactly the credential it was given."""

    adapter: RuntimeAdapter
    store: CredentialStore
    spawn_envs: SpawnEnvBuilder
    registry: Registry
    metrics: Metrics
    redactor: Redactor
    command: str
    workdir: Path
    permission_mode: str
    max_log_bytes: int
    reaper: Reaper
    results: Results
    spawn_files: SpawnFiles
    launcher: tuple[str, ...] = ()
    """The argv prefix that runs a spawn as the spawn user (`SpawnUser.launcher`), or none."""
    broker: Broker | None = None
    setting_sources: tuple[str, ...] | None = None
    """The settings files the CLI loads (`Settings.setting_sources`)."""
    """Holds each spawn's credential when set (contract §4.8); None: the spawn holds it."""

    async def run(self, ask: TurnAsk, *, chat: ChatSession | None = None) -> TurnAnswer:
        """Accept and run one turn (its execution's `cancel` stops it, as terminate does)."""
        return await self.finish(self.accept(ask, chat=chat))

    def accept(self, ask: TurnAsk, *, chat: ChatSession | None = None) -> AcceptedTurn:
        """Register a turn (listed, counted against the cap, terminable); nothing runs yet.

        Raises its refusals (422 unsupported_by_runtime, 409 busy or execution_in_progress,
        with the whole §7 body). With `chat`, it is one of the agent's chat: `queued` until
        the chat turn before it is done. The caller must `finish` an accepted turn."""
        ask.refuse_unhonoured(self.adapter)
        execution_id = ask.execution_id or uuid.uuid4().hex
        if unenforced := ask.unenforced_by(self.adapter):
            logger.warning(
                "runtime %s cannot enforce %s: the turn runs without it",
                self.adapter.name,
                ", ".join(unenforced),
                extra={"execution_id": execution_id},
            )
        override = ask.auth_override
        brokered = self.broker is not None and self.adapter.brokered
        if override is not None and override.kind not in override_kinds(self.adapter, brokered):
            logger.warning(
                "runtime %s cannot take an auth_override of kind %s%s: auth_override ignored",
                self.adapter.name,
                override.kind,
                "" if brokered else " without the broker",
                extra={"execution_id": execution_id},
            )
            override = None
        ask = replace(ask, auth_override=override).keeping_usable_ladder(brokered, execution_id)
        credential = spawn_credential(execution_id, override, self.adapter.api)
        self.redactor.add([*credential.secrets(), *(rung.secret for rung in ask.auth_ladder)])
        self.redactor.own([execution_id])  # its answers and listings name it as it is
        generation = self.store.current.generation
        try:
            execution = self.registry.start(
                execution_id, credential.auth_route, generation, queued=chat is not None
            )
        except ApiError as refused:  # busy or execution_in_progress: still this turn's answer
            raise turn_refusal(refused, ask.execution_id, credential.auth_route) from None
        self.metrics.active_turns.inc()
        return AcceptedTurn(ask, execution, credential, chat)

    async def finish(self, turn: AcceptedTurn) -> TurnAnswer:
        """Run an accepted turn to its answer and settle it (envelope, retention, events);
        a refusal before exec (413 spawn_too_large) is raised, settled as well."""
        ended, _ = await self.conclude(turn)
        if isinstance(ended, ApiError):
            raise ended
        return ended

    async def conclude(self, turn: AcceptedTurn) -> tuple[TurnAnswer | ApiError, dict[str, Any]]:
        """Run an accepted turn and settle it: its answer, or its refusal before exec (413
        spawn_too_large), and the terminal envelope settled of it (contract §6.6)."""
        execution, credential = turn.execution, turn.credential
        context = execution_id_var.set(execution.execution_id)
        try:
            try:
                if turn.chat is None:
                    answer = await self._run(turn.ask, execution, credential, self.store.current)
                else:
                    answer = await self._chat_turn(turn.ask, execution, credential, turn.chat)
            except ApiError as refused:  # spawn_too_large: refused before exec
                refusal = turn_refusal(refused, turn.ask.execution_id, credential.auth_route)
                body = {"detail": refusal.body()}
                return refusal, self._settle(turn, refusal.status, body, refusal.error_code)
            # A turn whose credential the API answered nothing through the broker names none (§4.8).
            if credential.auth_route != "baseline" and answer.credited:
                answer.headers[AUTH_OVERRIDE_HEADER] = credential.auth_route
            envelope = self._settle(turn, answer.status, answer.body, answer.outcome.error_code)
            asyncio.get_running_loop().call_soon(
                self._count, turn, answer, time.monotonic() - execution.started
            )
            return answer, envelope
        finally:
            self.metrics.active_turns.dec()
            self.registry.finish(execution)
            execution_id_var.reset(context)

    def _settle(
        self, turn: AcceptedTurn, status: int, body: dict[str, Any], error_code: str | None
    ) -> dict[str, Any]:
        """The turn's envelope now (redacted when retained or sent); its retention, and the
        end of its live events, at the loop's next step."""
        execution = turn.execution
        envelope = self.results.settle(
            execution.execution_id,
            status,
            body,
            auth_route=turn.credential.auth_route,
            elapsed_ms=int((time.monotonic() - execution.started) * 1000),
        )
        terminal = {
            "execution_id": execution.execution_id,
            "status": envelope["status"],
            "http_status": status,
            "error_code": error_code,
        }
        asyncio.get_running_loop().call_soon(execution.progress.close, terminal)
        return envelope

    def _count(self, turn: AcceptedTurn, answer: TurnAnswer, seconds: float) -> None:
        """A turn's metrics and its log line (the answer has left: nothing waits for them)."""
        route = turn.credential.auth_route
        outcome = answer.outcome
        self.metrics.turns.labels(
            outcome=outcome.error_code or outcome.kind.value, auth_route=route
        ).inc()
        self.metrics.turn_seconds.observe(seconds)
        logger.info(
            "turn finished: outcome=%s status=%s auth_route=%s generation=%s",
            outcome.kind.value,
            answer.status,
            route,
            turn.execution.generation,
        )

    async def _chat_turn(
        self, ask: TurnAsk, execution: Execution, credential: SpawnCredential, chat: ChatSession
    ) -> TurnAnswer:
        """Wait for the chat (or a terminate), then run on the chat's session."""
        if not await chat.acquire_unless(execution.cancel):
            return self._never_started(execution, credential)
        try:
            state = self.store.current  # the credential in force now, not at acceptance
            execution.state, execution.generation = "running", state.generation
            ask = replace(ask, resume_session_id=chat.current())
            answer = await self._run(ask, execution, credential, state, chat=True)
            if answer.outcome.kind is OutcomeKind.SUCCESS and answer.session_id:
                chat.remember(answer.session_id)
            return answer
        finally:
            chat.release()

    def _never_started(self, execution: Execution, credential: SpawnCredential) -> TurnAnswer:
        """A queued turn stopped before it ran: cancelled (or killed by the shutdown)."""
        state = self.store.current
        killed = execution.shut_down and not execution.terminated
        outcome = shutdown_killed() if killed else cancelled()
        finished = FinishedTurn(
            execution_id=execution.execution_id,
            auth_route=credential.auth_route,
            generation=execution.generation,
            fingerprint=state.fingerprint,
            stream=TurnStream(),
            exit_code=None,
            transcript=Transcript(0),
            chat=True,
        )
        return build_answer(outcome, finished, datetime.now(UTC))

    async def _run(
        self,
        ask: TurnAsk,
        execution: Execution,
        credential: SpawnCredential,
        state: CredentialState,
        *,
        chat: bool = False,
    ) -> TurnAnswer:
        spawn = await self.spawn_envs.build(state.baseline, state.overrides, credential.layer)
        for key in spawn.suppressed:
            # A label from a fixed set only: `.env` names are the agent's to choose.
            label = key if key in SUBSCRIPTION_SHADOW_KEYS else OTHER_LABEL
            self.metrics.suppressed_keys.labels(key=label).inc()
        placing = placed_env(
            self.broker, spawn.env, spawn.sources, ask.auth_ladder, self.adapter.api
        )
        with placing as (env, exchanges):
            # Its files of the placed env: Gemini's settings follow its (the broker's) base URL.
            env = self.spawn_files.env_for(env, self.adapter.spawn_files(env))
            environment = by_descriptor(env, self.adapter.credential_descriptors)
            return await self._run_spawns(
                ask, execution, credential, state, environment, exchanges, chat=chat
            )

    async def _run_spawns(
        self,
        ask: TurnAsk,
        execution: Execution,
        credential: SpawnCredential,
        state: CredentialState,
        environment: tuple[dict[str, str], dict[str, str]],
        exchanges: TurnExchanges | None,
        *,
        chat: bool,
    ) -> TurnAnswer:
        """Spawn the turn's CLI (again on a new session if its chat's is gone); its answer."""
        spec = ask.spec(self.permission_mode, credential.model or ask.model, self.adapter)
        # With the credential in the broker's hands, the CLI's API is the broker.
        api_base = self.broker.url if exchanges is not None and self.broker is not None else None
        spec = replace(spec, setting_sources=self.setting_sources, api_base=api_base)
        deadline = time.monotonic() + ask.timeout_s
        spawned_with = next((fingerprint(s) for s in credential.secrets()), state.fingerprint)
        ladder = ladder_named(credential.auth_route, spawned_with, ask.auth_ladder)
        not_enforced = ask.unenforced_by(self.adapter)

        def answer(attempt: _Attempt) -> TurnAnswer:
            """The answer of `attempt`, its CLI exited."""
            now = datetime.now(UTC)
            brokered = seen(exchanges, now) if exchanges is not None else None
            turn = FinishedTurn(
                execution_id=execution.execution_id,
                auth_route=credential.auth_route,
                generation=state.generation,
                fingerprint=spawned_with,
                stream=attempt.stream,
                exit_code=attempt.facts.exit_code,
                transcript=attempt.transcript,
                session_reset=attempt.session_reset,
                chat=chat,
                not_enforced=not_enforced,
                seen=brokered,
                ladder=ladder,
            )
            outcome = self._classify(attempt, execution, spec, now)
            if brokered is not None:
                outcome = judge(outcome, brokered, self.adapter.hints.label)
            return build_answer(outcome, turn, now)

        attempt = await self._spawn(spec, environment, deadline, execution)
        if ask.reset_unknown_session and spec.resume_session_id and self._session_unknown(attempt):
            logger.warning(
                "the CLI no longer knows chat session %s: starting a new one",
                spec.resume_session_id,
            )
            spec = replace(
                spec, resume_session_id=None, new_session_id=new_session_id(self.adapter)
            )
            attempt = await self._spawn(spec, environment, deadline, execution, reset=True)
        if attempt.transcript.cost <= INLINE_ANSWER_BYTES:
            return answer(attempt)
        return await anyio.to_thread.run_sync(made_aside, lambda: answer(attempt), self.redactor)

    def _classify(
        self, attempt: _Attempt, execution: Execution, spec: TurnSpec, now: datetime
    ) -> Outcome:
        if attempt.facts.terminated and execution.shut_down and not execution.terminated:
            # Only the terminate route makes a turn "cancelled" (200): a turn the shutdown
            # killed failed, and the controller must be able to re-issue it elsewhere.
            return shutdown_killed()
        return classify_outcome(
            attempt.stream,
            attempt.facts,
            hints=self.adapter.hints,
            expected_permission_mode=(
                spec.permission_mode if self.adapter.reports_permission_mode else None
            ),
            now=now,
        )

    async def _spawn(
        self,
        spec: TurnSpec,
        environment: tuple[dict[str, str], dict[str, str]],
        deadline: float,
        execution: Execution,
        *,
        reset: bool = False,
    ) -> _Attempt:
        """Run the CLI once (`reset`: again, on a new session) with `environment` (its env,
        and the credentials it takes on descriptors)."""
        parser = self.adapter.new_parser()
        transcript = Transcript(self.max_log_bytes)

        def on_line(line: bytes) -> None:
            if transcript.skims(line):
                return
            # Redacted as it arrives: nothing downstream (parse, clip, shape) sees a secret.
            clean = self.redactor.redact_bytes(line)
            is_result = parser.feed(clean)
            transcript.append(clean, is_result=is_result, parsed=parser.last_event)
            execution.progress.add_line(clean)

        def on_spawn(pid: int) -> None:
            logger.debug("spawned %s as process group %d", self.adapter.name, pid)

        env, descriptors = environment
        result = await run_process(
            [*self.launcher, *self.adapter.argv(self.command, spec)],
            env=env,
            # Through the launcher the spawn enters the workdir as the spawn user.
            cwd="/" if self.launcher else self.workdir,
            stdin=self.adapter.stdin(spec),
            timeout_s=max(deadline - time.monotonic(), 0.001),
            on_line=on_line,
            cancel=execution.cancel,
            on_spawn=on_spawn,
            reaper=self.reaper,
            # Every process of this spawn inherits it, also the ones that leave its group.
            sweep_tag=f"{EXECUTION_ID}={execution.execution_id}",
            descriptors=descriptors,
            max_line_bytes=MAX_LINE_BYTES,
        )
        if result.cut_lines:
            transcript.cut()
        facts = result.facts
        if self.launcher and launcher_failed(facts.exit_code, facts.stderr):
            facts = replace(facts, spawn_failed=True)
        stderr = self.redactor.redact(facts.stderr)
        if stderr is not facts.stderr:  # `redact` returns the same text when it masked nothing
            facts = replace(facts, stderr=stderr)
        return _Attempt(parser.stream, facts, transcript, reset)

    def _session_unknown(self, attempt: _Attempt) -> bool:
        """True when a resume failed because the CLI has no such session."""
        texts = [attempt.facts.stderr, *attempt.stream.error_texts]
        failed = not attempt.stream.has_result or attempt.stream.is_error
        return failed and self.adapter.hints.session_unknown(texts)
