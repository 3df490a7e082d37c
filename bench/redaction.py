"""Figure 6: what redaction costs on a 1 MB turn, for 10, 1,000 and 20,000 secrets.

A turn pays the redactor twice: every stdout line as it arrives (`redact_bytes`, so
nothing downstream sees a secret) and the answer's body on its way out (`clean`).
The matcher is one Aho-Corasick automaton, so the cost follows the text, not the
number of secrets; the figures say how close 20,000 values stay to 10. Building the
automaton is paid once per change of the secret set: its time is printed too.
"""

from __future__ import annotations

import json
import secrets
import statistics
import time
from collections.abc import Callable
from datetime import UTC, datetime

from agent_server.execution.answer import FinishedTurn, build_answer
from agent_server.execution.transcript import Transcript
from agent_server.outcome.classify import ROWS, Outcome
from agent_server.redaction.redactor import Redactor
from agent_server.runtimes.stream import TurnStream
from agent_server.wire.names import OutcomeKind
from bench.plan import Plan
from bench.report import Figure

SIZES = (10, 1_000, 20_000)
TURN_BYTES = 1024 * 1024
_NOW = datetime(2026, 12, 1, tzinfo=UTC)
TARGET_RATIO = 3.0
"""20,000 values may cost at most this many times what 10 cost on the same turn."""


def _turn_lines(leak: str) -> list[bytes]:
    """About 1 MB of stream-json: assistant prose and tool results, a secret in a few."""
    lines = []
    size = 0
    index = 0
    while size < TURN_BYTES:
        text = f"step {index}: " + "the quick brown fox jumps over the lazy dog " * 20
        if index % 200 == 0:
            text += f" key={leak}"
        content = [{"type": "text", "text": text}]
        line = json.dumps({"type": "assistant", "message": {"content": content}}).encode()
        lines.append(line)
        size += len(line)
        index += 1
    return lines


def _median_s(call: Callable[[], None], rounds: int) -> float:
    samples = []
    for _ in range(rounds):
        started = time.perf_counter()
        call()
        samples.append(time.perf_counter() - started)
    return statistics.median(samples)


def measure(plan: Plan) -> list[Figure]:
    """Ingestion + answer redaction of one 1 MB turn per redactor size, and the ratio."""
    rounds = 3 if plan.quick else 9
    costs: dict[int, float] = {}
    figures = []
    for size in SIZES:
        values = [f"tok-{secrets.token_urlsafe(30)}" for _ in range(size)]
        redactor = Redactor()
        started = time.perf_counter()
        redactor.add(values)
        redactor.redact("warm")  # builds the automaton
        build_s = time.perf_counter() - started
        lines = _turn_lines(values[size // 2])

        def one_turn(redactor: Redactor = redactor, lines: list[bytes] = lines) -> None:
            transcript = Transcript(8 * TURN_BYTES)
            for line in lines:
                transcript.append(redactor.redact_bytes(line))
            row = ROWS[OutcomeKind.SUCCESS]
            outcome = Outcome(
                OutcomeKind.SUCCESS, row.status, None, False, False, None, None, None, ""
            )
            turn = FinishedTurn("e", "baseline", 1, None, TurnStream(), 0, transcript)
            answer = build_answer(outcome, turn, _NOW)
            redactor.clean(answer.body)

        costs[size] = _median_s(one_turn, rounds)
        figures.append(
            Figure(
                f"6 redaction of a 1 MB turn, {size:,} secrets",
                costs[size] * 1000,
                "ms",
                note=f"automaton built once in {build_s * 1000:.1f} ms",
                details={"build_ms": build_s * 1000, "values": size},
            )
        )
    ratio = costs[SIZES[-1]] / costs[SIZES[0]]
    figures.append(
        Figure.limited(
            f"6 redaction cost, {SIZES[-1]:,} / {SIZES[0]} secrets",
            ratio,
            "x",
            TARGET_RATIO,
            ratio=ratio,
        )
    )
    return figures
