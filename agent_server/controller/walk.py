"""One turn's walk: the ladder, climbed until a credential serves it.

Each step asks `pool.rungs.plan_rungs` for the best rung still untried, sends the turn
with that credential as its `auth_override`, and records what came back against the
credential it was sent with: a reading from every answer, a failure from every
refusal (`rate_limit`, `auth`, `billing`). It stops at the first answer no other
credential would change. Bounds: every rung grows the tried set, there are at most
`len(pool) + 2` attempts, and an attempt is sent only while the turn's remaining
time covers `FLOOR_S` plus `SETTLE_S`.

Commit once: a subscription other than the assignment that served becomes the
assignment (`commit.Assignments`), stabilizing a short window. A key or gateway that
served changes no assignment. Every failure, reading and service is the credential's
the server says it ran (`attribution.py`). When every credential is exhausted, the
turn waits for capacity: its retry, persisted, due when a credential is next offered
(`pool/waits.py`; `retries.py` runs it). A stop by hand supersedes the walk.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Callable
from datetime import datetime, timedelta

from agent_server.controller.attribution import ran_on
from agent_server.controller.client import AgentClient, TurnReply
from agent_server.controller.commit import STABILIZE_S, Assignments, stabilizing
from agent_server.controller.errors import (
    AgentError,
    CredentialRefused,
    ProtocolError,
    StoreError,
    TurnFailed,
)
from agent_server.controller.events import Announcer, WalkPhase
from agent_server.controller.pool.file import Pool
from agent_server.controller.pool.rungs import (
    PoolView,
    Rung,
    TurnContext,
    first_subscription,
    plan_rungs,
)
from agent_server.controller.pool.state import (
    Assignment,
    Failure,
    FailureKind,
    PoolSnapshot,
    Reading,
    ScheduledRetry,
    bounded_reset,
)
from agent_server.controller.pool.waits import UNKNOWN_RESET_WAIT, retry_at, switch_back_at
from agent_server.controller.readback import read_back
from agent_server.controller.result import Attempt, WalkOutcome, WalkResult
from agent_server.controller.stores.base import PoolStore
from agent_server.controller.turn import WalkTurn
from agent_server.wire.turns import TurnMetadata, TurnResponse

FLOOR_S = 30.0
"""The least time worth giving one attempt."""
SETTLE_S = 5.0
"""Kept back from each attempt's deadline, so its answer comes back inside the turn's."""
EXTRA_RUNGS = 2
_SWITCH_KINDS: dict[str, FailureKind] = {
    "rate_limit": "rate_limit",
    "auth": "auth",
    "billing": "billing",
}
"""The error codes a credential is blamed for, as the failure kinds they are kept as."""


class Walk:
    """One turn's walk: its tried set, its trail, and the snapshot it decides on. It is
    handed the agent's client and everything else it works with (`Walker.walk`)."""

    def __init__(
        self,
        turn: WalkTurn,
        *,
        client: AgentClient,
        store: PoolStore,
        pool: Pool,
        assignments: Assignments,
        announce: Announcer,
        monotonic: Callable[[], float],
        stabilize: timedelta = timedelta(seconds=STABILIZE_S),
        stopped: Callable[[], bool] = lambda: False,
    ) -> None:
        self.turn = turn
        self.client = client
        self.store = store
        self.pool = pool
        self.assignments = assignments
        self.announce = announce
        self.clock = announce.clock
        self.monotonic = monotonic
        self.execution_id = turn.execution_id or f"walk-{uuid.uuid4().hex[:16]}"
        self.deadline = monotonic() + turn.timeout_s
        self.tried: set[str] = set()
        self.trail: list[Attempt] = []
        self.snapshot = PoolSnapshot()
        self.assignment: Assignment | None = None
        self.legacy = False
        self.stabilize = stabilize
        self.stopped = stopped
        self.started_at = self.clock()
        self.switching = False
        self.busy: set[str] = set()
        """Credentials passed over at their ceiling: they serve, they were only full."""

    async def run(self) -> WalkResult:
        """Climb the ladder until a credential serves, none is left, or time runs out."""
        agent = self.turn.agent
        if self.turn.rerun:
            done = await self._already_done()
            if done is not None:
                return done
        self.snapshot = await self.store.snapshot()
        self.assignment = self.snapshot.assignments.get(agent)
        if self.assignment is None:  # its first walk: the snapshot just said it has none
            first = first_subscription(self._view(), self.clock())
            self.assignment = await self.assignments.first(agent, first)
            self.snapshot = self.snapshot.with_assignment(self.assignment)
        self.announce(WalkPhase.STARTED, agent, credential_id=self.assignment.credential_id)
        limit = len(self.pool.credentials) + EXTRA_RUNGS
        while len(self.trail) < limit:
            rungs = plan_rungs(self._view(), self._context())
            if not rungs:
                break
            remaining = self.deadline - self.monotonic()
            if remaining < FLOOR_S + SETTLE_S:
                return self._result("out_of_time")
            if self.stopped():
                return self._stopped()
            rung = rungs[0]
            self._announce_rung(rung)
            ended = await self._attempt(rung, remaining - SETTLE_S)
            if ended is not None:
                return ended
        return await self._wait_for_capacity()

    def _announce_rung(self, rung: Rung) -> None:
        agent = self.turn.agent
        assigned = self.assignment.credential_id if self.assignment else None
        if rung.credential_id != assigned and not self.switching:
            self.switching = True
            self.announce(WalkPhase.SWITCH_STARTED, agent, credential_id=assigned)
        self.announce(
            WalkPhase.CANDIDATE_SELECTED, agent, credential_id=rung.credential_id, note=rung.reason
        )

    def _stopped(self) -> WalkResult:
        self.announce(WalkPhase.SUPERSEDED, self.turn.agent, note="stopped by hand")
        return self._result("stopped")

    async def _already_done(self) -> WalkResult | None:
        """A re-run turn the server already served: its retained result, not a new run."""
        kept = await read_back(self.client, self.execution_id)
        if kept is None:
            return None
        said = kept.metadata.fingerprint
        known = self.pool.by_fingerprint(said) if said else None
        ident = known.id if known is not None else None
        self.trail.append(Attempt(ident, known.kind if known else None, 200, None))
        note = "read back from the server's retained result"
        self.announce(WalkPhase.SERVED, self.turn.agent, credential_id=ident, note=note)
        return self._result("served", served_by=ident, answer=kept)

    def _view(self) -> PoolView:
        agent = self.turn.agent
        allowed = agent not in self.pool.api_key_opt_outs
        return PoolView.of(
            self.pool.infos, self.snapshot, agent, api_key_allowed=allowed, now=self.clock()
        )

    def _context(self) -> TurnContext:
        return TurnContext(self.clock(), self.turn.interactive, frozenset(self.tried), self.legacy)

    async def _send(self, rung: Rung | None, timeout_s: float) -> TurnReply:
        """The turn, with `rung`'s credential as its override (None: the server's own)."""
        credential = self.pool.credential(rung.credential_id) if rung else None
        request = self.turn.request(self.execution_id, timeout_s, credential)
        reply = await self.client.task(request)
        if not isinstance(reply, TurnReply):  # the walk never asks for async_result
            msg = "the server answered a synchronous turn 202"
            raise ProtocolError(msg)
        return reply

    async def _attempt(self, rung: Rung, timeout_s: float) -> WalkResult | None:
        """Try one rung under its credential's ceiling: a credential whose every slot is
        leased is passed over like a busy rung (the next one, never a wait); the lease is
        held for the attempt and released at its end."""
        self.tried.add(rung.credential_id)
        if not await self._probe_allowed(rung):
            return None
        ceiling = self.pool.ceiling(rung.credential_id)
        if ceiling is None:
            return await self._attempt_leased(rung, timeout_s)
        holder = f"{self.execution_id}:{uuid.uuid4().hex[:8]}"
        now = self.clock()
        # The attempt cannot outlast its timeout, so the lease needs no renewal; a holder
        # that dies leaves it to end at this expiry.
        until = now + timedelta(seconds=timeout_s + SETTLE_S)
        taken = await self.store.acquire_lease(
            rung.credential_id, holder, ceiling=ceiling, at=now, until=until
        )
        if not taken:
            self.busy.add(rung.credential_id)
            note = f"at ceiling ({ceiling} turns in flight)"
            self.announce(
                WalkPhase.AT_CEILING, self.turn.agent, credential_id=rung.credential_id, note=note
            )
            return None
        try:
            return await self._attempt_leased(rung, timeout_s)
        finally:
            await self._release(rung.credential_id, holder)

    async def _probe_allowed(self, rung: Rung) -> bool:
        """A last resort (a credential that failed) is a probe of whether it recovered:
        one a credential per `probe_spacing_seconds` across controllers. A probe spaced
        out is passed over, not blamed (a `probe_spaced` event)."""
        if rung.reason != "last_resort":
            return True
        spacing = timedelta(seconds=self.pool.probe_spacing_seconds)
        if await self.store.claim_probe(rung.credential_id, at=self.clock(), spacing=spacing):
            return True
        note = f"probed less than {self.pool.probe_spacing_seconds:g} s ago"
        self.announce(
            WalkPhase.PROBE_SPACED, self.turn.agent, credential_id=rung.credential_id, note=note
        )
        return False

    async def _release(self, credential_id: str, holder: str) -> None:
        # The turn's outcome stands when the store fails here: the lease ends at its expiry.
        with contextlib.suppress(StoreError):
            await self.store.release_lease(credential_id, holder)

    async def _attempt_leased(self, rung: Rung, timeout_s: float) -> WalkResult | None:
        """Send the turn on one rung; the walk's result when it ends here, None to go on."""
        try:
            reply = await self._send(rung, timeout_s)
        except CredentialRefused as refused:
            if refused.auth_override is None and not self.legacy:
                return await self._legacy(refused, timeout_s)
            return await self._refused(self._ran_on(rung, _metadata(refused)), refused)
        except AgentError as error:
            return await self._refused(self._ran_on(rung, _metadata(error)), error)
        if reply.auth_override is None:
            # An old server ran its own credential: whichever its fingerprint names.
            self.legacy = True
            return await self._served(self._ran_on(None, reply.answer.metadata), reply)
        return await self._served(self._ran_on(rung, reply.answer.metadata), reply)

    def _ran_on(self, sent: Rung | None, metadata: TurnMetadata | None) -> Rung | None:
        """`attribution.ran_on`; when it names nobody, an `unattributed` event says so."""
        ran = ran_on(self.pool, sent, metadata)
        if ran is None:
            said = metadata.fingerprint if metadata is not None else None
            note = f"the server ran a credential the pool does not know ({said or 'unnamed'})"
            self.announce(WalkPhase.UNATTRIBUTED, self.turn.agent, note=note)
        return ran

    async def _served(
        self, ran: Rung | None, reply: TurnReply, *, committed: bool = False
    ) -> WalkResult:
        """A served attempt: its reading kept; a new subscription committed; the gateway
        cooldown started, or ended when a subscription served again."""
        agent = self.turn.agent
        if self.stopped():  # a late answer of a stopped walk changes nothing
            return self._stopped()
        served_by = ran.credential_id if ran is not None else None
        if ran is not None:
            await self._record(
                Reading.of_turn(ran.credential_id, self.clock(), reply.answer.metadata), None
            )
            since = self.assignment.assigned_at if self.assignment else self.started_at
            if self._stabilizing(ran.credential_id) and since < self.started_at:
                self.announce(WalkPhase.STABILIZED, agent, credential_id=served_by)
        self.trail.append(Attempt(served_by, ran.kind if ran else None, 200, None))
        self.announce(WalkPhase.SERVED, agent, credential_id=served_by)
        if self.legacy or ran is None:
            pass  # a legacy commit came before the turn was sent again
        elif ran.kind == "gateway":
            until = switch_back_at(self._view().standings, self.clock())
            await self.store.set_gateway_until(agent, until)
        elif ran.kind == "subscription":
            if agent in self.snapshot.gateway_until:
                await self.store.set_gateway_until(agent, None)
                self.announce(WalkPhase.SWITCHED_BACK, agent, credential_id=ran.credential_id)
            if self._moves(ran.credential_id):
                committed = await self._commit(ran.credential_id, reply.answer.metadata.generation)
        return self._result("served", served_by=served_by, committed=committed, answer=reply.answer)

    def _moves(self, served_by: str) -> bool:
        """Affinity: the agent moves to the subscription that served only when its own
        did not serve; one that was merely at its ceiling still serves, so the agent
        keeps it (a burst does not flip agents between accounts)."""
        if self.assignment is None:
            return True
        assigned = self.assignment.credential_id
        return served_by != assigned and assigned not in self.busy

    async def _refused(self, ran: Rung | None, error: AgentError) -> WalkResult | None:
        """A failed attempt: recorded against the credential that ran (`ran`; nobody's
        when None); the walk goes on only on a switch."""
        agent = self.turn.agent
        if self.stopped():
            return self._stopped()
        ident = ran.credential_id if ran is not None else None
        resets_at = (
            bounded_reset(error.resets_at, error.detail.rate_limit_type, self.clock())
            if isinstance(error, TurnFailed)
            else None
        )
        self.trail.append(
            Attempt(ident, ran.kind if ran else None, error.status, error.error_code, resets_at)
        )
        kind = _SWITCH_KINDS.get(error.error_code)
        switch = isinstance(error, CredentialRefused) and kind is not None
        note = None
        if ident is not None:
            failure = (
                Failure(ident, kind, self.clock(), resets_at, agent)
                if switch and kind is not None
                else None
            )
            await self._record(Reading.of_turn(ident, self.clock(), _metadata(error)), failure)
            if failure is not None and self._stabilizing(ident):
                # Refused while it was stabilizing: warden's immediate hard limit.
                note = "immediate_hard_limit"
                hard = Failure(ident, "immediate_hard_limit", failure.at, resets_at, agent)
                await self._record(None, hard)
        self.announce(
            WalkPhase.ATTEMPT_FAILED,
            agent,
            credential_id=ident,
            error_code=error.error_code,
            resets_at=resets_at,
            note=note,
        )
        return None if switch else self._result("failed", error=error)

    async def _legacy(self, error: AgentError, timeout_s: float) -> WalkResult:
        """An old server ignored the override: the failure is its own credential's (the one
        its fingerprint names, or nobody's). One subscription is applied with
        reload-token, and the turn is sent once more."""
        self.legacy = True
        metadata = _metadata(error)
        ran = self._ran_on(None, metadata)
        self.tried = {ran.credential_id} if ran is not None else set()
        ended = await self._refused(ran, error)
        if ended is not None:
            return ended
        rungs = plan_rungs(self._view(), self._context())
        if not rungs:
            return await self._wait_for_capacity()
        rung = rungs[0]
        self.tried.add(rung.credential_id)
        self.announce(
            WalkPhase.CANDIDATE_SELECTED,
            self.turn.agent,
            credential_id=rung.credential_id,
            note="legacy",
        )
        committed = await self._commit(
            rung.credential_id, metadata.generation if metadata else None
        )
        try:
            reply = await self._send(None, timeout_s)
        except AgentError as again:
            ended = await self._refused(self._ran_on(rung, _metadata(again)), again)
            return ended if ended is not None else await self._wait_for_capacity()
        return await self._served(
            self._ran_on(rung, reply.answer.metadata), reply, committed=committed
        )

    async def _commit(self, credential_id: str, server_generation: int | None) -> bool:
        """Make `credential_id` the assignment: the store's CAS first, then the server's."""
        made = await self.assignments.commit(
            self.client,
            self.turn.agent,
            self.pool.credential(credential_id),
            expected_generation=self.assignment.generation if self.assignment else None,
            server_generation=server_generation,
        )
        if made is None:
            return False
        self.assignment = made
        window = f"{self.stabilize.total_seconds():g} s"
        note = f"until a turn that starts after the commit is served on it, or {window} pass"
        self.announce(
            WalkPhase.STABILIZING, self.turn.agent, credential_id=credential_id, note=note
        )
        return True

    def _stabilizing(self, credential_id: str) -> bool:
        return stabilizing(self.assignment, credential_id, self.clock(), self.stabilize)

    async def _record(self, reading: Reading | None, failure: Failure | None) -> None:
        """What one answer said of its credential: in the store (one write) and the snapshot."""
        if reading is None and failure is None:
            return
        await self.store.record(reading=reading, failure=failure)
        if reading is not None:
            self.snapshot = self.snapshot.with_reading(reading)
        if failure is not None:
            self.snapshot = self.snapshot.with_failure(failure)

    async def _wait_for_capacity(self) -> WalkResult:
        """Every credential is exhausted: one retry at the earliest known reset."""
        if self.stopped():
            return self._stopped()
        agent, now = self.turn.agent, self.clock()
        reset = retry_at(self._view().standings, now)
        retry = ScheduledRetry(
            agent=agent,
            retry_id=uuid.uuid4().hex,
            due_at=reset or now + UNKNOWN_RESET_WAIT,
            assignment_generation=self.assignment.generation if self.assignment else None,
            turn_ref=self.execution_id,
            scheduled_at=now,
        )
        await self.store.schedule_retry(retry)
        result = self._result("waiting_for_capacity", earliest_reset=reset, retry=retry)
        self.announce(
            WalkPhase.WAITING_FOR_CAPACITY, agent, resets_at=retry.due_at, note=result.trail_text()
        )
        return result

    def _result(
        self,
        outcome: WalkOutcome,
        *,
        served_by: str | None = None,
        committed: bool = False,
        answer: TurnResponse | None = None,
        error: AgentError | None = None,
        earliest_reset: datetime | None = None,
        retry: ScheduledRetry | None = None,
    ) -> WalkResult:
        return WalkResult(
            agent=self.turn.agent,
            execution_id=self.execution_id,
            outcome=outcome,
            status=self.trail[-1].status if self.trail else None,
            served_by=served_by,
            committed=committed,
            trail=tuple(self.trail),
            earliest_reset=earliest_reset,
            retry=retry,
            legacy=self.legacy,
            answer=answer,
            error=error,
        )


def _metadata(error: AgentError) -> TurnMetadata | None:
    """A failed turn's metadata (what ran, its reading); None for any other refusal."""
    return error.detail.metadata if isinstance(error, TurnFailed) else None
