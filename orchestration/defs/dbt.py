"""The dbt project as Dagster assets, grouped by layer; the manifest is parsed offline when
missing or stale."""
# No `from __future__ import annotations`: Dagster reads the context type hints at runtime.

import fcntl
import functools
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from collections.abc import Set as AbstractSet
from pathlib import Path
from typing import TYPE_CHECKING, Any

import dagster as dg
from dagster_dbt import (
    DagsterDbtTranslator,
    DbtCliInvocation,
    DbtCliResource,
    DbtProject,
    build_dbt_asset_selection,
    dbt_assets,
)
from dbt.version import __version__ as dbt_version
from packaging import version

from mallard.paths import DataPaths
from mallard.settings import get_settings
from orchestration.context import DBT_DIR, dbt_project_args, yield_cpu_to_readers
from orchestration.dbt_in_process import in_process_dbt, run_dbt
from orchestration.defs.checks import MART_CHECK_KEYS
from orchestration.environment import dbt_env, dbt_environment
from orchestration.resources import LakeResource, LakeWriterResource
from orchestration.window import (
    LIGHT_TESTS,
    PASS_KIND_TAG,
    REST_EXCLUDE,
    REST_SCOPE,
    SERVED_SELECT,
    PassKind,
    current_window,
    dbt_build_args,
    full_tests_due,
    open_pass,
    record_full_tests_passed,
)

if TYPE_CHECKING:
    from dagster._core.definitions.assets.graph.asset_graph import AssetGraph

DBT_MODELS = "dbt_models"


def _newest_source_mtime() -> float:
    files = [DBT_DIR / "dbt_project.yml", DBT_DIR / "profiles.yml"]
    for sub in ("models", "macros", "materializations", "tests"):
        files += [p for p in (DBT_DIR / sub).rglob("*") if p.is_file()]
    return max(p.stat().st_mtime for p in files if p.exists())


def _dbt_executable() -> Path:
    # The venv's own dbt, whether or not the venv is on PATH (e.g. under `make run`).
    return Path(sys.executable).parent / "dbt"


def ensure_manifest(paths: DataPaths) -> Path:
    """`dbt parse` into the data dir's dbt target when the manifest is missing or older than the
    project: on a thread of this process, as passes run dbt (MALLARD_DBT_IN_PROCESS=0: a `dbt`
    subprocess)."""
    target = paths.dbt_target
    manifest = target / "manifest.json"
    if manifest.exists() and manifest.stat().st_mtime >= _newest_source_mtime():
        return manifest
    target.mkdir(parents=True, exist_ok=True)
    with open(target / ".parse.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if manifest.exists() and manifest.stat().st_mtime >= _newest_source_mtime():
            return manifest
        args = ["parse", *dbt_project_args(target, paths)]
        if get_settings().dbt_in_process:  # dbt is imported here already (dagster-dbt's)
            run_dbt(args, dbt_env(paths))
        else:
            subprocess.run(
                [str(_dbt_executable()), *args], check=True, env={**os.environ, **dbt_env(paths)}
            )
    return manifest


# How long a reader of the manifest waits for a dbt that is rewriting it.
MANIFEST_WAIT_S = 30.0


def read_manifest(path: Path) -> dict[str, Any]:
    """The manifest's JSON. dbt rewrites manifest.json in place (open, then write) as a pass's
    build parses and as it ends, in the writer's turn; a process that builds its definitions
    outside the turn (a regulation's run, `dagster job execute`, the daemon's code server) can
    read it half written, and reads it again until it is whole or MANIFEST_WAIT_S have passed."""
    deadline = time.monotonic() + MANIFEST_WAIT_S
    while True:
        try:
            loaded: dict[str, Any] = json.loads(path.read_bytes())
            return loaded
        except ValueError:
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.1)


