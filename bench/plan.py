"""How many repetitions a run makes: the full run (about two minutes) or `--quick`."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Plan:
    """Repetition counts and time bounds of one run; every loop is bounded by both."""

    quick: bool
    timeline_turns: int
    """Figure 0: marked turns on each side, interleaved."""
    turn_pairs: int
    """Figure 1: server turns and direct spawns, interleaved, this many of each."""
    warmup_pairs: int
    parallel_rounds: int
    """Figure 2: rounds of 32 parallel turns each way."""
    reloads: int
    """Figure 3: reloads measured idle, and again under load."""
    stream_s: float
    """Figure 3: how long each of the 32 loaded turns streams."""
    starts: int
    """Figure 4: fresh servers started for start-to-healthy and idle RSS."""
    big_turn_bytes: int
    """Figure 4: what the big turn's CLI prints."""
    env_budget_s: float
    """Figure 5: time spent on each micro-benchmark."""
    machine_samples: int
    """Figure 7: wake-ups and cold system calls, 50 ms apart, this many of each."""
    walk_rounds: int
    """Figure 8: whole walks timed, and rung selections over 1,000 credentials."""
    flood_s: float
    """Figure 9: how long each flooding turn prints."""


FULL = Plan(
    quick=False,
    timeline_turns=101,
    turn_pairs=61,
    warmup_pairs=3,
    parallel_rounds=9,
    reloads=1000,
    stream_s=12.0,
    starts=5,
    big_turn_bytes=200 * 1024 * 1024,
    env_budget_s=2.0,
    machine_samples=100,
    walk_rounds=200,
    flood_s=10.0,
)
QUICK = Plan(
    quick=True,
    timeline_turns=11,
    turn_pairs=7,
    warmup_pairs=1,
    parallel_rounds=1,
    reloads=20,
    stream_s=5.0,
    starts=2,
    big_turn_bytes=32 * 1024 * 1024,
    env_budget_s=0.3,
    machine_samples=10,
    walk_rounds=20,
    flood_s=3.0,
)
