"""Each invariant of the whole-system test fails when the property it checks is broken, and holds
when it is not: the checks of tests/system/invariants.py on small made-up facts (no product
running; the Delete's search on a fresh data dir). Also: the same seed plans the same schedule.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from mallard.harness import init_data_dir
from mallard.paths import DataPaths
from tests.system import invariants as inv
from tests.system.facts import Mail
from tests.system.oracle import Attempt, Filing, Kill, Oracle, Run, Snapshot
from tests.system.plan import make_personas, plan

T0 = 1_000_000.0


# The eventIds a regulation dropped, as the product's dropped_events holds them.
DROPPED = {"e-dropped"}


def oracle_with(*messages: tuple[str, str, list[str]]) -> Oracle:
    """An oracle of messages (messageId, userId, eventIds of its tries; those in DROPPED were
    dropped by a regulation)."""
    o = Oracle(7)
    o.started = T0
    for message_id, user, ids in messages:
        sent = o.message(message_id, user, "track", "api")
        for i, event_id in enumerate(ids):
            o.attempt(sent, Attempt(T0 + i, T0 + i + 0.1, 200, event_id))
    return o


def row(event_id: str, message_id: str, user: str = "u1", **kw: Any) -> dict[str, Any]:
    return {
        "event_id": event_id,
        "message_id": message_id,
        "account_id": "demo",
        "user_id": user,
        "source": "server",
        "record": "{}",
        **kw,
    }


def kinds(f: inv.Failures) -> list[str]:
    return sorted(f.kinds)


# --- 1 -----------------------------------------------------------------------------------------


def test_1_holds_for_each_acked_message_once_and_a_retry_once() -> None:
    o = oracle_with(("m1", "u1", ["e1"]), ("m2", "u1", ["e2", "e3"]), ("m3", "u1", ["e-dropped"]))
    assert not inv.events_exactly_once(o, [row("e1", "m1"), row("e3", "m2")], DROPPED)


@pytest.mark.parametrize(
    ("rows", "kind"),
    [
        ([row("e2", "m2")], "acknowledged, not in marts.events"),
        ([row("e1", "m1"), row("e1", "m1"), row("e2", "m2")], "an eventId more than once"),
        ([row("e1", "m1"), row("e2", "m2"), row("e9", "m2")], "a messageId more than once"),
        ([row("e1", "m1"), row("e9", "m2")], "under an eventId never acknowledged"),
        ([row("e1", "m1"), row("e2", "m2", user="u2")], "attributed to another customer"),
        ([row("e1", "m1"), row("e2", "m2"), row("e-dropped", "m3")], "dropped by a regulation"),
    ],
)
def test_1_fails_for_a_lost_twice_foreign_or_dropped_message(
    rows: list[dict[str, Any]], kind: str
) -> None:
    o = oracle_with(("m1", "u1", ["e1"]), ("m2", "u1", ["e2"]), ("m3", "u1", ["e-dropped"]))
    assert any(kind in k for k in kinds(inv.events_exactly_once(o, rows, DROPPED))), kind


def test_1_counts_each_imported_row_once_and_leaves_deleted_personas_out() -> None:
    o = oracle_with(("m1", "u1", ["e1"]), ("m2", "gone", ["e2"]))
    o.run(Run("import", "import a.csv", T0, T0, 0, "", [("u1", "imp0-u1"), ("u2", "imp0-u2")]))
    o.filing(Filing("SUPPRESS_WITH_DELETE", ["gone"], T0, T0, 200, "r1"))
    imported = {"source": "import", "record": json.dumps({"traits": {"importMark": "imp0-u1"}})}
    rows = [row("e1", "m1"), row("i1", "h1", **imported)]
    f = inv.events_exactly_once(o, rows)
    assert kinds(f) == ["an imported row not once in marts.events"]  # imp0-u2 is missing
    assert "imp0-u2" in f.kinds["an imported row not once in marts.events"][0]


# --- 2 -----------------------------------------------------------------------------------------


def test_2_fails_when_a_mart_differs_from_the_rebuild_in_any_row() -> None:
    live = {"events": ['{"a": 1}', '{"a": 2}'], "customers": ['{"c": 1}']}
    assert not inv.marts_equal_rebuild(live, {k: list(reversed(v)) for k, v in live.items()})
    f = inv.marts_equal_rebuild(
        live, {"events": ['{"a": 1}', '{"a": 2}', '{"a": 2}'], "customers": ['{"c": 1}']}
    )
    assert kinds(f) == ["marts.events: 2 rows live, 3 rebuilt"]


# --- 3 -----------------------------------------------------------------------------------------


def test_3_fails_for_a_regulation_not_finished_or_not_listed() -> None:
    o = Oracle(7)
    o.filing(Filing("ACCESS", ["u1"], T0, T0, 200, "r1"))
    done = [{"regulationId": "r1", "regulationType": "ACCESS", "status": "finished"}]
    assert not inv.regulations_finished(o, done)
    failed = [{**done[0], "status": "failed", "error": "the pass failed"}]
    assert kinds(inv.regulations_finished(o, failed)) == ["not finished (failed)"]
    o.filing(Filing("SUPPRESS", ["u2"], T0, T0, 200, "r2"))
    assert kinds(inv.regulations_finished(o, done)) == ["answered, and not listed"]


# --- 4 -----------------------------------------------------------------------------------------


def test_4_finds_a_deleted_persona_left_in_a_sqlite_file_or_any_file(tmp_path: Path) -> None:
    data = tmp_path / "data"
    init_data_dir(data)
    paths = DataPaths(data)
    o = oracle_with(("m1", "gone-user", ["e1"]))
    ids = {"gone-user": ["gone-user", "anon-gone", "gone@example.com"]}
    assert not inv.deleted_leave_nothing(o, paths, ids, {"gone-user"})
    with sqlite3.connect(data / "left.sqlite") as conn:
        conn.execute("create table t (v text)")
        conn.execute("""insert into t values ('{"email": "gone@example.com"}')""")
    (data / "run" / "some.log").write_text("sent to anon-gone at 10:00\n")
    f = inv.deleted_leave_nothing(o, paths, ids, {"gone-user"})
    found = f.kinds["in the bytes of a file of the data dir"]
    assert any("left.sqlite" in x for x in found) and any("some.log" in x for x in found), found
    # A Delete that did not finish is regulations_finished's to report, not searched here.
    assert not inv.deleted_leave_nothing(o, paths, ids, set())


# --- 5 -----------------------------------------------------------------------------------------


def test_5_allows_a_second_copy_only_right_after_a_kill_of_a_dispatcher() -> None:
    o = Oracle(7)
    o.started = T0
    mails = [Mail(T0 + 10, "<s1@mallard>", "a@x"), Mail(T0 + 70, "<s1@mallard>", "a@x")]
    sent = [("s1", "a@x")]
    assert kinds(inv.emails_at_most_once(o, mails, sent)) == [
        "twice, with no kill of a dispatcher right after the first"
    ]
    o.kill(Kill("pipeline-watch", 123, T0 + 12, T0 + 14))
    assert not inv.emails_at_most_once(o, mails, sent)
    o.kills[0].at = T0 + 30  # too long after the first copy to have cut its mark short
    assert inv.emails_at_most_once(o, mails, sent)
    third = [*mails, Mail(T0 + 90, "<s1@mallard>", "a@x")]
    assert "more than twice" in kinds(inv.emails_at_most_once(o, third, sent))
    lost = inv.emails_at_most_once(o, mails[:1], [*sent, ("s2", "b@x")])
    assert kinds(lost) == ["marked sent in the outbox, never arrived"]


# --- 6 -----------------------------------------------------------------------------------------


def _journey(
    path: list[str], status: str = "exited", reason: str | None = "exit_step"
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    instances = [
        {
            "instance_id": "i1",
            "user_id": "u1",
            "command_event_id": "e1",
            "status": status,
            "exit_reason": reason,
            "current_step_id": path[-1],
        }
    ]
    steps = [
        {"instance_id": "i1", "step_id": s, "previous_step_id": prev}
        for prev, s in zip([None, *path], path, strict=False)
    ]
    return instances, steps


def test_6_fails_for_a_path_or_an_end_unlike_the_replay() -> None:
    o = Oracle(7)
    sent = o.message("c1", "u1", "start_journey", "api")
    o.attempt(sent, Attempt(T0, T0, 200, "e1"))
    replay = {"u1": ["hello", "pause", "route", "done"]}
    assert not inv.journeys_replay(o, *_journey(replay["u1"]), replay)
    wrong = inv.journeys_replay(o, *_journey(["hello", "pause", "route", "gold", "done"]), replay)
    assert kinds(wrong) == ["a path unlike the replay"]
    stuck = inv.journeys_replay(o, *_journey(["hello", "pause"], "active", None), replay)
    assert kinds(stuck) == ["a path unlike the replay", "an instance not ended at its exit step"]
    none = inv.journeys_replay(o, [], [], replay)
    assert kinds(none) == ["a start_journey not in exactly one instance"]


# --- 7 -----------------------------------------------------------------------------------------


def test_7_fails_for_a_pass_that_failed_after_the_last_recovery_only() -> None:
    o = Oracle(7)
    o.started = T0
    o.kill(Kill("server", 1, T0 + 50, T0 + 55))
    watcher = [(T0 + 40, "FAIL dbt build: 3 tests failed"), (T0 + 60, "ok   load: 1 new")]
    assert not inv.no_failed_pass_after_recovery(o, watcher, [("r0", "pipeline", T0 + 45, "x")])
    late = [*watcher, (T0 + 70, "FAIL dbt_models: Catalog Error")]
    assert kinds(inv.no_failed_pass_after_recovery(o, late, [])) == ["a watcher pass failed"]
    runs = [("r1", "compaction", T0 + 80, "Failed to commit DuckLake transaction")]
    assert kinds(inv.no_failed_pass_after_recovery(o, watcher, runs)) == ["a Dagster run failed"]
    o.run(Run("compaction", "mallard pipeline run", T0 + 90, T0 + 99, 1, "FAIL marts health: x"))
    assert kinds(inv.no_failed_pass_after_recovery(o, watcher, [])) == [
        "mallard pipeline run failed"
    ]


# --- 8 -----------------------------------------------------------------------------------------


def test_8_fails_for_a_message_twice_in_any_snapshot_or_a_failed_read() -> None:
    o = Oracle(7)
    o.snapshot(Snapshot(T0 + 5, 10, 0, 0))
    assert not inv.no_duplicate_in_any_snapshot(o)
    o.snapshot(Snapshot(T0 + 10, 12, 0, 2))
    assert kinds(inv.no_duplicate_in_any_snapshot(o)) == ["marts.events held a message twice"]
    o.snapshots[-1] = Snapshot(T0 + 10, 0, 0, 0, "CatalogException: ducklake_inlined_data_8_8")
    assert kinds(inv.no_duplicate_in_any_snapshot(o)) == ["a read of marts.events failed"]


# --- the schedule ------------------------------------------------------------------------------


def test_the_same_seed_plans_the_same_schedule() -> None:
    assert make_personas(5) == make_personas(5)
    assert plan(5, 180, make_personas(5)) == plan(5, 180, make_personas(5))
    assert plan(5, 180, make_personas(5)) != plan(6, 180, make_personas(6))
    roles = {p.role for p in plan(5, 180, make_personas(5))}
    assert roles == {"regulations", "import", "audience", "compaction", "chaos"}
