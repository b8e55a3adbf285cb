"""The benchmark report: every scenario with its goal and whether it was met, and the plots."""

from __future__ import annotations

from pathlib import Path

import pytest

import bench.__main__ as runner
from bench.stats import row

RESULTS = {
    "ingest": {
        "rows": [
            row("durable single message", 9000, "req/s"),
            row("durable / no-op", 0.7, "ratio", ">= 0.65", True),
        ],
        "latency_samples_ms": {"durable": [1.0, 2.0, 3.0]},
    },
    "pipeline": {"rows": [row("full rebuild / baseline", 2.5, "ratio", "<= 2.0", False)]},
    "read_api": None,
    "freshness": {"rows": [row("pipeline driven by", "loop", "")]},
}


def test_report_lists_every_scenario_with_goal_and_met() -> None:
    text = runner.report(RESULTS, "python -m bench --quick", {"ingest": 60.0, "pipeline": 120.0})
    lines = text.splitlines()
    assert "| scenario | metric | value | goal | met |" in lines
    assert "| ingest | durable single message | 9,000 req/s |  |  |" in lines
    assert "| ingest | durable / no-op | 0.70 ratio | >= 0.65 | yes |" in lines
    assert "| pipeline | full rebuild / baseline | 2.50 ratio | <= 2.0 | **no** |" in lines
    assert "| read_api | (failed or not available) | | | |" in lines
    assert "| freshness | pipeline driven by | loop |  |  |" in lines
    assert "Time taken: 3.0 min (ingest 1.0 min, pipeline 2.0 min)" in text
    assert "`python -m bench --quick`" in text


def test_plots_are_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runner, "RESULTS", tmp_path)
    made = runner.plot(RESULTS)
    assert made == ["throughput.png", "ingest_latency.png"]
    assert all((tmp_path / m).stat().st_size > 1000 for m in made)
