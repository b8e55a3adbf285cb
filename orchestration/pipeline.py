"""`mallard pipeline run`: the Dagster job in-process, recorded in the instance the UI shows."""

from __future__ import annotations

import contextlib
import logging
import sys
import threading
import time
from collections.abc import Callable
from contextlib import redirect_stdout
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import dagster as dg

from mallard.passes import LOUD_AFTER
from mallard.paths import DataPaths
from orchestration.dbt_results import DbtTally, read_tally
from orchestration.maintenance import needs_compaction
from orchestration.window import PASS_KIND_TAG, PassKind


@dataclass(frozen=True)
class StepResult:
    name: str
    ok: bool
    summary: str
    again: bool = False  # work left for another pass (landing files over the per-pass cap)
    # Whether running the pass again may mend a failure: not for a health check that found the
    # marts inconsistent (only a fix of the data or the models does), so the watcher does not
    # rebuild every retry_s until then.
    retry: bool = True


# The Dagster UI's "Launched by" column shows a run's `user` tag (a run without it, a sensor's or
# a schedule's is "Manually launched"), so a run says which command started it.
LAUNCHED_BY = "user"
log = logging.getLogger(__name__)
BY_HAND = "mallard pipeline run"
BY_THE_WATCHER = "mallard pipeline run --watch"
# A regulation's own passes (orchestration/regulations/job.py) are launched by "regulation <id>".
BY_A_REGULATION = "regulation "
# The watcher's line as a pass begins, by kind.
PASS_BEGINS = {
    PassKind.FULL: "pass: new landing files",
    PassKind.SERVED: "served pass: new landing files",
}
# The first line of a pass, or of a part of a full pass, that does not build every model: what it
# leaves out or builds.
SERVED_SUMMARY = "the marts the read API serves, no tests; the rest at the next full pass"
REST_SUMMARY = "the rest: the models served passes leave out, since the last full pass"


@dataclass(frozen=True)
class Part:
    """One Dagster run of a pass: a full pass after served passes runs a served part (when the
    served models lack anything) and then the rest; every other pass is one part."""

    kind: PassKind
    rest: bool = False  # the rest of a full pass: every model but the served ones, no load


def pass_kind(paths: DataPaths, wanted: PassKind) -> PassKind:
    """The kind of pass that can run now: a served pass continues after a finished pass and
    leaves tests out, so it needs one and no change to the dbt project since every test last
    passed; otherwise the pass is full."""
    from orchestration.window import current_window, full_tests_due

    if wanted is PassKind.FULL or full_tests_due(paths.dbt_target):
        return PassKind.FULL
    return current_window(paths, wanted).kind


def pass_parts(paths: DataPaths, kind: PassKind) -> list[Part]:
    """The runs of a pass of this kind, in the writer's turn (PassKind says what each kind
    leaves true). A full pass after served passes leaves the served models as the served passes
    built them: a served part first brings them up to date when landing files wait or a loaded
    message is not in them (a pass that loaded, then failed), then the rest; a full pass with
    every test due builds every model at once."""
    from orchestration.load import unloaded_files
    from orchestration.window import current_window, full_tests_due

    if kind is PassKind.SERVED:
        return [Part(PassKind.SERVED)]
    window = current_window(paths, PassKind.FULL)
    if window.loaded_after is None or not window.served_since_full:
        return [Part(PassKind.FULL)]
    if full_tests_due(paths.dbt_target):
        return [Part(PassKind.FULL)]
    behind = not window.served_current or bool(unloaded_files(paths))
    return [*([Part(PassKind.SERVED)] if behind else []), Part(PassKind.FULL, rest=True)]


