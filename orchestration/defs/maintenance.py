"""Maintenance jobs: compaction of fragmented tables after passes (sensor), and the nightly
maintenance (compaction of every table, snapshot expiry, file cleanup) on a schedule."""
# No `from __future__ import annotations`: Dagster reads the context type hints at runtime.

import dagster as dg

from orchestration.context import yield_cpu_to_readers
from orchestration.defs.ingest import run_in_progress
from orchestration.defs.scheduling import daemon_stands_back
from orchestration.maintenance import compact_fragmented, maintain, needs_compaction
from orchestration.resources import LakeResource


@dg.op(description="Rewrite files riddled with deletes, merge small files, expire snapshots.")
def maintain_warehouse(context: dg.OpExecutionContext, lake: LakeResource) -> None:
    yield_cpu_to_readers()
    result = maintain(lake.paths)
    context.log.info(result.summary)


@dg.job(description="Keep the lake fast and small after incremental passes.")
def maintenance() -> None:
    maintain_warehouse()


# By job name, here and in the sensor: given the job itself, Definitions binds the lake resource
# to a copy of the sensor's job through a path of Dagster's that warns on every load.
@dg.schedule(
    name="compact_and_expire_nightly",
    job_name="maintenance",
    cron_schedule="30 3 * * *",
    default_status=dg.DefaultScheduleStatus.RUNNING,
    description="Nightly, when traffic is lowest; it waits for a running dbt build to finish.",
)
def maintenance_nightly(
    context: dg.ScheduleEvaluationContext, lake: LakeResource
) -> dg.RunRequest | dg.SkipReason:
    if reason := daemon_stands_back(lake, "nightly maintenance"):
        return dg.SkipReason(reason)
    return dg.RunRequest()


@dg.op(description="Compact the tables incremental passes fragmented past the threshold.")
def compact_fragmented_tables(context: dg.OpExecutionContext, lake: LakeResource) -> str:
    yield_cpu_to_readers()
    result = compact_fragmented(lake.paths)
    context.log.info(result.summary)
    return result.summary


@dg.job(description="Compact only the tables passes have fragmented (MALLARD_COMPACT_AT_FILES).")
def compaction() -> None:
    compact_fragmented_tables()


@dg.sensor(
    job_name="compaction",
    minimum_interval_seconds=30,
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="Starts a compaction when a table has MALLARD_COMPACT_AT_FILES fragments.",
)
def fragmentation_sensor(
    context: dg.SensorEvaluationContext, lake: LakeResource
) -> dg.SensorResult:
    if watcher := daemon_stands_back(lake, "compaction"):  # it compacts after its passes
        return dg.SensorResult(skip_reason=watcher)
    tables = needs_compaction(lake.paths)
    if not tables:
        return dg.SensorResult(skip_reason="no table fragmented")
    if busy := run_in_progress(context, [compaction.name]):
        return dg.SensorResult(skip_reason=busy)
    names = ", ".join(f"{schema}.{table} ({files} files)" for schema, table, files in tables)
    context.log.info(f"fragmented: {names}")
    return dg.SensorResult(run_requests=[dg.RunRequest()])
