"""Prometheus metrics of one server (contract §8), on a registry of its own.

Every label value comes from a fixed set (outcomes, auth routes, reload results, the
shadow-key names, or `other`): nothing the agent writes can grow the series.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
OTHER_LABEL = "other"
"""The label value of anything outside a label's fixed set."""


class Metrics:
    """The contract §8 metrics; one instance per app, so tests never share counters."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.turns = Counter(
            "agent_server_turns",
            "Turns by outcome (success, cancelled, or the contract §7 error_code) and auth route.",
            ["outcome", "auth_route"],
            registry=self.registry,
        )
        self.turn_seconds = Histogram(
            "agent_server_turn_seconds",
            "Wall time of a turn, spawn to answer.",
            buckets=(0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600),
            registry=self.registry,
        )
        self.active_turns = Gauge(
            "agent_server_active_turns", "Turns running now.", registry=self.registry
        )
        self.reloads = Counter(
            "agent_server_credential_reloads",
            "reload-token requests by result (changed, unchanged, or an error_code).",
            ["result"],
            registry=self.registry,
        )
        self.generation = Gauge(
            "agent_server_credential_generation",
            "The current credential generation.",
            registry=self.registry,
        )
        self.suppressed_keys = Counter(
            "agent_server_spawn_suppressed_keys",
            "Spawns in which a force-unset swallowed a .env key, by key name (or other).",
            ["key"],
            registry=self.registry,
        )

        self.callbacks = Counter(
            "agent_server_result_callbacks",
            "Async turns' result callbacks by result (delivered, rejected, kept, lost).",
            ["result"],
            registry=self.registry,
        )
        self.heartbeats = Counter(
            "agent_server_heartbeats",
            "Liveness heartbeats to the controller by result (sent, failed).",
            ["result"],
            registry=self.registry,
        )
        self.retention_failures = Counter(
            "agent_server_result_retention_failures",
            "Terminal answers that could not be retained on disk.",
            registry=self.registry,
        )

    def render(self) -> bytes:
        """The Prometheus text exposition of every metric."""
        return generate_latest(self.registry)