def run_pipeline(
    data_dir: Path,
    launched_by: str = BY_HAND,
    kind: PassKind = PassKind.FULL,
    begin: Callable[[PassKind], object] = lambda kind: None,
    needed: Callable[[], bool] = lambda: True,
) -> list[StepResult]:
    """One pass, the one routine every actor runs (the watcher, `mallard pipeline run`, a
    regulation with no watcher to wait for): full (every model, the marts' health checks,
    compaction when due, the dispatch) or served (the load and the models the read API serves:
    orchestration/window.py PassKind), then the unfinished regulations carried forward. The
    pass holds the lake writer's turn (orchestration/locks.py) from choosing its kind, parts
    and windows to the end of its compaction, so no other writer commits in between; the
    dispatch and the regulations follow outside it. The kind asked for is the one that runs if
    it can (pass_kind); begin is called with each part's kind as it begins. The pass is
    recorded as the data dir's last pass (mallard/passes.py).
    `needed` is asked once the turn is taken: the wait for it can be minutes, and a caller
    whose reason for the pass went meanwhile (a regulation whose messages another actor's
    pass took) gets no pass and no steps, and leaves no record."""
    from orchestration.defs import build_definitions
    from orchestration.defs.dbt import pass_subset
    from orchestration.defs.ingest import PIPELINE
    from orchestration.locks import lake_writer

    paths = DataPaths(data_dir.resolve())
    started = datetime.now(UTC)
    try:
        defs = build_definitions(paths.root)
    except Exception as e:  # a broken dbt project fails here, before any run
        failed = [StepResult("definitions", False, f"{type(e).__name__}: {e}")]
        _record(paths, kind, launched_by, started, failed)
        return failed
    log = paths.run_dir / "pipeline.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    # dbt's own progress lines go to a log file and the console is quiet: the CLI prints one
    # line per step; the UI keeps the full log.
    quiet = {"loggers": {"console": {"config": {"log_level": "WARNING"}}}}
    steps: list[StepResult] = []
    console = sys.stdout
    with (
        dg.DagsterInstance.from_config(str(paths.dagster_home)) as instance,
        open(log, "a") as out,
        redirect_stdout(out),
    ):
        with lake_writer(paths, f"pass ({who(launched_by)})"):
            if not needed():
                return []
            kind = pass_kind(paths, kind)
            tags = {LAUNCHED_BY: launched_by, PASS_KIND_TAG: kind.value}
            ok = True
            for part in pass_parts(paths, kind):
                with redirect_stdout(console):  # the caller's output, not the pass's log
                    begin(part.kind)
                job = defs.resolve_job_def(PIPELINE)
                subset = pass_subset(paths, defs.resolve_asset_graph, part.kind, part.rest)
                if subset:
                    assets, checks = subset
                    job = job.get_subset(asset_selection=assets, asset_check_selection=checks)
                part_started = datetime.now(UTC)
                result = job.execute_in_process(
                    instance=instance,
                    raise_on_error=False,
                    run_config=quiet,
                    tags={**tags, PASS_KIND_TAG: part.kind.value},
                )
                part_steps = with_dbt_tally(
                    summarize(result), read_tally(paths.dbt_target, part_started)
                )
                if part.kind is PassKind.SERVED or part.rest:
                    summary = REST_SUMMARY if part.rest else SERVED_SUMMARY
                    part_steps.insert(0, StepResult(part.kind.value, True, summary))
                steps += part_steps
                ok = result.success
                if not ok:
                    break
            # What the fragmentation sensor does after the daemon's runs, done here after this
            # one (recorded as a run of the compaction job): the next pass reads fewer files.
            if kind.completes and ok and needs_compaction(paths):
                compacted = defs.resolve_job_def("compaction").execute_in_process(
                    instance=instance, raise_on_error=False, run_config=quiet, tags=tags
                )
                steps += failed_steps(compacted) or [
                    StepResult(
                        "compact", True, compacted.output_for_node("compact_fragmented_tables")
                    )
                ]
            _record(paths, kind, launched_by, started, steps)
        if kind.completes and ok:
            steps.append(dispatch_step(paths))
    if not launched_by.startswith(BY_A_REGULATION):
        steps += regulations_step(paths)
    return steps


def who(launched_by: str) -> str:
    """Who runs a pass, in a few words, for the lake writer's holder record."""
    return {BY_THE_WATCHER: "watcher", BY_HAND: "mallard pipeline run"}.get(
        launched_by, launched_by
    )


