"""The dispatch job: plan, send and record what the passes made due (orchestration/delivery/),
so the UI shows dispatch runs and one can be launched when no pipeline watcher runs; and the
sensor that starts one after each successful pipeline run the daemon launched."""
# No `from __future__ import annotations`: Dagster reads the context type hints at runtime.

import dagster as dg

from orchestration.defs.ingest import PIPELINE, run_in_progress
from orchestration.defs.scheduling import daemon_stands_back
from orchestration.resources import LakeResource

DISPATCH = "dispatch"


@dg.op(description="Plan the new commands' sends, send what is due, record every outcome.")
def dispatch_due(context: dg.OpExecutionContext, lake: LakeResource) -> str:
    from orchestration.delivery.dispatch import dispatch as run_dispatch

    result = run_dispatch(lake.paths)
    context.log.info(result.summary())
    for error in result.errors:
        context.log.warning(error)
    return result.summary()


@dg.job(
    name=DISPATCH,
    description="Send what the passes made due, each send once (the outbox's send ids); what "
    "`mallard pipeline run` and the watcher do after every pass.",
)
def dispatch() -> None:
    dispatch_due()


@dg.run_status_sensor(
    run_status=dg.DagsterRunStatus.SUCCESS,
    request_job=dispatch,
    minimum_interval_seconds=10,
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="After a pipeline run succeeds, dispatches what it made due (the watcher and "
    "`mallard pipeline run` dispatch after their own passes).",
)
def dispatch_after_pass(
    context: dg.RunStatusSensorContext, lake: LakeResource
) -> dg.RunRequest | dg.SkipReason:
    if context.dagster_run.job_name != PIPELINE:
        return dg.SkipReason("not a pipeline run")
    if watcher := daemon_stands_back(lake, "dispatch"):
        return dg.SkipReason(watcher)
    if busy := run_in_progress(context, [DISPATCH]):  # type: ignore[arg-type]
        return dg.SkipReason(busy)
    return dg.RunRequest(run_key=f"after-{context.dagster_run.run_id}")


@dg.sensor(
    job=dispatch,
    minimum_interval_seconds=15,
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="Dispatches when a journey's wait or timeout or a send's retry falls due between "
    "passes (the pipeline watcher does this itself within a second while it runs).",
)
def dispatch_when_due(
    context: dg.SensorEvaluationContext, lake: LakeResource
) -> dg.RunRequest | dg.SkipReason:
    from orchestration.delivery.dispatch import next_due

    if watcher := daemon_stands_back(lake, "dispatch"):
        return dg.SkipReason(watcher)
    due = next_due(lake.paths)
    if due is None or due > 0:
        return dg.SkipReason("nothing due" if due is None else f"next due in {due:.0f} s")
    if busy := run_in_progress(context, [DISPATCH]):
        return dg.SkipReason(busy)
    return dg.RunRequest()
