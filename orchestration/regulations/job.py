"""A regulation's run: the Dagster job `regulation`, one op per step, recorded in the instance the
UI shows. Every step reads what it needs from the regulation store and the lake and is
idempotent, so a run killed at any step and run again ends in the same state.

Steps (those that do not apply to a regulation's type skip):
- catch_up: wait until the collectors' logs hold nothing received before the regulation, then
  until a full pass (the watcher's, or one run here in the lake writer's turn when no watcher
  runs) has taken them, so the models know every identifier of the subject;
- resolve: the subject's identifiers from the models (kept, plain, in the store while the run
  lasts); Suppress and NoTrack add the anonymousIds found to the collectors' lists;
- export_access: ACCESS writes the zip;
- purge_rows, rebuild, purge_landing, purge_files, purge_side_stores: a Delete (purge.py);
- verify_and_finish: a Delete searches the data dir for what is left (verify.py), drops the
  plain userIds from the store and finishes; the others finish.

No op logs or returns an identifier: Dagster's event log is a file of the data dir too.
"""
# No `from __future__ import annotations`: Dagster reads the context type hints at runtime.

import os
import signal
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import dagster as dg

from mallard.passes import read_last_pass
from mallard.paths import DataPaths
from mallard.regulation_runs import say
from mallard.regulations import NO_TRACK, SUPPRESS, Generation, Regulation, RegulationStore
from mallard.settings import get_settings
from orchestration.locks import regulations_lock
from orchestration.regulations import purge, verify
from orchestration.regulations.subjects import Subject
from orchestration.regulations.subjects import resolve as resolve_subject
from orchestration.resources import LakeResource
from orchestration.warehouse import lake_connection

JOB = "regulation"
# How long an Access zip can be downloaded.
ACCESS_TTL = timedelta(days=7)
LAUNCHED_BY = "user"


class RegulationRun(dg.Config):
    regulation_id: str


def _store(lake: LakeResource) -> RegulationStore:
    return RegulationStore(lake.paths)


def _regulation(store: RegulationStore, config: RegulationRun) -> Regulation:
    reg = store.get(config.regulation_id)
    if reg is None:
        raise dg.Failure(f"no regulation {config.regulation_id}")
    return reg


def _subject(reg: Regulation) -> Subject:
    if not reg.identifiers:
        raise dg.Failure("the subject is not resolved (run the resolve step first)")
    return Subject.from_json(reg.identifiers)


def _record(store: RegulationStore, reg_id: str, **evidence: Any) -> dict[str, Any]:
    """Merge counts into the regulation's evidence (a re-run adds to what an earlier run of
    the step recorded: its counts are what that attempt found)."""
    reg = store.get(reg_id)
    assert reg is not None
    merged = dict(reg.evidence or {})
    for k, v in evidence.items():
        if isinstance(v, dict) and isinstance(merged.get(k), dict):
            merged[k] = {**merged[k], **{t: merged[k].get(t, 0) + n for t, n in v.items()}}
        elif isinstance(v, int) and isinstance(merged.get(k), int) and k not in _LATEST:
            merged[k] = merged[k] + v
        else:
            merged[k] = v
    store.save(reg_id, evidence=merged)
    return merged


# Evidence set by the last attempt, not summed.
_LATEST = {"rowsRemainingTotal", "bytesFoundTotal", "sharedIdentifiersKept"}


def _done(step: str, regulation_id: str) -> None:
    """Where a step's work is done: a line in the run's output (run/regulations.log for runs
    the server starts), so the log shows how far a run got and how long each step took; with
    MALLARD_FAULT_KILL_AT naming the step, the process kills itself here, as a crash or an
    operator's kill would leave it."""
    say(regulation_id, f"{step} done")
    if get_settings().fault_kill_at == step:
        os.kill(os.getpid(), signal.SIGKILL)


def _needs_models(reg: Regulation) -> bool:
    return reg.regulation_type in (
        "SUPPRESS_WITH_DELETE",
        "DELETE",
        "SUPPRESS",
        "NO_TRACK",
        "ACCESS",
    )


# How long a regulation waits for the pipeline to pass its filing time before it fails, saying
# why (the last pass's record): a watcher whose passes keep failing must not hold it forever.
PASS_WAIT_S = 900.0