def _record(
    paths: DataPaths, kind: PassKind, launched_by: str, started: datetime, steps: list[StepResult]
) -> None:
    from mallard.passes import record_pass

    failed = [s for s in steps if not s.ok]
    error = f"{failed[0].name}: {failed[0].summary}" if failed else None
    try:
        record_pass(paths, kind.value, launched_by, started, error)
    except OSError:  # the record is for people; a pass never fails for it
        log.exception("the pass's record was not written")


def regulations_step(paths: DataPaths) -> list[StepResult]:
    """Carry unfinished regulations forward: start the run of each pending or running one whose
    run is not live (one a killed server or run left behind)."""
    from mallard.regulation_runs import RegulationRuns
    from mallard.regulations import ListsUnavailable, existing_store

    try:
        store = existing_store(paths)
    except ListsUnavailable as e:
        return [StepResult("regulations", False, str(e))]
    if store is None:
        return []
    try:
        started = RegulationRuns(paths).resume(store)
    finally:
        store.close()
    return (
        [StepResult("regulations", True, f"{len(started)} unfinished started")] if started else []
    )


def dispatch_step(paths: DataPaths) -> StepResult:
    """Sends what the pass made due (orchestration/delivery/dispatch.py)."""
    from orchestration.delivery.dispatch import dispatch

    try:
        return StepResult("dispatch", True, dispatch(paths).summary())
    except Exception as e:
        return StepResult("dispatch", False, f"{type(e).__name__}: {e}")


def with_dbt_tally(steps: list[StepResult], dbt: DbtTally | None) -> list[StepResult]:
    """The dbt build line from dbt's own record: unit tests counted, failed nodes named."""
    if dbt is None:
        return steps
    others = [s for s in steps if s.name not in ("dbt_models", "dbt build")]
    # A failure of the Dagster step itself after dbt succeeded still shows.
    step_failure = [s for s in steps if s.name == "dbt_models" and dbt.ok]
    return [*others, *step_failure, StepResult("dbt build", dbt.ok, dbt.summary)]


def summarize(result: dg.ExecuteInProcessResult) -> list[StepResult]:
    from orchestration.defs.checks import MART_CHECK_KEYS

    steps: list[StepResult] = []
    load = [
        e
        for e in result.get_asset_materialization_events()
        if e.asset_key == dg.AssetKey(["raw", "messages"])
    ]
    if load:
        meta = load[0].materialization.metadata
        again = int(meta["pending"].value) > 0  # type: ignore[arg-type]
        steps.append(StepResult("load", True, str(meta["summary"].value), again))
    models = [
        e
        for e in result.get_asset_materialization_events()
        if e.asset_key != dg.AssetKey(["raw", "messages"])
    ]
    evaluations = [
        e.event_specific_data
        for e in result.all_events
        if e.event_type_value == "ASSET_CHECK_EVALUATION"
    ]
    health = [c for c in evaluations if c.asset_check_key in MART_CHECK_KEYS]  # type: ignore[union-attr]
    checks = [c for c in evaluations if c.asset_check_key not in MART_CHECK_KEYS]  # type: ignore[union-attr]
    failed_checks = [c for c in checks if not c.passed]  # type: ignore[union-attr]
    failures = failed_steps(result)
    steps += failures
    if models or checks:
        ok = not failed_checks and not any("dbt" in f.name for f in failures)
        steps.append(
            StepResult(
                "dbt build",
                ok,
                f"{len(models)} models built, "
                f"{len(checks) - len(failed_checks)}/{len(checks)} tests passed",
            )
        )
    if health:
        steps.append(health_step(health))  # type: ignore[arg-type]
    if not steps:
        steps.append(StepResult("pipeline", result.success, "nothing ran"))
    return steps


def health_step(evaluations: list[dg.AssetCheckEvaluation]) -> StepResult:
    """The marts' health checks (orchestration/defs/checks.py) in one line: a failed check of
    severity ERROR fails the pass, a WARN one is named and the pass goes on."""
    failed = [c for c in evaluations if not c.passed]
    errors = [c for c in failed if c.severity == dg.AssetCheckSeverity.ERROR]
    summary = f"{len(evaluations) - len(failed)}/{len(evaluations)} checks passed"
    if failed:
        summary += "; " + "; ".join(
            f"{c.check_name} ({c.severity.value.lower()}): {c.description or 'failed'}"
            for c in failed
        )
    return StepResult("marts health", not errors, summary, retry=False)


