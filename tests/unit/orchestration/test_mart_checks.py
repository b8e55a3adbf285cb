"""The marts' health checks in real passes against a temporary lake, read back from the Dagster
instance the UI shows: a WARN check that fails leaves the pass ok and names itself, an ERROR
check that fails fails the pass (and the watcher does not retry it), and each result is the asset
check's latest execution."""

from __future__ import annotations

import threading
from pathlib import Path

import dagster as dg
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from mallard.paths import DataPaths
from orchestration.defs.checks import DUPLICATES_RATE, EVENTS_MATCH, LANDING_LAG, MART_CHECKS
from orchestration.defs.ingest import PIPELINE
from orchestration.pipeline import StepResult, request_full_pass, run_pipeline, watch_pipeline
from orchestration.warehouse import lake_connection
from tests.unit.orchestration.test_load import write_landing

LOST = 3  # events deleted behind the models' back


def send_every_message_again(paths: DataPaths, name: str) -> int:
    """A landing file with a second copy of each message of `name` (new eventIds, received a
    second later), as a client retrying every request would make; the copies' count."""
    table = pq.read_table(paths.landing_dir / name)
    copies = table.set_column(
        table.schema.get_field_index("event_id"),
        "event_id",
        pc.binary_join_element_wise(table["event_id"], pa.scalar("-again"), ""),
    ).set_column(
        table.schema.get_field_index("received_at"),
        "received_at",
        pc.add(table["received_at"], pa.scalar(1_000_000, pa.duration("us"))),
    )
    pq.write_table(copies, paths.landing_dir / name.replace(".parquet", "-again.parquet"))
    return copies.num_rows


def health(steps: list[StepResult]) -> StepResult:
    (step,) = [s for s in steps if s.name == "marts health"]
    return step


def latest(paths: DataPaths) -> dict[str, dg.AssetCheckEvaluation]:
    """Each check's latest execution as the UI reads it (the instance's event log)."""
    out = {}
    with dg.DagsterInstance.from_config(str(paths.dagster_home)) as instance:
        for spec in MART_CHECKS:
            (record,) = instance.event_log_storage.get_asset_check_execution_history(
                spec.key, limit=1
            )
            assert instance.get_run_by_id(record.run_id).job_name == PIPELINE  # type: ignore[union-attr]
            evaluation = record.event.dagster_event.event_specific_data  # type: ignore[union-attr]
            passed = record.status.value == "SUCCEEDED"  # the status the Checks tab shows
            assert passed == evaluation.passed, (spec.name, record.status)
            out[spec.name] = evaluation
    return out


def test_failed_checks_show_in_the_instance(tmp_path: Path) -> None:
    paths = DataPaths(tmp_path)
    (name,) = write_landing(paths, events=120, seed=1, files=1)
    again = send_every_message_again(paths, name)

    steps = run_pipeline(paths.root)
    assert all(s.ok for s in steps), steps
    assert "2/3 checks passed; duplicates_rate (warn)" in health(steps).summary, steps
    checks = latest(paths)
    events = checks[EVENTS_MATCH.name]
    assert events.passed and events.metadata["difference"].value == 0
    # Every copy is counted, and only those: the relation holds however many arrive again.
    assert events.metadata["extra_copies"].value >= again
    assert events.metadata["stored_messages"].value == 120 + again
    assert checks[LANDING_LAG.name].passed
    duplicates = checks[DUPLICATES_RATE.name]
    assert not duplicates.passed and duplicates.severity == dg.AssetCheckSeverity.WARN
    assert duplicates.metadata["duplicates_rate"].value >= 0.5 - 1e-9

    conn = lake_connection(paths)
    try:
        conn.execute(
            f"delete from lake.marts.events where event_id in "
            f"(select event_id from lake.marts.events order by event_id limit {LOST})"
        )
    finally:
        conn.close()
    # The watcher, as `mallard up` runs it; nothing new landed, so it runs a pass only when one is
    # asked for (as a regulation asks), and the models leave events as they are. Its pass fails on
    # the check and is not run again every retry_s (another pass cannot mend the data), while a
    # failed step of any other kind would be.
    reports: list[list[StepResult]] = []
    stop = threading.Event()

    def report(steps: list[StepResult]) -> None:
        reports.append(steps)
        threading.Timer(3.0, stop.set).start()

    request_full_pass(paths)
    watch_pipeline(paths.root, stop, report, poll_s=0.05, retry_s=0.05, full_every_s=0)
    assert len(reports) == 1, reports
    step = health(reports[0])
    assert not step.ok, steps
    assert "events_match_stored_messages (error)" in step.summary, step
    events = latest(paths)[EVENTS_MATCH.name]
    assert not events.passed and events.severity == dg.AssetCheckSeverity.ERROR
    assert events.metadata["difference"].value == -LOST