def _pass(
    paths: DataPaths,
    reg: Regulation,
    why: str,
    through: datetime | None = None,
) -> str:
    """Wait until a full pass holds every message the regulation needs: those received before
    it was filed (catch-up; once the collectors' logs have landed them) or those loaded at or
    before `through` (a Delete's restated messages). A regulation runs no pass kind of its own:
    with a pipeline watcher running, it asks the watcher for a full pass and waits for it; with
    none, it takes the lake writer's turn and runs the pass routine here (the same
    `run_pipeline` every actor runs). Whether that pass is still needed is asked again once
    the turn is taken: every regulation that found no watcher (one killed and restarting)
    waits for the turn, and the first one's pass, or the watcher back, serves the others,
    rather than each running a full pass of its own in turn while the watcher and every
    Delete's purge wait behind them."""
    from orchestration.locks import watcher_pid
    from orchestration.pipeline import BY_A_REGULATION, request_full_pass, run_pipeline
    from orchestration.window import full_pass_holds

    received = None if through is not None else datetime.fromtimestamp(reg.created_at, UTC)
    deadline = time.monotonic() + PASS_WAIT_S
    asked = False
    while not full_pass_holds(paths, received, through):
        if time.monotonic() > deadline:
            last = read_last_pass(paths)
            raise dg.Failure(
                f"no full pass took the regulation's messages within {PASS_WAIT_S:.0f} s"
                + (f"; {last.line()}" if last else "")
            )
        if watcher_pid(paths) is not None:
            if not asked:
                request_full_pass(paths)
                asked = True
            time.sleep(0.5)
            continue
        steps = run_pipeline(
            paths.root,
            launched_by=f"{BY_A_REGULATION}{reg.regulation_id} ({why})",
            needed=lambda: (
                watcher_pid(paths) is None and not full_pass_holds(paths, received, through)
            ),
        )
        failed = [s for s in steps if not s.ok]
        if failed:
            raise dg.Failure(f"the pass failed: {failed[0].name}: {failed[0].summary}")
        asked = False
    return f"a full pass holds the messages ({why})"


def catch_up_models(paths: DataPaths, reg: Regulation) -> str | None:
    """What the catch_up step waits for: the collectors' logs drained of what was received
    before the regulation, then a full pass that holds it. Run before a regulation's job takes
    the regulations lock too, so regulations filed together wait for the same pass rather
    than one after another; the step then finds it done. None when the type needs no models."""
    if reg.status == "finished" or not _needs_models(reg):
        return None
    waited = purge.wait_for_logs(paths, reg.created_at)
    return f"{waited} log segments landed; {_pass(paths, reg, 'catch up')}"


@dg.op(
    description="Wait until the collectors' logs hold nothing received before the "
    "regulation, then until a full pass has taken them, so the models know every identifier "
    "of the subject."
)
def catch_up(context: dg.OpExecutionContext, config: RegulationRun, lake: LakeResource) -> None:
    store = _store(lake)
    reg = store.start(config.regulation_id)
    done = catch_up_models(lake.paths, reg)
    if done is None:
        return
    context.log.info(done)
    _done("catch_up", config.regulation_id)


@dg.op(
    ins={"after": dg.In(dg.Nothing)},
    description="The subject's identifiers from the models; "
    "Suppress and NoTrack add the anonymousIds found to the collectors' lists.",
)
def resolve(context: dg.OpExecutionContext, config: RegulationRun, lake: LakeResource) -> None:
    store = _store(lake)
    reg = _regulation(store, config)
    if reg.status == "finished" or not reg.subject_ids:
        return
    conn = lake_connection(lake.paths)
    try:
        found = resolve_subject(conn, reg.account_id, reg.subject_ids)
    finally:
        conn.close()
    subject = Subject.from_json(reg.identifiers).merge(found) if reg.identifiers else found
    store.save(reg.regulation_id, identifiers=subject.to_json())
    lists = {"SUPPRESS": SUPPRESS, "SUPPRESS_WITH_DELETE": SUPPRESS, "NO_TRACK": NO_TRACK}
    added = 0
    if reg.regulation_type in lists:
        tied: dict[str, list[str]] = {}
        conn = lake_connection(lake.paths)
        try:
            for user_id, anon in (
                conn.execute(
                    "select user_id, anonymous_id from lake.intermediate.int_identity_map"
                    " where account_id = $a and user_id in (select unnest($u))",
                    {"a": reg.account_id, "u": reg.subject_ids},
                ).fetchall()
                if subject.anonymous_ids
                else []
            ):
                tied.setdefault(user_id, []).append(anon)
        finally:
            conn.close()
        for user_id, anon in tied.items():
            added += store.tie(reg.account_id, user_id, anon, reg.regulation_id)
    _done("resolve", config.regulation_id)
    context.log.info(
        f"{len(subject.customer_ids)} customers, {len(subject.anonymous_ids)} anonymousIds, "
        f"{len(subject.message_ids)} messages; {added} list entries added"
    )