def failed_steps(result: dg.ExecuteInProcessResult) -> list[StepResult]:
    """One line per failed step: its error's last line."""
    return [
        StepResult(f.step_key or "step", False, step_failure_line(f))
        for f in result.all_events
        if f.is_step_failure
    ]


def step_failure_line(event: dg.DagsterEvent) -> str:
    """A failed step's error in one line: the first line of what the op raised (Dagster wraps
    it in an error that names only the op; a DuckDB error's later lines point into its SQL), or
    the last line of an error Dagster raised itself."""
    err = event.step_failure_data.error if event.step_failure_data else None
    if err is None:
        return "failed"
    if err.cause is None:
        lines = err.message.strip().splitlines()
        return lines[-1] if lines else "failed"
    while err.cause is not None:
        err = err.cause
    lines = [line for line in err.message.strip().splitlines() if line.strip()]
    return lines[0] if lines else err.cls_name or "failed"


def _pass_off_the_main_thread(
    data_dir: Path, wanted: PassKind, begin: Callable[[PassKind], object]
) -> tuple[PassKind, list[StepResult]]:
    """One pass on a thread of its own, and the kind that ran (the one wanted when none began).
    On the main thread Dagster replaces the SIGINT and SIGTERM handlers while a run executes,
    and a signal fails the step as interrupted; on another thread it leaves both to the
    watcher, which lets the pass finish."""
    out: list[list[StepResult]] = []
    began: list[PassKind] = []

    def begins(kind: PassKind) -> None:
        began.append(kind)
        begin(kind)

    worker = threading.Thread(
        target=lambda: out.append(run_pipeline(data_dir, BY_THE_WATCHER, wanted, begins)),
        name="pipeline-pass",
    )
    worker.start()
    worker.join()
    steps = out[0] if out else [StepResult("pipeline", False, "the pass raised (see stderr)")]
    # A full pass's last part is full (a served part may come first).
    return (began[-1] if began else wanted), steps


