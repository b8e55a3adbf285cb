"""The pipeline benchmark's baseline is honest: on generated traffic (anonymous visitors who
identify later, duplicates, late and skewed events), bench/baseline.sql produces exactly the
events and customers marts that `mallard pipeline run` builds."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.baseline import compare, run_baseline
from bench.generator import Traffic
from bench.lake import generate
from tests.conftest import init_data_dir, mallard

pytestmark = pytest.mark.integration


def test_baseline_outputs_equal_the_marts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Both build the customers in several chunks, as they do at 10M messages.
    monkeypatch.setenv("MALLARD_CUSTOMERS_PER_CHUNK", "40")
    data = tmp_path / "data"
    creds = init_data_dir(data)
    traffic = Traffic(
        seed=11,
        customers=300,
        events=4000,
        duplicate_rate=0.05,
        late_rate=0.05,
        skew_rate=0.1,
        client_id=creds["clientId"],
        account_id=creds["accountId"],
        brand_id=creds["brandId"],
    )
    rows, files, _ = generate(data, traffic, "gen", workers=2)
    assert rows == 4000 and files > 2
    mallard("pipeline", "run", data_dir=data)
    out = tmp_path / "baseline.duckdb"
    run_baseline(data, out)
    result = compare(data, out)
    assert set(result) == {"events", "customers", "customers.traits", "customers.metadata"}
    for name, (marts, baseline) in result.items():
        assert marts[0] > 0, name
        assert marts == baseline, name
    # Duplicates were dropped and anonymous visitors stitched, so the check is not trivial.
    assert result["events"][0][0] < 4000
    assert result["customers"][0][0] <= 300  # one per traffic customer
