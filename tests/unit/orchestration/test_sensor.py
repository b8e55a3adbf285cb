"""The landing-files sensor: asks for a run when files land, and not while one is in progress."""

from __future__ import annotations

from pathlib import Path

import dagster as dg
import pytest
from dagster._core.storage.dagster_run import DagsterRun

from mallard.paths import DataPaths
from orchestration.defs.ingest import new_files_sensor
from orchestration.load import landed_since, landing_mark
from tests.unit.orchestration.test_load import write_landing


def _evaluate(instance: dg.DagsterInstance, cursor: str | None = None) -> dg.SensorResult:
    sensor = new_files_sensor("pipeline")
    ctx = dg.build_sensor_context(instance=instance, cursor=cursor)
    result = sensor.evaluate_tick(ctx)
    return result


def test_new_files_request_one_run_and_an_active_run_holds_the_next(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MALLARD_DATA_DIR", str(tmp_path))
    paths = DataPaths(tmp_path)
    with dg.DagsterInstance.ephemeral() as instance:
        assert not _evaluate(instance).run_requests  # nothing landed yet

        write_landing(paths, events=50, seed=1, files=1)
        first = _evaluate(instance)
        assert len(first.run_requests) == 1
        cursor = first.cursor
        assert not _evaluate(instance, cursor).run_requests  # the same files: nothing new

        write_landing(paths, events=50, seed=2, files=1)
        instance.add_run(
            DagsterRun(job_name="pipeline", run_id="r-active", status=dg.DagsterRunStatus.STARTED)
        )
        held = _evaluate(instance, cursor)
        assert not held.run_requests and "r-active" in (held.skip_message or "")

        instance.delete_run("r-active")  # the run is over
        assert len(_evaluate(instance, cursor).run_requests) == 1


def test_a_file_whose_name_sorts_first_still_starts_a_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Landing order, not name order: a second collector's file (`t3-...` after `t5-...`) and a
    segment of an earlier day rolled late both land after the last run's cursor."""
    monkeypatch.setenv("MALLARD_DATA_DIR", str(tmp_path))
    paths = DataPaths(tmp_path)
    with dg.DagsterInstance.ephemeral() as instance:
        write_landing(paths, events=50, seed=5, files=1)
        cursor = _evaluate(instance).cursor
        assert not _evaluate(instance, cursor).run_requests

        write_landing(paths, events=50, seed=3, files=1)  # sorts before t5-0000
        second = _evaluate(instance, cursor)
        assert len(second.run_requests) == 1
        cursor = second.cursor

        late = paths.landing_partition("2025-12-31")
        late.mkdir(parents=True)
        src = paths.landing_partition("2026-01-01") / "t3-0000.parquet"
        tmp = late / ".c9-0001.parquet.tmp"
        tmp.write_bytes(src.read_bytes())
        tmp.rename(late / "c9-0001.parquet")  # lands as the roller lands files
        assert len(_evaluate(instance, cursor).run_requests) == 1


def test_a_cursor_from_before_landing_marks_counts_as_none(tmp_path: Path) -> None:
    paths = DataPaths(tmp_path)
    assert landing_mark(paths) == "" and not landed_since("", None)
    write_landing(paths, events=10, seed=1, files=1)
    mark = landing_mark(paths)
    assert landed_since(mark, None) and landed_since(mark, "date=2026-01-01/t1-0000.parquet")
    assert not landed_since(mark, mark)
