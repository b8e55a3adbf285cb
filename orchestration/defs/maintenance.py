"""The maintenance job (compaction, snapshot expiry, file cleanup) and its nightly schedule."""
# No `from __future__ import annotations`: Dagster reads the context type hints at runtime.

import dagster as dg

from orchestration.context import data_paths, yield_cpu_to_readers
from orchestration.maintenance import maintain


@dg.op(description="Rewrite files riddled with deletes, merge small files, expire snapshots.")
def maintain_warehouse(context: dg.OpExecutionContext) -> None:
    yield_cpu_to_readers()
    result = maintain(data_paths())
    context.log.info(result.summary)


@dg.job(description="Keep the lake fast and small after incremental passes.")
def maintenance() -> None:
    maintain_warehouse()


maintenance_schedule = dg.ScheduleDefinition(
    name="maintenance_nightly",
    job=maintenance,
    cron_schedule="30 3 * * *",
    default_status=dg.DefaultScheduleStatus.RUNNING,
    description="Nightly, when traffic is lowest; it waits for a running dbt build to finish.",
)
