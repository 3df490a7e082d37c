"""Figures, the machine they were measured on, and how they are printed and saved."""

from __future__ import annotations

import json
import math
import os
import platform
import statistics
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

Verdict = Literal["PASS", "FAIL", "info"]


@dataclass(frozen=True)
class Figure:
    """One measured figure, its target and the FastAPI baseline it must beat."""

    name: str
    measured: float
    unit: str
    target: str = ""
    verdict: Verdict = "info"
    baseline: str = ""
    """The FastAPI server this design comes from, where known."""
    ratio: float | None = None
    target_value: float | None = None
    """The limit in `target`, as a number: the table prints measured / limit beside it."""
    note: str = ""
    """One short line for the table."""
    details: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def limited(cls, name: str, measured: float, unit: str, limit: float, **fields: Any) -> Figure:
        """A figure whose target is `measured <= limit`: its text, verdict and value."""
        space = "" if unit == "x" else " "
        return cls(
            name,
            measured,
            unit,
            target=f"<= {limit:g}{space}{unit}",
            verdict=at_most(measured, limit),
            target_value=limit,
            **fields,
        )

    def shown(self) -> str:
        """The measured value with its unit, for the table."""
        if self.unit == "x":
            return f"{self.measured:.3f}x"
        if self.unit == "s":
            return f"{self.measured:.3f} s"
        if self.unit == "ms":
            return f"{self.measured:.2f} ms"
        if self.unit == "us":
            return f"{self.measured:,.1f} us"
        return f"{self.measured:.1f} {self.unit}"


def at_most(value: float, limit: float) -> Verdict:
    """PASS when `value <= limit` (a NaN never passes)."""
    return "PASS" if value <= limit else "FAIL"


def median(values: Sequence[float]) -> float:
    """The median, NaN for no values."""
    return statistics.median(values) if values else math.nan


def percentile(values: Sequence[float], fraction: float) -> float:
    """Nearest-rank percentile (`fraction` in 0..1), NaN for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(fraction * len(ordered)))
    return ordered[rank - 1]


def cpu_busy(interval_s: float = 0.5) -> float:
    """The fraction of all CPUs busy over the next `interval_s` (from /proc/stat)."""

    def snapshot() -> tuple[int, int]:
        with open("/proc/stat", encoding="ascii") as stat:
            fields = [int(v) for v in stat.readline().split()[1:9]]
        idle = fields[3] + fields[4]  # idle + iowait
        return idle, sum(fields)

    idle_before, total_before = snapshot()
    time.sleep(interval_s)
    idle_after, total_after = snapshot()
    total = total_after - total_before
    return 1.0 - (idle_after - idle_before) / total if total else math.nan


def machine() -> dict[str, Any]:
    """What the figures were measured on, and when."""
    model = "unknown"
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    try:
        load = Path("/proc/loadavg").read_text(encoding="ascii").split()[:3]
    except OSError:
        load = []
    return {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "nproc": len(os.sched_getaffinity(0)),
        "cpu_model": model,
        "python": platform.python_version(),
        "kernel": platform.release(),
        "loadavg_at_start": " ".join(load),
    }


BUSY_WARNING = 0.5
"""Other load above this fraction of the CPUs makes ratios on two cores unreliable."""


def render(host: dict[str, Any], figures: Sequence[Figure], elapsed_s: float) -> str:
    """The header and the table, as printed."""
    busy: dict[str, float] = host.get("cpu_busy_before", {})
    lines = [
        "agent-server benchmarks",
        f"  date     {host['date']}",
        f"  machine  {host['nproc']} CPUs, {host['cpu_model']}, load {host['loadavg_at_start']}",
        f"  python   {host['python']}, kernel {host['kernel']}",
        "  busy     other load before each figure: "
        + ", ".join(f"{n}: {b:.0%}" for n, b in busy.items()),
    ]
    if any(b > BUSY_WARNING for b in busy.values()):
        lines.append(
            f"  WARNING  the machine was over {BUSY_WARNING:.0%} busy before some figures: "
            "ratios and latencies are unreliable, run again when it is quiet"
        )
    lines.append("")
    header = ("figure", "measured", "target", "of target", "verdict", "FastAPI", "notes")
    rows = [header] + [
        (
            f.name,
            f.shown(),
            f.target,
            "" if f.target_value is None else f"{f.measured / f.target_value:.3f}",
            f.verdict if f.ratio is None else f"{f.verdict} ({f.ratio:.2f}x)",
            f.baseline,
            f.note,
        )
        for f in figures
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    for index, row in enumerate(rows):
        lines.append("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)))
        if index == 0:
            lines.append("  ".join("-" * width for width in widths))
    for figure in figures:
        if "table" in figure.details:
            lines += ["", figure.details["table"]]
    missed = [f.name for f in figures if f.verdict == "FAIL"]
    lines += ["", f"{len(missed)} target(s) missed; total {elapsed_s:.0f} s"]
    return "\n".join(line.rstrip() for line in lines)


def write_json(
    path: Path, host: dict[str, Any], figures: Sequence[Figure], elapsed_s: float, quick: bool
) -> None:
    """Save the same figures (with their details) as JSON."""
    document = {
        "machine": host,
        "quick": quick,
        "elapsed_s": round(elapsed_s, 1),
        "figures": [asdict(f) for f in figures],
    }
    path.write_text(json.dumps(document, indent=2, allow_nan=True) + "\n", encoding="utf-8")
