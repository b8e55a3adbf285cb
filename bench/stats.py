"""Latency statistics for the benchmarks: percentiles by linear interpolation, summaries."""

from __future__ import annotations

import math
from collections.abc import Sequence


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
