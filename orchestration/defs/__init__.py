"""Dagster definitions by area (ingest, dbt, maintenance), merged by build_definitions()."""

from __future__ import annotations

from pathlib import Path

import dagster as dg

from mallard.paths import DataPaths
from orchestration.context import ensure_dagster_home
from orchestration.defs.dbt import build_dbt_assets, every_pass_checks
from orchestration.defs.ingest import backstop_schedule, new_files_sensor, raw_messages
from orchestration.defs.maintenance import (
    compaction,
    fragmentation_sensor,
    maintenance,
    maintenance_nightly,
)
from orchestration.defs.scheduling import PIPELINE, PIPELINE_EVERY_TEST
from orchestration.resources import LakeResource


def build_definitions(data_dir: Path) -> dg.Definitions:
    """The definitions of one data dir; its `LakeResource` is made here, once."""
    paths = DataPaths(data_dir.resolve())
    ensure_dagster_home(paths)
    dbt_models, dbt_resource = build_dbt_assets(paths)
    loaded = dg.AssetSelection.assets(raw_messages)
    pipeline = dg.define_asset_job(
        PIPELINE,
        selection=loaded | every_pass_checks(dbt_models),
        description="A pass: load new landing files, then build the models and run the tests "
        "every pass runs.",
    )
    pipeline_every_test = dg.define_asset_job(
        PIPELINE_EVERY_TEST,
        selection=loaded | dg.AssetSelection.assets(dbt_models),
        description="A pass that runs every test: the first after the dbt project changed.",
    )
    return dg.Definitions(
        assets=[raw_messages, dbt_models],
        jobs=[pipeline, pipeline_every_test, maintenance, compaction],
        sensors=[new_files_sensor([pipeline, pipeline_every_test]), fragmentation_sensor],
        schedules=[backstop_schedule(), maintenance_nightly],
        resources={"dbt": dbt_resource, "lake": LakeResource(data_dir=str(paths.root))},
    )
