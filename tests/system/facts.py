"""What the whole-system test's checks read from the product once it is idle: the marts, the
outbox, the Dagster instance, a rebuild of the marts from the landing files in a fresh data dir.
Every read of the lake is read-only (a DuckDB attach beside the product's writers)."""

from __future__ import annotations

import hashlib
import json
import shutil
import sqlite3
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mallard.harness import free_port, init_data_dir, mallard
from mallard.paths import DataPaths
from mallard.warehouse import connect
from orchestration.context import subscription_id
from tests.system.product import JOURNEY_ID

# Columns a pass stamps with its own time or id: they differ between any two builds.
PASS_STAMPED = {"built_at", "pass_id", "full_pass_id", "loaded_at"}
# Marts that hold when passes ran, not what the messages say.
NOT_COMPARED = {"freshness"}
# Marts that keep a history of what passes saw (an audience stay begins and ends at the pass
# that saw the change; a customer suppressed mid-run entered and left, which a rebuild after the
# suppression never sees): compared as they are now, their rows of the past left out.
CURRENT_ONLY = {"audience_members": "left_at is null"}
# Columns that hold the time of the pass that saw a change: left out.
PASS_TIMED = {("audience_members", "entered_at"), ("audience_members", "left_at")}


def lake_rows(paths: DataPaths, sql: str, params: Any = None) -> list[dict[str, Any]]:
    conn = connect(paths, read_only=True)
    try:
        cur = conn.execute(sql, params or [])
        cols = [d[0] for d in cur.description]
        return [dict(zip(cols, r, strict=True)) for r in cur.fetchall()]
    finally:
        conn.close()


def read_events(paths: DataPaths) -> list[dict[str, Any]]:
    return lake_rows(
        paths,
        "select event_id, message_id, account_id, user_id, source, record from lake.marts.events",
    )


def read_duplicates(paths: DataPaths) -> tuple[int, int, int]:
    """Rows of marts.events, and rows beyond one per eventId and per (account, messageId)."""
    row = lake_rows(
        paths,
        "select count(*) as n, count(*) - count(distinct event_id) as e,"
        " count(*) - count(distinct (account_id, message_id)) as m from lake.marts.events",
    )[0]
    return int(row["n"]), int(row["e"]), int(row["m"])


def read_marts(paths: DataPaths) -> dict[str, list[str]]:
    """Every mart as canonical JSON rows, sorted; pass-stamped and pass-timed columns left out,
    and the past of a mart that keeps one."""
    conn = connect(paths, read_only=True)
    try:
        tables = [
            r[0]
            for r in conn.execute(
                "select table_name from information_schema.tables"
                " where table_catalog = 'lake' and table_schema = 'marts' order by 1"
            ).fetchall()
        ]
        out = {}
        for table in tables:
            if table in NOT_COMPARED:
                continue
            now = f" where {CURRENT_ONLY[table]}" if table in CURRENT_ONLY else ""
            cur = conn.execute(f'select * from lake.marts."{table}"{now}')
            cols = [d[0] for d in cur.description]
            rows = []
            for r in cur.fetchall():
                row = {}
                for c, v in zip(cols, r, strict=True):
                    if c not in PASS_STAMPED and (table, c) not in PASS_TIMED:
                        row[c] = _plain(v)
                rows.append(json.dumps(row, sort_keys=True, default=str))
            out[table] = sorted(rows)
        return out
    finally:
        conn.close()