@dg.op(ins={"after": dg.In(dg.Nothing)}, description="ACCESS: the zip of the subject's data.")
def export_access(
    context: dg.OpExecutionContext, config: RegulationRun, lake: LakeResource
) -> None:
    store = _store(lake)
    reg = _regulation(store, config)
    if reg.status == "finished" or reg.regulation_type != "ACCESS":
        return
    from orchestration.regulations.access import export_access as export

    subject = _subject(reg)
    out = lake.paths.access_dir / f"{reg.regulation_id}.zip"
    regs = [
        r
        for r in store.list_account(reg.account_id)
        if set(r.subject_hashes) & set(reg.subject_hashes)
    ]
    conn = lake_connection(lake.paths)
    try:
        manifest = export(conn, subject, out, regulation_id=reg.regulation_id, regulations=regs)
    finally:
        conn.close()
    store.save(
        reg.regulation_id,
        download_path=str(out),
        download_expires_at=time.time() + ACCESS_TTL.total_seconds(),
    )
    _record(store, reg.regulation_id, rowsExported=manifest.get("rows_by_table", {}))
    context.log.info(f"zip written: {out.stat().st_size} bytes")


def _purging(reg: Regulation) -> str:
    """What a Delete's step holds the lake writer's turn for (its holder record)."""
    return f"purge of regulation {reg.regulation_id}"


def _deleting(store: RegulationStore, config: RegulationRun) -> Regulation | None:
    reg = _regulation(store, config)
    return reg if reg.deletes and reg.status != "finished" else None


@dg.op(
    ins={"after": dg.In(dg.Nothing)},
    description="Delete: tombstones, then the subject's "
    "rows from every lake table; customers sharing an anonymousId are restated.",
)
def purge_rows(context: dg.OpExecutionContext, config: RegulationRun, lake: LakeResource) -> int:
    store = _store(lake)
    reg = _deleting(store, config)
    if reg is None:
        return 0
    subject = _subject(reg)
    buried = purge.bury(store, subject, reg.regulation_id, time.time())
    conn = lake_connection(lake.paths)
    try:
        others_ids = purge.neighbours(conn, subject)
        others = resolve_subject(conn, reg.account_id, others_ids) if others_ids else None
    finally:
        conn.close()
    result = purge.purge_lake(lake.paths, subject, others, _purging(reg))
    _record(store, reg.regulation_id, tombstones=buried, **result.to_json())
    _done("purge_rows", config.regulation_id)
    context.log.info(
        f"{sum(result.rows_deleted.values())} rows deleted from {len(result.rows_deleted)} "
        f"tables; {result.restated_customers} customers sharing an anonymousId restated"
    )
    return result.restated_messages


@dg.op(description="Delete: wait for a full pass, which rebuilds the customers the purge restated.")
def rebuild(
    context: dg.OpExecutionContext, config: RegulationRun, lake: LakeResource, restated: int
) -> None:
    store = _store(lake)
    reg = _deleting(store, config)
    if reg is None or not restated:
        return
    from orchestration.window import newest_load

    through = newest_load(lake.paths)
    context.log.info(_pass(lake.paths, reg, "rebuild restated customers", through))
    _done("rebuild", config.regulation_id)


@dg.op(
    ins={"after": dg.In(dg.Nothing)},
    description="Delete: rewrite the landing files that hold the subject's messages without them.",
)
def purge_landing(
    context: dg.OpExecutionContext, config: RegulationRun, lake: LakeResource
) -> None:
    store = _store(lake)
    reg = _deleting(store, config)
    if reg is None:
        return
    files, rows = purge.purge_landing(lake.paths, _subject(reg), _purging(reg))
    _record(store, reg.regulation_id, landingFilesRewritten=files, landingRowsRemoved=rows)
    _done("purge_landing", config.regulation_id)
    context.log.info(f"{files} landing files rewritten, {rows} rows removed")