def watch_pipeline(
    data_dir: Path,
    stop: threading.Event,
    report: Callable[[list[StepResult]], object],
    poll_s: float = 1.0,
    retry_s: float = 5.0,
    begin: Callable[[PassKind], object] = lambda kind: None,
    full_every_s: float | None = None,
) -> int:
    """Pass after pass in this one process, each as soon as new landing files are there (the
    sensor's rule: a file landed since the last pass began, by `landing_mark`), until stop is
    set; a pass under way finishes first. A full pass runs full_every_s (default: the
    `full_pass_every_s` setting) after the last one ended while files land, and once more when
    they stop landing after served passes; the passes between are served passes
    (orchestration/window.py PassKind), which take a few seconds where a full pass takes more.
    A full pass after served passes is a served part for the files landed since the last one,
    then the rest (`pass_parts`): the served marts are not held up by the models only a full
    pass builds.
    Dagster and the project are imported once, before the first files land, not per pass: at
    10M messages a pass of a few messages took a median of 24.4 s, against 30-32 s for a new
    process each (bench/freshness.py). Runs are recorded in the Dagster instance, launched by
    `BY_THE_WATCHER`. A failed pass is retried with backoff (retry_s, doubled after each
    failure in a row up to `MAX_RETRY_S`; new files and requests wait for it); from the
    `LOUD_AFTER`th failure in a row each is logged as an error. A full pass asked for
    (`request_full_pass`, what a regulation does to have its filing time passed) runs at the
    next look. On start, a data dir whose models already hold every landing file gets no pass.
    Holds the watcher lock throughout: while it runs, the daemon's sensors and schedule leave
    passes to it (raises WatcherRunning if another watcher of the data dir runs; see
    orchestration/defs/scheduling.py). Between passes, it dispatches when a journey's wait or
    timeout or a send's retry falls due, so those wake within poll_s, not at the next pass.
    Returns the number of passes."""
    from mallard.settings import get_settings
    from orchestration.load import landed_since, landing_mark
    from orchestration.locks import watcher_lock

    every = get_settings().full_pass_every_s if full_every_s is None else full_every_s
    paths = DataPaths(data_dir)
    with watcher_lock(paths):
        warm_up(data_dir)
        # Nothing to do for files the models already hold (a restart of a caught-up watcher).
        cursor = landing_mark(paths) if models_current(paths) else ""
        again_at, passes, failures = 0.0, 0, 0
        full_ended: float | None = None  # when the last full pass ended (monotonic)
        served_since_full = False
        while not stop.is_set():
            # After a failed pass nothing starts another before its retry is due, not even new
            # files or a request (which waits for it).
            backing_off = failures > 0 and time.monotonic() < again_at
            mark = landing_mark(paths)
            asked = not backing_off and take_full_pass_request(paths)
            full_due = asked or full_ended is None or time.monotonic() - full_ended >= every
            landed = landed_since(mark, cursor)
            if not backing_off and (
                landed
                or asked
                or (again_at and time.monotonic() >= again_at)
                or (served_since_full and full_due)
            ):
                cursor = mark
                want = PassKind.FULL if full_due else PassKind.SERVED
                kind, steps = _pass_off_the_main_thread(data_dir, want, begin)
                passes += 1
                report(steps)
                again_at = 0.0
                failures = 0 if all(step.ok for step in steps) else failures + 1
                if not failures:  # a failed full pass is still due, a failed served one is not
                    if kind.completes:
                        full_ended, served_since_full = time.monotonic(), False
                    else:
                        served_since_full = True
                if failures >= LOUD_AFTER:
                    failed = next(step for step in steps if not step.ok)
                    log.error(
                        "%d pipeline passes in a row failed; the last: %s: %s",
                        failures,
                        failed.name,
                        failed.summary,
                    )
                if any(step.again for step in steps):
                    again_at = time.monotonic()
                elif not all(step.ok for step in steps if step.retry):
                    again_at = time.monotonic() + min(retry_s * 2 ** (failures - 1), MAX_RETRY_S)
                continue
            if dispatch_due_now(paths):
                report([dispatch_step(paths)])
            stop.wait(poll_s)
    return passes


# The longest wait before a failed pass is tried again.
MAX_RETRY_S = 300.0


def _request_file(paths: DataPaths) -> Path:
    return paths.run_dir / "full-pass-requested"


def request_full_pass(paths: DataPaths) -> None:
    """Ask the running watcher for a full pass at its next look (it removes the request as the
    pass begins)."""
    paths.run_dir.mkdir(parents=True, exist_ok=True)
    _request_file(paths).touch()


def take_full_pass_request(paths: DataPaths) -> bool:
    """Whether a full pass was asked for since the last look; the request is taken."""
    try:
        _request_file(paths).unlink()
    except FileNotFoundError:
        return False
    return True


def models_current(paths: DataPaths) -> bool:
    """Every landing file is loaded and the last full pass took every loaded message."""
    from orchestration.load import unloaded_files
    from orchestration.window import current_window

    window = current_window(paths)
    if window.loaded_after is None:
        return False
    if window.loaded_through is not None and window.loaded_through > window.loaded_after:
        return False
    return not unloaded_files(paths)


def dispatch_due_now(paths: DataPaths) -> bool:
    """Whether a journey's wait or timeout or a send's retry is due, between passes."""
    from orchestration.delivery.dispatch import next_due

    try:
        due = next_due(paths)
    except Exception:  # the outbox unreadable now: the next pass's dispatch reports it
        log.exception("could not read when the dispatcher is next due")
        return False
    return due is not None and due <= 0


def warm_up(data_dir: Path) -> None:
    """What the first pass of a process would otherwise pay before its first model: Dagster,
    dagster-dbt and dbt imported, the definitions built from the manifest."""
    import dbt.cli.main  # noqa: F401 - imported for its cost, before the first pass

    from orchestration.defs import build_definitions

    with contextlib.suppress(Exception):  # a broken project: the first pass reports it
        build_definitions(data_dir)
