"""A credential's outcome is what the API answered, not what the CLI printed (contract §7).

With the broker, every request of a turn's CLI passes it, and it records each answer
(`broker.TurnExchanges`). `Seen` sums one turn's up: how many requests reached the
API, whether the API answered one, the verdict of the last, and the headroom the last
answer's headers report. `judge` puts that over the outcome the CLI's stream gave:

- an outcome only the CLI can know (a container fault, a kill, a timeout, max turns,
  a cancel) and a success stand as they are;
- otherwise the last exchange's refusal decides the row (rate limit with its window
  and reset, auth, billing, model rejection, the upstream's fault);
- a refusal the API never gave (no exchange, or the last one served) blames no
  credential: a printed rate limit, auth or billing failure becomes an execution
  error, `switch_credential` false.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime

from agent_server.broker import Broker, ExchangeVerdict, TurnExchanges, rate_limit_info, verdict_of
from agent_server.broker.placement import rung_of
from agent_server.credentials.state import fingerprint
from agent_server.outcome.classify import Outcome, fallback_message, outcome_of
from agent_server.runtimes.rate_limit import read_rate_limit
from agent_server.wire.instants import format_instant
from agent_server.wire.names import Api, AuthRoute, Layer, OutcomeKind
from agent_server.wire.turns import AuthOverride, RateLimitReading

_DECIDED_BY_EXCHANGE = frozenset(
    {
        OutcomeKind.MODEL_UNSUPPORTED,
        OutcomeKind.RATE_LIMIT,
        OutcomeKind.BILLING,
        OutcomeKind.AUTH,
        OutcomeKind.UPSTREAM_UNAVAILABLE,
        OutcomeKind.EXECUTION_ERROR,
    }
)
"""The rows the API's answer decides; the others are facts of the CLI's process."""
_NEEDS_A_REFUSAL = frozenset({OutcomeKind.RATE_LIMIT, OutcomeKind.BILLING, OutcomeKind.AUTH})
"""The rows that blame a credential: believed only from a refusal the broker saw."""
UNANSWERED = (
    "{label} reported a refusal the API never gave through the server; no credential is blamed"
)


@dataclass(frozen=True)
class RungUse:
    """What one credential of a turn's ladder did: requests served, refusals it got."""

    rung: int
    served: int
    refusals: tuple[ExchangeVerdict, ...]


@dataclass(frozen=True)
class Seen:
    """What the broker saw of one turn's requests."""

    requests: int
    """How many reached the API through the broker."""
    answered: bool
    """True when the API answered at least one (served or refused it): the turn's answer
    is then about its credential, which the API saw."""
    verdict: ExchangeVerdict | None
    """The last exchange's, or None when there was none."""
    reading: RateLimitReading | None
    """The headroom the last answer with unified headers reported."""
    rungs: tuple[RungUse, ...] = ()
    """Each credential of the turn the broker sent a request with, its own (0) first."""
    last_rung: int = 0
    """The credential of the last exchange: the one the turn ended on."""


def seen(exchanges: TurnExchanges, now: datetime) -> Seen:
    """Sum up one turn's exchanges (as they are now)."""
    kept = exchanges.all()
    reading = None
    for exchange in reversed(kept):
        reading = read_rate_limit(rate_limit_info(exchange.headers))
        if reading is not None:
            break
    served: dict[int, int] = {}
    refused: dict[int, list[ExchangeVerdict]] = {}
    for exchange in kept:
        served[exchange.rung] = served.get(exchange.rung, 0) + exchange.served
        refusals = refused.setdefault(exchange.rung, [])
        if not exchange.served:
            refusals.append(verdict_of(exchange, now))
    return Seen(
        requests=exchanges.count,
        answered=any(exchange.status is not None for exchange in kept),
        verdict=verdict_of(kept[-1], now) if kept else None,
        reading=reading,
        rungs=tuple(RungUse(i, served[i], tuple(refused[i])) for i in sorted(served)),
        last_rung=kept[-1].rung if kept else 0,
    )


def judge(outcome: Outcome, turn: Seen, label: str) -> Outcome:
    """The turn's outcome with the API's answer over the CLI's words (see the module)."""
    if outcome.kind not in _DECIDED_BY_EXCHANGE:
        return outcome
    verdict = turn.verdict
    if verdict is None or verdict.kind is None:
        if outcome.kind in _NEEDS_A_REFUSAL:
            return outcome_of(OutcomeKind.EXECUTION_ERROR, UNANSWERED.format(label=label))
        return outcome
    kind = verdict.kind
    message = outcome.message if kind is outcome.kind else fallback_message(kind, label, None)
    if (
        kind is OutcomeKind.RATE_LIMIT
        and verdict.resets_at is not None
        and kind is not outcome.kind
    ):
        message = f"{message}; resets {format_instant(verdict.resets_at)}"
    return outcome_of(
        kind,
        message,
        api_error_status=verdict.api_error_status,
        resets_at=verdict.resets_at,
        rate_limit_type=verdict.rate_limit_type,
    )


@contextmanager
def placed_env(
    broker: Broker | None,
    env: dict[str, str],
    sources: Mapping[str, Layer],
    ladder: Sequence[AuthOverride] = (),
    api: Api = "anthropic",
) -> Iterator[tuple[dict[str, str], TurnExchanges | None]]:
    """A spawn's env (a CLI of `api`) with its credential (and `ladder` after it) in the
    broker's hands, and the turn's exchanges, for the block's length; `env` as it is,
    and None, without a broker or outside it."""
    if broker is None:
        yield env, None
        return
    with broker.lease(env, sources, api) as placed:
        if placed is None:
            yield env, None
            return
        # Set before the spawn: no request can reach the grant before this.
        placed.grant.ladder = tuple(rung_of(o, placed.grant.upstream, api) for o in ladder)
        yield placed.env, placed.grant.exchanges


def ladder_named(
    route: AuthRoute, own: str | None, ladder: Sequence[AuthOverride]
) -> tuple[tuple[AuthRoute, str | None], ...]:
    """Each credential of a laddered turn by route and fingerprint, its own (`route`,
    `own`) first; none without a ladder."""
    if not ladder:
        return ()
    return ((route, own), *((rung.kind, fingerprint(rung.secret)) for rung in ladder))
