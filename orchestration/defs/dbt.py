"""The dbt project as Dagster assets; the manifest is parsed offline when missing or stale."""
# No `from __future__ import annotations`: Dagster reads the context type hints at runtime.

import fcntl
import functools
import os
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import dagster as dg
from dagster_dbt import DbtCliInvocation, DbtCliResource, dbt_assets
from dbt.version import __version__ as dbt_version
from packaging import version

from mallard.settings import get_settings
from orchestration.context import DBT_DIR, data_paths, dbt_env, yield_cpu_to_readers
from orchestration.dbt_in_process import in_process_dbt
from orchestration.locks import build_lock
from orchestration.window import (
    current_window,
    open_pass,
    dbt_build_args,
    full_tests_due,
    record_full_tests_passed,
)


def _newest_source_mtime() -> float:
    files = [DBT_DIR / "dbt_project.yml", DBT_DIR / "profiles.yml"]
    for sub in ("models", "macros", "materializations", "tests"):
        files += [p for p in (DBT_DIR / sub).rglob("*") if p.is_file()]
    return max(p.stat().st_mtime for p in files if p.exists())


def _dbt_executable() -> Path:
    # The venv's own dbt, whether or not the venv is on PATH (e.g. under `make run`).
    return Path(sys.executable).parent / "dbt"


def ensure_manifest(target: Path) -> Path:
    """`dbt parse` into target when the manifest is missing or older than the project."""
    manifest = target / "manifest.json"
    if manifest.exists() and manifest.stat().st_mtime >= _newest_source_mtime():
        return manifest
    target.mkdir(parents=True, exist_ok=True)
    paths = data_paths()
    with open(target / ".parse.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if manifest.exists() and manifest.stat().st_mtime >= _newest_source_mtime():
            return manifest
        subprocess.run(
            [
                str(_dbt_executable()),
                "parse",
                "--project-dir",
                str(DBT_DIR),
                "--profiles-dir",
                str(DBT_DIR),
                "--target-path",
                str(target),
                "--log-path",
                str(paths.dbt_logs),
                "--quiet",
            ],
            check=True,
            env={**os.environ, **dbt_env(paths)},
        )
    return manifest


class DbtResource(DbtCliResource):
    """dagster-dbt's resource, without two start-up costs of every pass (3.5 s together): it runs
    `dbt --version` in a subprocess to learn the version of the venv's own dbt, and builds a dbt
    adapter in-process that only its column and row-count metadata fetchers use (we use none)."""

    @functools.cached_property
    def _cli_version(self) -> version.Version:
        return version.parse(dbt_version)

    def _initialize_dbt_core_adapter(self, args: Any) -> Any:
        return None

    def cli(self, args: Sequence[str], **kwargs: Any) -> DbtCliInvocation:  # type: ignore[override]
        """dbt on a thread of this process with MALLARD_DBT_THREADS threads of its own, unless
        MALLARD_DBT_IN_PROCESS=0 (see orchestration/dbt_in_process.py)."""
        settings = get_settings()
        if not settings.dbt_in_process:
            return super().cli(args, **kwargs)
        with in_process_dbt():
            return super().cli([*args, "--threads", str(settings.dbt_threads)], **kwargs)


def build_dbt_assets() -> tuple[Any, DbtCliResource]:
    paths = data_paths()
    manifest = ensure_manifest(paths.dbt_target)

    @dbt_assets(manifest=manifest, name="dbt_models")
    def dbt_models(context: dg.AssetExecutionContext, dbt: DbtCliResource) -> Iterator[Any]:
        os.environ.update(dbt_env(paths))
        yield_cpu_to_readers()
        # One writer of the models at a time: two would conflict on commit.
        with build_lock(paths):
            window = current_window(paths)
            full_tests = full_tests_due(paths.dbt_target)
            pass_id = open_pass(paths, window)  # the models' scope: the manifest's newest row
            context.log.info(f"pass {pass_id}: {window}; every test: {full_tests}")
            # A fixed target dir keeps partial parsing warm between runs (one build at a time).
            yield from dbt.cli(
                dbt_build_args(window, full_tests), context=context, target_path=paths.dbt_target
            ).stream()
            if full_tests:  # reached only when dbt succeeded: a failure raises above
                record_full_tests_passed(paths.dbt_target)

    resource = DbtResource(
        project_dir=str(DBT_DIR),
        profiles_dir=str(DBT_DIR),
        dbt_executable=str(_dbt_executable()),
    )
    return dbt_models, resource
