"""deploy/grafana/pool-service.json: a Grafana dashboard over the pool service's metrics.

Every query names only metrics the service exports (the fixed names of its metrics
module), with the suffixes Prometheus gives their types; every exported metric is on
some panel; each panel's datasource is the import-time input, never a local uid.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from agent_server.controller.service.metrics import ServiceMetrics

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "pool-service.json"
EXPORTED = {
    "agent_pool_window_utilization": "gauge",
    "agent_pool_credential_standing": "gauge",
    "agent_pool_refusals": "counter",
    "agent_pool_walks": "counter",
    "agent_pool_walk_rungs": "histogram",
    "agent_pool_waiting_turns": "gauge",
    "agent_pool_retries_run": "counter",
    "agent_pool_probes_run": "counter",
    "agent_pool_turns_in_flight": "gauge",
    "agent_pool_agent_heartbeat_age_seconds": "gauge",
}
"""The service's metrics as its registry names them (a counter's samples end `_total`)."""
SUFFIXES = {"gauge": ("",), "counter": ("_total",), "histogram": ("_bucket", "_sum", "_count")}
METRIC = re.compile(r"\bagent_pool_[a-z_]+\b")


def sample_names(exported: dict[str, str]) -> set[str]:
    """The series names a query may read of the exported metrics."""
    return {name + suffix for name, kind in exported.items() for suffix in SUFFIXES[kind]}


def expressions(dashboard: dict[str, Any]) -> list[str]:
    """Every panel's query expressions."""
    return [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    """The dashboard as Grafana imports it."""
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    return loaded


def test_the_names_are_the_services_own() -> None:
    """The service's registry exports exactly these metrics, of these types."""
    registry = ServiceMetrics().registry
    assert {m.name: m.type for m in registry.collect()} == EXPORTED


def test_every_query_reads_only_exported_series(dashboard: dict[str, Any]) -> None:
    """No query names a metric the service does not export (or with a wrong suffix)."""
    allowed = sample_names(EXPORTED)
    named = {name for expr in expressions(dashboard) for name in METRIC.findall(expr)}
    assert named, "no query names a metric"
    assert named <= allowed, sorted(named - allowed)


def test_every_exported_metric_is_on_a_panel(dashboard: dict[str, Any]) -> None:
    """Each metric the service exports is read by some query."""
    named = {name for expr in expressions(dashboard) for name in METRIC.findall(expr)}
    shown = {m for m, kind in EXPORTED.items() if named & sample_names({m: kind})}
    assert shown == set(EXPORTED), sorted(set(EXPORTED) - shown)


def test_the_check_catches_a_misnamed_metric() -> None:
    """A query naming an unexported series, or a counter without `_total`, is caught."""
    allowed = sample_names(EXPORTED)
    for expr in ("rate(agent_pool_refusals[5m])", "agent_pool_walk_rungs_total"):
        assert not set(METRIC.findall(expr)) <= allowed, expr


def test_panels_use_the_import_time_datasource(dashboard: dict[str, Any]) -> None:
    """One Prometheus input, and every panel and query reads from it."""
    (given,) = dashboard["__inputs"]
    assert (given["type"], given["pluginId"]) == ("datasource", "prometheus")
    wanted = {"type": "prometheus", "uid": "${" + given["name"] + "}"}
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dashboard["panels"]:
        assert panel["datasource"] == wanted, panel["title"]
        assert all(t["datasource"] == wanted for t in panel["targets"]), panel["title"]
