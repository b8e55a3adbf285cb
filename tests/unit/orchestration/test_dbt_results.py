"""The dbt build line of `mallard pipeline run`, from dbt's run_results.json."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

from orchestration.dbt_results import DbtTally, read_tally, tally
from orchestration.pipeline import StepResult, with_dbt_tally


def _results(*nodes: tuple[str, str]) -> dict[str, object]:
    return {
        "metadata": {"generated_at": "2026-01-01T00:00:10.000000Z"},
        "results": [{"unique_id": uid, "status": status} for uid, status in nodes],
    }


def test_counts_models_data_tests_and_unit_tests() -> None:
    t = tally(
        _results(
            ("model.mallard.stg_messages", "success"),
            ("model.mallard.events", "success"),
            ("test.mallard.unique_events_event_id.abc", "pass"),
            ("unit_test.mallard.int_messages_deduped.dedup_first_wins", "pass"),
        )
    )
    assert t == DbtTally(True, "2/2 models built, 1/1 data tests, 1/1 unit tests passed")


def test_names_a_failed_unit_test_and_counts_what_it_skipped() -> None:
    t = tally(
        _results(
            ("model.mallard.stg_messages", "success"),
            ("unit_test.mallard.int_messages_deduped.dedup_first_wins", "fail"),
            ("model.mallard.int_messages_deduped", "skipped"),
        )
    )
    assert not t.ok
    assert "failed: unit_test int_messages_deduped.dedup_first_wins (fail)" in t.summary
    assert t.summary.endswith("1 skipped")


def test_a_record_older_than_the_run_is_ignored(tmp_path: Path) -> None:
    (tmp_path / "run_results.json").write_text(json.dumps(_results()))
    written = datetime(2026, 1, 1, 0, 0, 10, tzinfo=UTC)
    assert read_tally(tmp_path, written - timedelta(seconds=1)) is not None
    assert read_tally(tmp_path, written + timedelta(seconds=1)) is None
    assert read_tally(tmp_path / "missing", written) is None


def test_the_dbt_line_replaces_dagsters_last_error_line() -> None:
    steps = [
        StepResult("load", True, "1 new landing files, 3 rows"),
        StepResult("dbt_models", False, "\x1b[31m→ e1 e2"),
        StepResult("dbt build", False, "4 models built, 3/3 tests passed"),
    ]
    failed = DbtTally(False, "4/13 models built; failed: unit_test x.y (fail)")
    assert with_dbt_tally(steps, failed) == [
        steps[0],
        StepResult("dbt build", False, failed.summary),
    ]
    assert with_dbt_tally(steps, None) == steps
