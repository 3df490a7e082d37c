"""The service's Prometheus metrics, in a registry of its own (names fixed: the Grafana
dashboard in the repository reads them; `docs/pool-service.md` lists them).

Counters count what this instance did (walks, refusals, retries and probes it ran);
gauges are read from the store at each scrape, so every instance reports the whole
pool's windows, standings, waiting turns and turns in flight.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from datetime import datetime

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from agent_server.controller.events import WalkEvent, WalkPhase
from agent_server.controller.pool.file import Pool
from agent_server.controller.pool.state import PoolSnapshot
from agent_server.controller.pool.status import pool_rows
from agent_server.controller.result import WalkResult
from agent_server.controller.service.liveness import Beat

STANDINGS = ("available", "throttled", "failed")
WINDOWS = ("five_hour", "seven_day")
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class ServiceMetrics:
    """The metrics of one service instance."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.utilization = Gauge(
            "agent_pool_window_utilization",
            "A credential's use of a window, 0..1 (its latest usable reading)",
            ["credential", "window"],
            registry=r,
        )
        self.standing = Gauge(
            "agent_pool_credential_standing",
            "1 for a credential's current standing, 0 for the others",
            ["credential", "standing"],
            registry=r,
        )
        self.refusals = Counter(
            "agent_pool_refusals", "Refusals by credential and error code", ["credential", "kind"],
            registry=r,
        )  # fmt: skip
        self.walks = Counter("agent_pool_walks", "Walks ended, by outcome", ["outcome"], registry=r)
        self.rungs = Histogram(
            "agent_pool_walk_rungs",
            "Rungs tried per walk",
            buckets=(0, 1, 2, 3, 4, 6, 8, 12, 16),
            registry=r,
        )
        self.waiting = Gauge("agent_pool_waiting_turns", "Turns waiting for capacity", registry=r)
        self.retries = Counter("agent_pool_retries_run", "Waiting turns' retries run", registry=r)
        self.probes = Counter("agent_pool_probes_run", "Switch-back probes run", registry=r)
        self.in_flight = Gauge(
            "agent_pool_turns_in_flight", "Leases held (turns in flight)", ["credential"],
            registry=r,
        )  # fmt: skip
        self.heartbeat_age = Gauge(
            "agent_pool_agent_heartbeat_age_seconds", "Seconds since an agent's last heartbeat",
            ["agent"], registry=r,
        )  # fmt: skip

    def on_event(self, event: WalkEvent) -> None:
        """Count what one event says (refusals, retries run)."""
        if event.phase is WalkPhase.ATTEMPT_FAILED:
            self.refusals.labels(event.credential_id or "", event.error_code or "").inc()
        elif event.phase is WalkPhase.RETRY_DUE:
            self.retries.inc()

    def on_result(self, result: WalkResult) -> None:
        """Count one walk's end and its rungs."""
        self.walks.labels(result.outcome).inc()
        self.rungs.observe(len(result.trail))

    def render(
        self, pool: Pool, snapshot: PoolSnapshot, beats: Mapping[str, Beat], now: datetime
    ) -> bytes:
        """The text exposition, the gauges read from `snapshot` first."""
        for row in pool_rows(pool.infos, snapshot, now):
            for window, use in zip(WINDOWS, (row.five_hour_use, row.seven_day_use), strict=True):
                if use is None:
                    with contextlib.suppress(KeyError):  # no usable reading: no sample
                        self.utilization.remove(row.credential, window)
                else:
                    self.utilization.labels(row.credential, window).set(use)
            for standing in STANDINGS:
                self.standing.labels(row.credential, standing).set(row.state == standing)
            self.in_flight.labels(row.credential).set(snapshot.in_flight(row.credential, now))
        self.waiting.set(len(snapshot.retries))
        for agent, beat in beats.items():
            age = (now - beat.received_at).total_seconds()
            self.heartbeat_age.labels(agent).set(max(0.0, age))
        return generate_latest(self.registry)