@dg.op(
    ins={"after": dg.In(dg.Nothing)},
    description="Delete: rewrite data files with deletes, "
    "flush inlined rows, expire earlier snapshots, delete unreferenced files, compact the "
    "catalog.",
)
def purge_files(context: dg.OpExecutionContext, config: RegulationRun, lake: LakeResource) -> None:
    store = _store(lake)
    reg = _deleting(store, config)
    if reg is None:
        return
    result = purge.purge_lake_files(lake.paths, _subject(reg), _purging(reg))
    _record(store, reg.regulation_id, **result.to_json())
    _done("purge_files", config.regulation_id)
    context.log.info(str(result.to_json()))


@dg.op(
    ins={"after": dg.In(dg.Nothing)},
    description="Delete: the preferences journal, tag metrics, earlier Access zips, the "
    "outbox (and its files) and the local mailbox's messages of the subject.",
)
def purge_side_stores(
    context: dg.OpExecutionContext, config: RegulationRun, lake: LakeResource
) -> None:
    store = _store(lake)
    reg = _deleting(store, config)
    if reg is None:
        return
    subject = _subject(reg)
    journal = purge.purge_preferences_journal(lake.paths, subject)
    _, metrics = purge.purge_metrics(lake.paths, subject)
    zips = purge.purge_access_zips(store, subject, reg.regulation_id)
    outbox = purge.purge_outbox(lake.paths, subject)
    outbox_files = purge.purge_file_outbox(lake.paths, subject)
    mail = purge.purge_mailbox(lake.paths, subject)
    _record(
        store,
        reg.regulation_id,
        outboxRows=outbox,
        outboxFilesRemoved=outbox_files,
        preferencesJournalRows=journal,
        metricsLines=metrics,
        accessZipsRemoved=zips,
        mailboxMessagesRemoved=mail,
    )
    _done("purge_side_stores", config.regulation_id)
    context.log.info(
        f"journal {journal} rows, metrics {metrics} lines, {zips} Access zips, outbox {outbox}"
        f" and {outbox_files} files, {mail} mailbox messages"
    )


def _outcome(reg: Regulation) -> dict[str, str]:
    word = {
        "SUPPRESS_WITH_DELETE": "suppressed and deleted",
        "DELETE": "deleted",
        "UNSUPPRESS": "unsuppressed",
        "SUPPRESS": "suppressed",
        "NO_TRACK": "not tracked",
        "TRACK": "tracked",
        "ACCESS": "exported",
    }[reg.regulation_type]
    return {h: word for h in reg.subject_hashes}


@dg.op(
    ins={"after": dg.In(dg.Nothing)},
    description="Delete: search the data dir for what is "
    "left of the subject (must be nothing), drop the plain userIds from the store; finish.",
)
def verify_and_finish(
    context: dg.OpExecutionContext, config: RegulationRun, lake: LakeResource
) -> None:
    store = _store(lake)
    reg = _regulation(store, config)
    if reg.status == "finished":
        return
    if not reg.deletes:
        store.finish(reg.regulation_id, outcome=_outcome(reg))
        return
    subject = _subject(reg)
    paths = lake.paths
    conn = lake_connection(paths)
    try:
        shared = _shared_anonymous_ids(conn, subject)
        strings = [s for s in subject.strings() if s not in shared]
        remaining = verify.rows_remaining(conn, strings)
    finally:
        conn.close()
    remaining.update(verify.landing_rows_remaining(paths, strings))
    remaining.update(verify.catalog_rows_remaining(strings))
    store_files = [paths.regulations_db, *_sidecars(paths.regulations_db)]
    found = verify.bytes_found(paths, strings, skip=store_files)
    evidence = _record(
        store,
        reg.regulation_id,
        rowsRemaining=remaining,
        rowsRemainingTotal=sum(remaining.values()),
        bytesFound=found,
        bytesFoundTotal=sum(found.values()),
        sharedIdentifiersKept=len(shared),
    )
    if remaining or found:
        where = ", ".join([*remaining, *found][:10])
        store.fail(reg.regulation_id, f"the subject is still found in: {where}")
        raise dg.Failure(f"the subject is still found in {len(remaining) + len(found)} places")
    # Readers (the API's read index) drop what they hold of earlier snapshots before the
    # regulation shows finished.
    Generation(paths.purge_generation).bump()
    store.forget(reg.account_id, subject.user_ids)
    _done("forget", config.regulation_id)
    store.finish(reg.regulation_id, outcome=_outcome(reg), evidence=evidence)
    store.compact()
    left = verify.bytes_found(paths, strings, only=store_files)
    if left:
        evidence = {**evidence, "bytesFound": left, "bytesFoundTotal": sum(left.values())}
        store.fail(reg.regulation_id, f"the subject is still found in: {', '.join(left)}")
        store.save(reg.regulation_id, evidence=evidence)
        raise dg.Failure("the subject is still found in the regulation store")
    context.log.info(
        f"finished: {sum(evidence.get('rowsDeleted', {}).values())} rows deleted, "
        "0 rows and 0 bytes remaining"
    )


