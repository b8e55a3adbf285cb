"""A failing pipeline is seen: every pass's record (mallard/passes.py) counts the failures in a
row, `mallard pipeline status` and `/health` say so, and the watcher tries again with backoff
and logs an error from the third failure in a row. The watcher's loop runs here for real, with
each pass replaced by one that fails (the passes themselves are tested elsewhere)."""

from __future__ import annotations

import json
import logging
import threading
from datetime import UTC, datetime
from pathlib import Path

import pytest

from mallard.harness import mallard
from mallard.passes import LOUD_AFTER, read_last_pass, record_pass
from mallard.paths import DataPaths
from orchestration import pipeline
from orchestration.pipeline import StepResult
from orchestration.window import PassKind
from tests.unit.orchestration.test_load import write_landing


def test_the_record_counts_failures_in_a_row(tmp_path: Path) -> None:
    paths = DataPaths(tmp_path)
    assert read_last_pass(paths) is None
    started = datetime.now(UTC)
    for n in range(1, 4):
        last = record_pass(paths, "full", "test", started, "dbt build: model x failed")
        assert (last.ok, last.failed_in_a_row, last.pass_number) == (False, n, n)
    assert last.loud and "FAILED (3 in a row): dbt build: model x failed" in last.line()
    ok = record_pass(paths, "served", "test", started, None)
    assert (ok.ok, ok.failed_in_a_row, ok.pass_number, ok.loud) == (True, 0, 4, False)
    assert read_last_pass(paths) == ok


def test_pipeline_status_says_how_the_last_pass_ended(tmp_path: Path) -> None:
    paths = DataPaths(tmp_path)
    none = mallard("pipeline", "status", data_dir=tmp_path, check=False)
    assert none.returncode == 2 and "no pass has run" in none.stdout
    record_pass(paths, "full", "mallard pipeline run", datetime.now(UTC), "load: disk full")
    failed = mallard("pipeline", "status", "--json", data_dir=tmp_path, check=False)
    assert failed.returncode == 1
    body = json.loads(failed.stdout)
    assert body["lastPass"]["error"] == "load: disk full"
    assert body["lastPass"]["failed_in_a_row"] == 1 and body["watcherPid"] is None
    record_pass(paths, "full", "mallard pipeline run", datetime.now(UTC), None)
    assert mallard("pipeline", "status", data_dir=tmp_path).stdout.startswith("last pass #2")


def test_the_watcher_backs_off_and_says_so_loudly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    paths = DataPaths(tmp_path)
    write_landing(paths, events=10, seed=1)
    now = [0.0]  # the watcher's clock, moved by its waits
    tried_at: list[float] = []
    stop = threading.Event()

    def failing_pass(data_dir: Path, wanted: PassKind, begin: object) -> tuple[PassKind, list]:
        tried_at.append(now[0])
        if len(tried_at) == LOUD_AFTER + 2:
            stop.set()
        return wanted, [StepResult("dbt build", False, "model x failed")]

    def wait(seconds: float) -> bool:
        now[0] += seconds
        return stop.is_set()

    monkeypatch.setattr(pipeline, "_pass_off_the_main_thread", failing_pass)
    monkeypatch.setattr(pipeline, "warm_up", lambda data_dir: None)
    monkeypatch.setattr(pipeline.time, "monotonic", lambda: now[0])
    monkeypatch.setattr(stop, "wait", wait)
    with caplog.at_level(logging.ERROR, logger="orchestration.pipeline"):
        pipeline.watch_pipeline(paths.root, stop, lambda steps: None, poll_s=1.0, retry_s=5.0)
    gaps = [round(b - a) for a, b in zip(tried_at, tried_at[1:], strict=False)]
    assert gaps == [5, 10, 20, 40], gaps  # doubling from retry_s
    loud = [r.getMessage() for r in caplog.records]
    assert len(loud) == 3, loud  # the 3rd, 4th and 5th failure in a row
    assert loud[0].startswith("3 pipeline passes in a row failed; the last: dbt build")
