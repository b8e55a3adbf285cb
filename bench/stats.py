"""Benchmark figures: percentiles, summaries, result rows and the per-scenario JSON file."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path

RESULTS = Path(__file__).parent / "results"


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) with linear interpolation between closest ranks."""
    if not values:
        raise ValueError("percentile of no values")
    if not 0 <= q <= 100:
        raise ValueError(f"q must be within 0..100, got {q}")
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def summarize(values: Sequence[float]) -> dict[str, float]:
    """count, mean, p50, p95, p99, max of a sample (same unit as the sample)."""
    xs = sorted(values)
    return {
        "count": float(len(xs)),
        "mean": sum(xs) / len(xs),
        "p50": percentile(xs, 50),
        "p95": percentile(xs, 95),
        "p99": percentile(xs, 99),
        "max": xs[-1],
    }


def row(
    metric: str, value: float | int | str, unit: str, goal: str = "", ok: bool | None = None
) -> dict[str, object]:
    """One line of a scenario's result table (see bench/__main__.py)."""
    return {"metric": metric, "value": value, "unit": unit, "goal": goal, "ok": ok}


def sample(xs: list[float], k: int = 3000) -> list[float]:
    """At most ~k evenly spaced values, for the latency plots."""
    step = max(1, len(xs) // k)
    return [round(x, 3) for x in xs[::step]]


def write_result(
    scenario: str, rows: list[dict[str, object]], samples: dict[str, list[float]] | None = None
) -> None:
    """`bench/results/<scenario>.json`, the contract the runner reads (bench/__main__.py)."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    doc: dict[str, object] = {"scenario": scenario, "rows": rows}
    if samples is not None:
        doc["latency_samples_ms"] = samples
    (RESULTS / f"{scenario}.json").write_text(json.dumps(doc))
