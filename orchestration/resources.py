"""The lake of one data dir as a Dagster resource: what the assets, ops and sensors share."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import dagster as dg

from mallard.paths import DataPaths
from orchestration import locks


class LakeResource(dg.ConfigurableResource):
    """The data dir's paths and the locks between the processes that write its lake.
    `build_definitions()` makes one from the data dir; no op reads the environment for it."""

    data_dir: str

    @property
    def paths(self) -> DataPaths:
        return DataPaths(Path(self.data_dir))

    def writer(self) -> AbstractContextManager[None]:
        """The lake writer's turn (orchestration/locks.py): one writer of the lake at a time."""
        return locks.lake_writer(self.paths, "dbt build")

    def watcher_pid(self) -> int | None:
        """The PID of the live pipeline watcher of this data dir, or None if none runs."""
        return locks.watcher_pid(self.paths)


# The resource key of the writer's turn, which the pipeline job's steps require.
WRITER = "writer"


class LakeWriterResource(dg.ConfigurableResource):
    """The lake writer's turn, held from a run's start to its end: what the pipeline job's
    steps require, so a run Dagster launches (the daemon's sensor or schedule, the UI) loads,
    builds and checks what it built with no other writer in between, as `run_pipeline` does
    around the runs it executes (the turn is re-entrant there). The job runs its steps in one
    process (in_process_executor), so the turn spans every step."""

    data_dir: str

    @contextmanager
    def yield_for_execution(self, context: dg.InitResourceContext) -> Iterator[Any]:
        paths = DataPaths(Path(self.data_dir))
        # Under run_pipeline the turn is already this thread's, and run_pipeline records the
        # pass; a run Dagster launched is recorded here as its steps end.
        recorded_by_caller = locks.holds_lake_writer(paths)
        started = datetime.now(UTC)
        with locks.lake_writer(paths, f"pass ({_launched_by(context)})"):
            try:
                yield self
            finally:
                if not recorded_by_caller:
                    _record_launched_run(paths, context, started)


def _launched_by(context: dg.InitResourceContext) -> str:
    """Who launched a run: the daemon's sensor or schedule by name, else "dagster launch"."""
    run = context.run
    tags = run.tags if run is not None else {}
    by = tags.get("dagster/sensor_name") or tags.get("dagster/schedule_name") or "launch"
    return f"dagster {by}"


def _record_launched_run(
    paths: DataPaths, context: dg.InitResourceContext, started: datetime
) -> None:
    """The data dir's last pass (mallard/passes.py) after a run Dagster launched: failed if a
    step failed or a check of error severity did not pass."""
    from mallard.passes import record_pass
    from orchestration.pipeline import step_failure_line
    from orchestration.window import PASS_KIND_TAG, PassKind

    run = context.run
    instance = context.instance
    if run is None or instance is None:
        return
    error = None
    for record in instance.all_logs(run.run_id):
        event = record.dagster_event
        if event is None:
            continue
        if event.event_type == dg.DagsterEventType.STEP_FAILURE:
            error = f"{event.step_key}: {step_failure_line(event)}"
            break
        check = event.event_specific_data
        if (
            isinstance(check, dg.AssetCheckEvaluation)
            and not check.passed
            and check.severity == dg.AssetCheckSeverity.ERROR
        ):
            error = f"{check.check_name}: failed"
            break
    kind = run.tags.get(PASS_KIND_TAG, PassKind.FULL.value)
    with contextlib.suppress(OSError):  # the record is for people; a run never fails for it
        record_pass(paths, kind, _launched_by(context), started, error)