class LayerTranslator(DagsterDbtTranslator):
    """A model's asset group is its layer: the first folder under models/ (staging,
    intermediate, marts, state, ...), so a new layer folder is a new group."""

    def get_group_name(self, dbt_resource_props: Mapping[str, Any]) -> str | None:
        fqn = dbt_resource_props.get("fqn") or []
        # fqn: project, the folders under models/, the model; a model at the top has no layer.
        return str(fqn[1]) if len(fqn) > 2 else super().get_group_name(dbt_resource_props)


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
        """dbt on a thread of this process, unless MALLARD_DBT_IN_PROCESS=0 (see
        orchestration/dbt_in_process.py)."""
        if not get_settings().dbt_in_process:
            return super().cli(args, **kwargs)
        with in_process_dbt():
            return super().cli(args, **kwargs)


def pass_subset(
    paths: DataPaths,
    graph: Callable[[], "AssetGraph"],
    kind: PassKind = PassKind.FULL,
    rest: bool = False,
) -> tuple[AbstractSet[dg.AssetKey], AbstractSet[dg.AssetCheckKey]] | None:
    """What the next pass selects of the pipeline job, whoever launches it. None, all of it, when
    every test is due (after the dbt project changed, and on a data dir's first pass); else, for
    a full pass, every asset, the marts' health checks and the checks of the tests every pass
    runs (LIGHT_TESTS excluded, as dbt_build_args excludes them): a run that selects a check dbt
    does not run ends with the check's output not yielded ("did not yield expected outputs") and
    the check skipped. A served pass selects the load and the models of SERVED_SELECT, no
    check. The rest of a full pass after served passes (`rest`) selects what a full pass does
    but the load and the served models (it builds the scope models of REST_SCOPE again), with
    the same checks."""
    from orchestration.defs.ingest import RAW_MESSAGES  # it imports this module

    if full_tests_due(paths.dbt_target):
        return None
    assets = graph()
    (dbt_models,) = [
        a for a in assets.assets_defs if a.is_executable and a.node_def.name == DBT_MODELS
    ]
    if kind is PassKind.SERVED:
        served = build_dbt_asset_selection([dbt_models], dbt_select=SERVED_SELECT)
        load = dg.AssetSelection.assets(RAW_MESSAGES)
        return (served | load).resolve(assets), set()
    checks = build_dbt_asset_selection([dbt_models], dbt_exclude=LIGHT_TESTS)
    selected = assets.materializable_asset_keys
    if rest:
        others = build_dbt_asset_selection([dbt_models], dbt_exclude=REST_EXCLUDE)
        scope = build_dbt_asset_selection([dbt_models], dbt_select=REST_SCOPE)
        selected = (others | scope).resolve(assets)
    return selected, checks.resolve_checks(assets) | MART_CHECK_KEYS


def build_dbt_assets(paths: DataPaths) -> tuple[dg.AssetsDefinition, DbtCliResource]:
    manifest = read_manifest(ensure_manifest(paths))
    # The project resolves path: selectors (pass_subset) against the dbt project dir.
    project = DbtProject(project_dir=DBT_DIR, target_path=paths.dbt_target)

    @dbt_assets(
        manifest=manifest,
        name=DBT_MODELS,
        project=project,
        dagster_dbt_translator=LayerTranslator(),
    )
    def dbt_models(
        context: dg.AssetExecutionContext,
        dbt: DbtCliResource,
        lake: LakeResource,
        writer: LakeWriterResource,
    ) -> Iterator[Any]:
        paths = lake.paths
        yield_cpu_to_readers()
        # One writer of the models at a time: two would conflict on commit.
        with lake.writer(), dbt_environment(paths):
            kind = PassKind(context.run.tags.get(PASS_KIND_TAG, PassKind.FULL))
            window = current_window(paths, kind)
            if window.kind is not kind:  # the launcher checks first (orchestration/pipeline.py)
                raise dg.Failure(
                    f"a {kind} pass cannot continue here: it needs a finished full pass"
                )
            # The run's selection says which tests it runs: every one unless it is a subset
            # (pass_subset: the tests every pass runs, or none in a served pass).
            full_tests = not context.is_subset
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
