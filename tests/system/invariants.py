"""The invariants of the whole-system test, each a function that returns the failures it found
(grouped by kind, with a few examples each) and what it checked, against the oracle, once the
pipeline is idle.

1. events_exactly_once: every acknowledged message of a persona not deleted is in marts.events
   exactly once (by messageId, under one of its acknowledged eventIds, attributed to its
   persona), and so is every row of an import; a message every try of which a regulation
   dropped (its eventIds in the product's dropped_events) is not; no eventId and no
   (account, messageId) twice.
2. marts_equal_rebuild: the marts equal those of a pass over a copy of the landing files in a
   fresh data dir (order-insensitive; pass-stamped columns and audience stays ended left out).
3. regulations_finished: every regulation of the account finished.
4. deleted_leave_nothing: after each finished Delete, no identifier of the persona (userId,
   anonymousId, email, customer id, subscription id) in any lake table, landing file or other
   file of the data dir (Parquet and SQLite read by value: orchestration/regulations/verify.py),
   and none of its messageIds in a lake table or landing file.
5. emails_at_most_once: each Message-ID reached the mailbox once, or twice when a process that
   dispatches was killed between the two arrivals, at most 10 s after the first; every send the
   outbox marks sent arrived.
6. journeys_replay: every start_journey of a persona never regulated made one journey instance,
   which ended at the exit step along the path `dry_run` (orchestration/delivery/journeys.py)
   gives for the persona at the end (its branch reads a trait set once).
7. no_failed_pass_after_recovery: no pass failed after the last killed process was back: no FAIL
   line of the watcher, no failed Dagster run (regulations' passes, daemon launches, the
   compaction job), no failed pass or compaction the schedule ran.
8. no_duplicate_in_any_snapshot: marts.events as a reader saw it every few seconds of the run
   never held an eventId or an (account, messageId) twice, and every read of it worked: what
   the read API serves and an analyst queries meanwhile, not only the end state, is exactly
   once.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

from mallard.paths import DataPaths
from mallard.warehouse import connect
from tests.system.facts import Mail
from tests.system.oracle import Oracle, Sent
from tests.system.product import DAEMON, WATCHER

# Examples of one kind of failure shown before the rest are counted.
SHOWN = 6
# How soon after sending a kill of the dispatcher may leave a send unmarked (its marks are
# written within 0.5 s, orchestration/delivery/dispatch.py send_due), with room for a slow host.
KILL_AFTER_SEND_S = 10.0
# The processes a send can come from: the watcher, the daemon's runs, a regulation's pass.
DISPATCHERS = {WATCHER, DAEMON, "regulation-run"}


@dataclass
class Failures:
    """One invariant's failures by kind (a few examples of each, then a count), and notes of
    what it checked."""

    kinds: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    info: list[str] = field(default_factory=list)

    def add(self, kind: str, example: str) -> None:
        self.kinds[kind].append(example)

    def __bool__(self) -> bool:
        return bool(self.kinds)

    def report(self) -> list[str]:
        out = []
        for kind, examples in self.kinds.items():
            out.append(f"{kind}: {len(examples)}")
            out += [f"    {e}" for e in examples[:SHOWN]]
            if len(examples) > SHOWN:
                out.append(f"    ... and {len(examples) - SHOWN} more")
        return out


def _at(oracle: Oracle, t: float) -> str:
    return f"+{t - oracle.started:.1f}s"


# --- 1 -----------------------------------------------------------------------------------------


def events_exactly_once(
    oracle: Oracle, rows: list[dict[str, Any]], dropped: set[str] | None = None
) -> Failures:
    """`rows`: marts.events (read_events); `dropped`: the eventIds a regulation dropped
    (read_dropped)."""
    dropped = dropped or set()
    f = Failures()
    for event_id, n in Counter(r["event_id"] for r in rows).items():
        if n > 1:
            f.add("an eventId more than once in marts.events", f"{event_id}: {n} rows")
    by_message: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        by_message[(r["account_id"], r["message_id"])].append(r)
    for (account, message_id), found in by_message.items():
        if len(found) > 1:
            ids = sorted(r["event_id"] for r in found)
            f.add("a messageId more than once in marts.events", f"{account}/{message_id}: {ids}")
    deleted = oracle.deleted_users()
    acked = dropped_n = retried = 0
    for s in oracle.sent.values():
        if s.user_id in deleted:
            continue
        found = by_message.get(("demo", s.message_id), [])
        what = f"{s.message_id} ({s.kind} via {s.route}, {s.user_id}, eventIds {s.event_ids})"
        kept = s.kept_ids(dropped)
        if kept:
            acked += 1
            retried += len(kept) > 1
            if not found:
                f.add("acknowledged, not in marts.events", what)
            elif len(found) == 1 and found[0]["event_id"] not in kept and not s.unanswered:
                f.add("in marts.events under an eventId never acknowledged", f"{what}: {found[0]}")
            elif len(found) == 1 and found[0]["user_id"] != s.user_id:
                f.add("attributed to another customer", f"{what}: user_id {found[0]['user_id']}")
        elif s.event_ids and not s.unanswered:
            dropped_n += 1
            if found:
                f.add("dropped by a regulation (in dropped_events), yet in marts.events", what)
    imported = _imported_marks(rows)
    rows_checked = 0
    for run in oracle.runs:
        if run.role != "import" or run.returncode != 0:
            continue
        for user, mark in run.rows:
            if user in deleted:
                continue
            rows_checked += 1
            n = imported.get(mark, 0)
            if n != 1:
                f.add("an imported row not once in marts.events", f"{mark} ({user}): {n} rows")
    f.info.append(
        f"{acked} acknowledged messages ({retried} acked more than once), {dropped_n} dropped by"
        f" regulations, {rows_checked} imported rows; {len(rows)} rows in marts.events"
    )
    if not acked:
        f.add("no acknowledged message to check", "the schedule sent nothing that was acked")
    return f


def no_duplicate_in_any_snapshot(oracle: Oracle) -> Failures:
    f = Failures()
    seen = [s for s in oracle.snapshots if not s.error]
    for s in seen:
        if s.extra_event_ids or s.extra_message_ids:
            f.add(
                "marts.events held a message twice",
                f"{_at(oracle, s.at)}: {s.rows} rows, {s.extra_event_ids} beyond one per"
                f" eventId, {s.extra_message_ids} beyond one per messageId",
            )
    for s in oracle.snapshots:
        if s.error:  # readers see committed snapshots while the pipeline writes (DESIGN 3)
            f.add("a read of marts.events failed", f"{_at(oracle, s.at)}: {s.error}")
    f.info.append(f"{len(seen)} snapshots read")
    if not seen:
        f.add("no snapshot read", "every read of marts.events failed")
    return f


def _imported_marks(rows: list[dict[str, Any]]) -> Counter[str]:
    """importMark trait -> the import rows of marts.events that carry it."""
    marks: Counter[str] = Counter()
    for r in rows:
        if r["source"] != "import":
            continue
        record = json.loads(r["record"]) if isinstance(r["record"], str) else r["record"]
        mark = _find_key(record, "importMark")
        if mark is not None:
            marks[str(mark)] += 1
    return marks


def _find_key(value: Any, key: str) -> Any:
    if isinstance(value, dict):
        if key in value:
            return value[key]
        value = list(value.values())
    if isinstance(value, list):
        for v in value:
            found = _find_key(v, key)
            if found is not None:
                return found
    return None


# --- 2 -----------------------------------------------------------------------------------------


def marts_equal_rebuild(live: dict[str, list[str]], rebuilt: dict[str, list[str]]) -> Failures:
    f = Failures()
    for table in sorted(set(live) | set(rebuilt)):
        a, b = Counter(live.get(table, [])), Counter(rebuilt.get(table, []))
        if a == b:
            continue
        kind = f"marts.{table}: {a.total()} rows live, {b.total()} rebuilt"
        only_live, only_rebuilt = list((a - b).elements()), list((b - a).elements())
        f.add(kind, f"{len(only_live)} rows only live, {len(only_rebuilt)} only rebuilt")
        for row in only_live[:2]:
            f.add(kind, f"live only: {row[:500]}")
        for row in only_rebuilt[:2]:
            f.add(kind, f"rebuilt only: {row[:500]}")
    f.info.append(f"{len(live)} marts, {sum(len(v) for v in live.values())} rows live")
    return f


# --- 3 -----------------------------------------------------------------------------------------


def regulations_finished(
    oracle: Oracle, regulations: list[dict[str, Any]], expected: bool = True
) -> Failures:
    """`regulations`: each regulation of the account as `GET regulations/{id}` answers it;
    `expected`: whether the schedule filed any (an empty list is then a failure)."""
    f = Failures()
    known = {r["regulationId"] for r in regulations}
    for filing in oracle.filings:
        if filing.regulation_id and filing.regulation_id not in known:
            f.add("answered, and not listed", f"{filing.regulation_id} {filing.regulation_type}")
    for r in regulations:
        if r.get("status") != "finished":
            f.add(
                f"not finished ({r.get('status')})",
                f"{r['regulationId']} {r.get('regulationType')}: {str(r.get('error'))[:500]}",
            )
    kinds = Counter(str(r.get("regulationType")) for r in regulations)
    f.info.append(f"{len(regulations)} regulations: {dict(kinds)}")
    if expected and not regulations:
        f.add("no regulation to check", "the schedule filed none that was answered")
    return f


# --- 4 -----------------------------------------------------------------------------------------


def deleted_leave_nothing(
    oracle: Oracle,
    paths: DataPaths,
    identifiers: dict[str, list[str]],
    finished: set[str],
) -> Failures:
    """`identifiers`: persona -> its identifiers, of every persona a Delete was filed for;
    `finished`: the personas whose Delete finished (only those are searched)."""
    from orchestration.regulations import verify

    f = Failures()
    unfinished = sorted(set(identifiers) - finished)
    if unfinished:
        f.info.append(f"not searched, their Delete did not finish (see 3): {unfinished}")
    searched = {u: s for u, s in identifiers.items() if u in finished}
    message_ids: dict[str, list[str]] = defaultdict(list)
    for s in oracle.sent.values():
        if s.user_id in searched:
            message_ids[s.user_id].append(s.message_id)
    conn = connect(paths, read_only=True)
    try:
        for user, strings in searched.items():
            for where, n in verify.rows_remaining(conn, strings).items():
                f.add("identifiers in a lake table", f"{user}: {where}: {n} rows")
            for where, n in verify.rows_remaining(conn, message_ids[user]).items():
                f.add("messageIds in a lake table", f"{user}: {where}: {n} rows")
    finally:
        conn.close()
    for user, strings in searched.items():
        for where, n in verify.landing_rows_remaining(paths, strings + message_ids[user]).items():
            f.add("in a landing file", f"{user}: {where}: {n} rows")
        for where, n in verify.bytes_found(paths, strings).items():
            f.add("in the bytes of a file of the data dir", f"{user}: {where}: {n} times")
    f.info.append(f"searched for {len(searched)} deleted personas: {sorted(searched)}")
    return f


# --- 5 -----------------------------------------------------------------------------------------


def emails_at_most_once(
    oracle: Oracle, mails: list[Mail], sent: list[tuple[str, str]], expected: bool = True
) -> Failures:
    """`mails`: what the mailbox kept; `sent`: the outbox's sends marked sent (read_sent_emails);
    `expected`: whether the schedule sent commands (no email is then a failure)."""
    f = Failures()
    arrivals: dict[str, list[float]] = defaultdict(list)
    for m in mails:
        arrivals[m.message_id].append(m.at)
    kills = [k.at for k in oracle.kills if k.victim in DISPATCHERS and k.pid]
    twice = 0
    for message_id, times in arrivals.items():
        times.sort()
        if len(times) == 2:
            first, second = times
            twice += 1
            if not any(first <= k <= second and k - first <= KILL_AFTER_SEND_S for k in kills):
                f.add(
                    "twice, with no kill of a dispatcher right after the first",
                    f"{message_id} at {_at(oracle, first)} and {_at(oracle, second)}",
                )
        elif len(times) > 2:
            f.add("more than twice", f"{message_id}: {len(times)} times")
    for send_id, recipient in sent:
        if f"<{send_id}@mallard>" not in arrivals:
            f.add("marked sent in the outbox, never arrived", f"{send_id} to {recipient}")
    f.info.append(
        f"{len(mails)} emails, {len(arrivals)} Message-IDs ({twice} twice),"
        f" {len(sent)} sends marked sent"
    )
    if expected and not mails:
        f.add("no email arrived", "the schedule's commands sent nothing")
    return f


# --- 6 -----------------------------------------------------------------------------------------


def journey_starts(oracle: Oracle, eligible: set[str]) -> list[Sent]:
    """The acknowledged start_journey commands of these personas."""
    return [
        s
        for s in oracle.sent.values()
        if s.kind == "start_journey" and s.event_ids and s.user_id in eligible
    ]


def journeys_replay(
    oracle: Oracle,
    instances: list[dict[str, Any]],
    steps: list[dict[str, Any]],
    replays: dict[str, list[str]],
    expected: bool = True,
) -> Failures:
    """`instances`, `steps`: read_journeys; `replays`: each persona never regulated -> the step
    ids `dry_run` takes for it now; `expected`: whether the schedule sent commands."""
    f = Failures()
    starts = journey_starts(oracle, set(replays))
    by_command: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for inst in instances:
        by_command[inst["command_event_id"]].append(inst)
    steps_of: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for step in steps:
        steps_of[step["instance_id"]].append(step)
    for s in starts:
        found = [i for e in s.event_ids for i in by_command.get(e, [])]
        what = f"{s.message_id} of {s.user_id} (eventIds {s.event_ids})"
        if len(found) != 1:
            f.add("a start_journey not in exactly one instance", f"{what}: {len(found)}")
            continue
        inst = found[0]
        path = _chain(steps_of[inst["instance_id"]])
        if inst["status"] != "exited" or inst["exit_reason"] != "exit_step":
            f.add(
                "an instance not ended at its exit step",
                f"{what}: {inst['status']} ({inst['exit_reason']}) at"
                f" {inst['current_step_id']}, path {path}",
            )
        if path != replays[s.user_id]:
            f.add("a path unlike the replay", f"{what}: {path}, replay {replays[s.user_id]}")
    paths_seen = Counter(" > ".join(p) for p in replays.values())
    f.info.append(
        f"{len(starts)} start_journey commands of {len(replays)} unregulated personas;"
        f" {len(instances)} instances in all; replays {dict(paths_seen)}"
    )
    if expected and not starts:
        f.add("no journey to check", "no start_journey of an unregulated persona was acked")
    return f


def _chain(steps: list[dict[str, Any]]) -> list[str]:
    """The step ids of an instance in the order entered, each after its previous step."""
    after = {s["previous_step_id"]: s["step_id"] for s in steps}
    out: list[str] = []
    current = after.get(None)
    while current is not None and len(out) <= len(steps):
        out.append(current)
        current = after.get(current)
    if len(out) != len(steps):
        out.append(f"(+{len(steps) - len(out)} steps out of the chain)")
    return out


# --- 7 -----------------------------------------------------------------------------------------


def no_failed_pass_after_recovery(
    oracle: Oracle,
    watcher: list[tuple[float, str]],
    dagster_failed: list[tuple[str, str, float, str]],
) -> Failures:
    """`watcher`: the watcher's log lines (wall time, line); `dagster_failed`:
    failed_dagster_runs."""
    f = Failures()
    since = oracle.last_recovery()
    before: list[tuple[float, str]] = []  # notes only: the invariant is about what follows
    for at, line in watcher:
        if line.startswith("FAIL"):
            what = f"{_at(oracle, at)} watcher: {line[:300]}"
            if at > since:
                f.add("a watcher pass failed", what)
            else:
                before.append((at, what))
    for run in oracle.runs:
        if run.role == "compaction" and run.returncode != 0:
            fails = [ln for ln in run.output.splitlines() if ln.startswith("FAIL")]
            why = "; ".join(fails) or (run.output.strip().splitlines() or [""])[-1]
            what = f"{_at(oracle, run.t0)} {run.what}: {why[:300]}"
            if run.t0 > since:
                f.add(f"{run.what} failed", what)
            else:
                before.append((run.t0, what))
    for run_id, job, started, error in dagster_failed:
        what = f"{_at(oracle, started)} Dagster {job} {run_id[:8]}: {error[:300]}"
        if started > since:
            f.add("a Dagster run failed", what)
        else:
            before.append((started, what))
    f.info.append(f"last recovery at {_at(oracle, since)}; {len(before)} failures before it")
    f.info += [f"before: {what}" for _, what in sorted(before)[:SHOWN]]
    return f
