"""Dagster definitions by area (ingest, dbt, maintenance), merged by build_definitions()."""

from __future__ import annotations

import dagster as dg

from orchestration.context import data_paths, ensure_dagster_home
from orchestration.defs.dbt import build_dbt_assets
from orchestration.defs.ingest import backstop_schedule, new_files_sensor, raw_messages
from orchestration.defs.maintenance import (
    compaction,
    fragmentation_sensor,
    maintenance,
    maintenance_schedule,
)


def build_definitions() -> dg.Definitions:
    paths = data_paths()
    ensure_dagster_home(paths)
    dbt_models, dbt_resource = build_dbt_assets()
    pipeline = dg.define_asset_job(
        "pipeline",
        selection=dg.AssetSelection.assets(raw_messages, dbt_models),
        description="Load new landing files, then build every dbt model and test.",
    )
    return dg.Definitions(
        assets=[raw_messages, dbt_models],
        jobs=[pipeline, maintenance, compaction],
        sensors=[new_files_sensor(pipeline.name), fragmentation_sensor],
        schedules=[backstop_schedule(pipeline.name), maintenance_schedule],
        resources={"dbt": dbt_resource},
    )