def _sidecars(db: Path) -> list[Path]:
    return [db.with_name(db.name + s) for s in ("-wal", "-shm", "-journal")]


def _shared_anonymous_ids(conn: Any, subject: Subject) -> set[str]:
    """The subject's anonymousIds other users' messages still carry (theirs now)."""
    if not subject.anonymous_ids:
        return set()
    rows = conn.execute(
        "select distinct anonymous_id from lake.raw.messages where account_id = $a"
        " and anonymous_id in (select unnest($anon)) and user_id is not null",
        {"a": subject.account_id, "anon": subject.anonymous_ids},
    ).fetchall()
    return {r[0] for r in rows}


@dg.job(
    name=JOB,
    description="Carry out one privacy regulation (Suppress, Delete, NoTrack, "
    "Access, ...): started by the API when it is filed; idempotent.",
)
def regulation() -> None:
    resolved = resolve(after=catch_up())
    exported = export_access(after=resolved)
    restated = purge_rows(after=exported)
    landing = purge_landing(after=rebuild(restated))
    files = purge_files(after=landing)
    verify_and_finish(after=purge_side_stores(after=files))


def run_config(regulation_id: str) -> dict[str, Any]:
    ops = [
        "catch_up",
        "resolve",
        "export_access",
        "purge_rows",
        "rebuild",
        "purge_landing",
        "purge_files",
        "purge_side_stores",
        "verify_and_finish",
    ]
    return {
        "ops": {op: {"config": {"regulation_id": regulation_id}} for op in ops},
        "loggers": {"console": {"config": {"log_level": "WARNING"}}},
    }


def run_regulation(data_dir: Path, regulation_id: str) -> Regulation:
    """Run (or run again) a regulation's job in this process, recorded in the data dir's Dagster
    instance; a failed step marks the regulation failed with its error."""
    from orchestration.context import ensure_dagster_home

    paths = DataPaths(data_dir.resolve())
    ensure_dagster_home(paths)
    store = RegulationStore(paths)
    reg = store.get(regulation_id)
    if reg is None:
        raise KeyError(regulation_id)
    try:
        # Outside the regulations lock: regulations filed together wait for one full pass.
        catch_up_models(paths, reg)
        with (
            regulations_lock(paths),
            dg.DagsterInstance.from_config(str(paths.dagster_home)) as instance,
        ):
            result = regulation.execute_in_process(
                run_config=run_config(regulation_id),
                instance=instance,
                resources={"lake": LakeResource(data_dir=str(paths.root))},
                raise_on_error=False,
                tags={LAUNCHED_BY: "mallard regulations run", "regulation": regulation_id},
            )
    except Exception as e:
        # Outside the job's steps (the instance, its storage, the lock): the regulation fails
        # with the error rather than stay `running` with no run behind it. A signal that ends
        # the process (not an Exception) leaves it running, for `resume` to start again.
        store.fail(regulation_id, f"the run stopped: {type(e).__name__}: {e}")
        raise
    reg = store.get(regulation_id)
    assert reg is not None
    if not result.success and reg.status != "failed":
        errors = [
            e.step_failure_data.error.message.strip().splitlines()[-1]  # type: ignore[union-attr]
            for e in result.all_events
            if e.is_step_failure and e.step_failure_data and e.step_failure_data.error
        ]
        store.fail(regulation_id, errors[0] if errors else "the run failed")
        reg = store.get(regulation_id)
        assert reg is not None
    return reg
