"""Dagster definitions by area (ingest, dbt, checks, maintenance), merged by build_definitions()."""

from __future__ import annotations

import warnings
from pathlib import Path

import dagster as dg

from mallard.paths import DataPaths
from orchestration.context import ensure_dagster_home
from orchestration.defs.checks import marts_health_checks, with_freshness_policy
from orchestration.defs.dbt import build_dbt_assets
from orchestration.defs.delivery import dispatch, dispatch_after_pass, dispatch_when_due
from orchestration.defs.ingest import PIPELINE, backstop_schedule, new_files_sensor, raw_messages
from orchestration.defs.maintenance import (
    compaction,
    fragmentation_sensor,
    maintenance,
    maintenance_nightly,
)
from orchestration.regulations.job import regulation
from orchestration.resources import WRITER, LakeResource, LakeWriterResource

OWNERS_WARNING = (
    r"Parameter `owners` of initializer `SensorDefinition.__init__` is currently in beta"
)


def build_definitions(data_dir: Path) -> dg.Definitions:
    """The definitions of one data dir; its `LakeResource` is made here, once."""
    paths = DataPaths(data_dir.resolve())
    ensure_dagster_home(paths)
    dbt_models, dbt_resource = build_dbt_assets(paths)
    dbt_models = dbt_models.map_asset_specs(with_freshness_policy)
    pipeline = dg.define_asset_job(
        PIPELINE,
        selection=dg.AssetSelection.assets(raw_messages, dbt_models)
        | dg.AssetSelection.checks(marts_health_checks),
        description="Load new landing files, then build every dbt model and run its tests and the "
        "marts' health checks (a pass selects the checks of the tests it runs: "
        "orchestration/defs/dbt.py pass_subset).",
        # Every step in one process, in one writer's turn of the lake (LakeWriterResource).
        executor_def=dg.in_process_executor,
    )
    defs = dg.Definitions(
        assets=[raw_messages, dbt_models],
        asset_checks=[marts_health_checks],
        jobs=[pipeline, maintenance, compaction, regulation, dispatch],
        sensors=[new_files_sensor(), fragmentation_sensor, dispatch_after_pass, dispatch_when_due],
        schedules=[backstop_schedule(), maintenance_nightly],
        resources={
            "dbt": dbt_resource,
            "lake": LakeResource(data_dir=str(paths.root)),
            WRITER: LakeWriterResource(data_dir=str(paths.root)),
        },
    )
    # Binding the resources to the jobs the sensors target, Dagster copies each such sensor with
    # `owners=[]`, which its own check reports as a use of the beta parameter `owners` (dagster
    # 1.13). The repository is resolved here, once (Definitions caches it), with exactly that
    # warning ignored: the pipeline, the webserver and the daemon load these definitions through
    # this function, and none prints it.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", OWNERS_WARNING, dg.BetaWarning)
        defs.get_repository_def()
    return defs