def _plain(value: Any) -> Any:
    """JSON text as the value it holds, so key order inside it does not count."""
    if isinstance(value, str) and value[:1] in "[{":
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def rebuild(source: DataPaths, dest: Path, env: dict[str, str]) -> dict[str, list[str]]:
    """The marts of a pass over a copy of the source's landing files in a fresh data dir (with
    its secret, so subscription ids are the same, and its regulation store; one pass per 2,000
    files). What the rebuild's
    own dispatch lands between its passes is removed, so only the copies are read. `env`: the
    product's (its config dir); its SMTP address is replaced by a closed port."""
    init_data_dir(dest)
    paths = DataPaths(dest)
    shutil.copy(source.secret_file, paths.secret_file)
    _copy_regulations(source, paths)
    shutil.copytree(source.landing_dir, paths.landing_dir, dirs_exist_ok=True)
    copies = {p.relative_to(paths.landing_dir) for p in paths.landing_dir.glob("date=*/*.parquet")}
    run_env = {
        **env,
        "MALLARD_DATA_DIR": str(dest),
        "DAGSTER_HOME": str(paths.dagster_home),
        "MALLARD_SMTP_URL": f"smtp://127.0.0.1:{free_port()}",
    }
    for _ in range(len(copies) // 2000 + 1):
        out = mallard("pipeline", "run", data_dir=dest, env=run_env, timeout=1800, check=False)
        if out.returncode:
            raise AssertionError(f"the rebuild's pass failed:\n{out.stdout}\n{out.stderr[-3000:]}")
        for p in paths.landing_dir.glob("date=*/*.parquet"):
            if p.relative_to(paths.landing_dir) not in copies:
                p.unlink()
        loaded = lake_rows(paths, "select count(*) as n from lake.raw.landing_files")[0]["n"]
        if loaded >= len(copies):
            break
    return read_marts(paths)


def _copy_regulations(source: DataPaths, dest: DataPaths) -> None:
    """The regulation store as the source has it (its suppression lists decide who is in an
    audience; its tombstones what a rebuild may not bring back), with the regulations still
    unfinished marked failed in the copy, so that the rebuild's pass starts no run of them."""
    if not source.regulations_db.exists():
        return
    src = sqlite3.connect(f"file:{source.regulations_db}?mode=ro", uri=True)
    dst = sqlite3.connect(dest.regulations_db)
    try:
        src.backup(dst)
        dst.execute(
            "update regulations set status = 'failed' where status in ('pending', 'running')"
        )
        dst.commit()
    finally:
        src.close()
        dst.close()


@dataclass(frozen=True)
class Mail:
    """One message as the local mailbox kept it."""

    at: float  # wall time it was stored
    message_id: str
    to: str


def read_dropped(paths: DataPaths) -> set[str]:
    """The eventIds the collectors dropped for a regulation (the regulations store's
    dropped_events; the sender's answer does not tell them apart)."""
    if not paths.regulations_db.exists():
        return set()
    conn = sqlite3.connect(f"file:{paths.regulations_db}?mode=ro", uri=True)
    try:
        return {r[0] for r in conn.execute("select event_id from dropped_events")}
    finally:
        conn.close()


def read_mailbox(paths: DataPaths) -> list[Mail]:
    """The messages `mallard mailbox serve` kept (data/mailbox/, a file each, named by the
    nanosecond it was stored), oldest first."""
    from mallard import mailbox

    out = []
    for f in mailbox.message_files(paths):
        msg = mailbox.parse(f)
        at = int(f.name.split("-", 1)[0]) / 1e9
        out.append(Mail(at, str(msg.get("Message-ID", "")), str(msg.get("To", ""))))
    return out


def read_sent_emails(paths: DataPaths) -> list[tuple[str, str]]:
    """(send id, recipient) of the email sends the outbox marks sent."""
    if not paths.outbox_db.exists():
        return []
    conn = sqlite3.connect(f"file:{paths.outbox_db}?mode=ro", uri=True)
    try:
        return conn.execute(
            "select send_id, recipient from sends where status = 'sent' and channel = 'email'"
        ).fetchall()
    finally:
        conn.close()


def read_journeys(paths: DataPaths) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The test journey's rows of marts.journey_instances and marts.journey_steps."""
    instances = lake_rows(
        paths,
        "select instance_id, user_id, command_event_id, status, exit_reason, current_step_id"
        " from lake.marts.journey_instances where journey_id = ?",
        [JOURNEY_ID],
    )
    steps = lake_rows(
        paths,
        "select instance_id, step_id, previous_step_id from lake.marts.journey_steps"
        " where journey_id = ?",
        [JOURNEY_ID],
    )
    return instances, steps


def failed_dagster_runs(paths: DataPaths) -> list[tuple[str, str, float, str]]:
    """(run id, job, start time, the error at the root of its first step failure) of every
    failed run of the data dir's Dagster instance."""
    import dagster as dg

    out = []
    with dg.DagsterInstance.from_config(str(paths.dagster_home)) as instance:
        records = instance.get_run_records(
            filters=dg.RunsFilter(statuses=[dg.DagsterRunStatus.FAILURE]), limit=1000
        )
        for rec in records:
            started = rec.start_time or rec.create_timestamp.timestamp()
            error = "no step failed"
            for event in instance.all_logs(rec.dagster_run.run_id):
                dagster_event = event.dagster_event
                if dagster_event is not None and dagster_event.is_step_failure:
                    error = _root_error(dagster_event.step_failure_data.error)
                    break
            out.append((rec.dagster_run.run_id, rec.dagster_run.job_name, started, error))
    return out


def _root_error(err: Any) -> str:
    """The innermost cause of a Dagster error, its message's first lines in one."""
    while err is not None and err.cause is not None:
        err = err.cause
    if err is None:
        return "step failed"
    lines = [ln.strip() for ln in err.message.strip().splitlines() if ln.strip()]
    return " | ".join(lines[:3])[:500]


def personas_identifiers(personas: Iterable[Any], secret_hex: str) -> dict[str, list[str]]:
    """Persona userId -> the identifiers a Delete must leave nowhere."""
    out = {}
    for p in personas:
        customer = hashlib.md5(f"demo|user:{p.user_id}".encode()).hexdigest()
        out[p.user_id] = [
            p.user_id,
            p.anonymous_id,
            p.email,
            customer,
            subscription_id(secret_hex, customer),
        ]
    return out


def finished_deletes(
    regulations: list[dict[str, Any]], users: Iterable[str], paths: DataPaths
) -> set[str]:
    """Those of `users` a finished Delete (SUPPRESS_WITH_DELETE or DELETE) names: by the hash
    of the userId, the only thing of it a finished Delete keeps."""
    from mallard.regulations import RegulationStore

    store = RegulationStore(paths)
    try:
        hashes = {store.hash("demo", u): u for u in users}
    finally:
        store.close()
    return {
        hashes[s["idHash"]]
        for r in regulations
        if r.get("status") == "finished" and "DELETE" in str(r.get("regulationType"))
        for s in r.get("subjects", [])
        if s.get("idHash") in hashes
    }
