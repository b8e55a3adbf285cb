"""The whole product at once (issue 52): server, pipeline watcher, Dagster daemon and the local
mailbox (MALLARD_SMTP_URL) started as `make run` starts them, every role run by a seeded random
schedule for MALLARD_SYSTEM_S seconds (default 180) with processes killed, then, once the
pipeline is idle, the invariants of tests/system/invariants.py checked against the oracle of
what was acked.

MALLARD_SYSTEM_SEED replays a schedule (its random choices, not its thread timing); without it
the seed is random, and a failure names it. `make test` runs the 3-minute variant; `make soak`
the 30-minute one (MALLARD_SYSTEM_S=1800).
"""

from __future__ import annotations

import os
import random
import threading
import time
import traceback
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from unittest import mock

import pytest

from tests.system import facts
from tests.system import invariants as inv
from tests.system.oracle import Oracle, Snapshot
from tests.system.plan import ROLES as ALL_ROLES
from tests.system.product import DAEMON, MAILBOX, SERVER, WATCHER, Product
from tests.system.schedule import Schedule

SEED = int(os.environ.get("MALLARD_SYSTEM_SEED") or random.SystemRandom().randrange(1, 1_000_000))
DURATION = float(os.environ.get("MALLARD_SYSTEM_S", "180"))
# A comma-separated subset of schedule.ROLES (all by default), to tell which role breaks what.
ROLES = [r for r in os.environ.get("MALLARD_SYSTEM_ROLES", ",".join(ALL_ROLES)).split(",") if r]
# After the schedule: how long the pipeline may take to become idle (MALLARD_SYSTEM_IDLE_S).
IDLE_TIMEOUT = float(os.environ.get("MALLARD_SYSTEM_IDLE_S") or 300 + DURATION / 3)

# How often marts.events is read during the run for messages held twice.
MONITOR_S = 5.0

pytestmark = [
    pytest.mark.system,
    pytest.mark.integration,
    pytest.mark.timeout(DURATION + IDLE_TIMEOUT + 1500),
]


@pytest.fixture
def product(tmp_path: Path) -> Iterator[Product]:
    p = Product(tmp_path)
    p.prepare()
    try:
        yield p
    finally:
        p.stop_all()


def test_every_role_at_once_then_the_invariants(product: Product) -> None:
    t0 = time.monotonic()
    print(f"\nsystem test: seed {SEED}, {DURATION:.0f} s, roles {ROLES}, in {product.root}")
    oracle = Oracle(SEED)
    schedule = Schedule(product, oracle, SEED, DURATION, ROLES)
    print(schedule.describe(), flush=True)
    schedule.dump(product.root / "plan.json")

    # What `mallard up` does: the mailbox, the server, (demo traffic: the personas' first
    # identifies, landed) a first pass by hand, the watcher, the daemon.
    product.start(MAILBOX)
    product.start(SERVER)
    schedule.seed_personas()
    product.wait_landed(oracle.acked_event_ids())
    product.cli("pipeline", "run")
    product.start(WATCHER)
    product.start(DAEMON)
    print(f"product up at {time.monotonic() - t0:.0f} s", flush=True)
    # The roles stop at DURATION; what they started (a pass by hand, a compaction, an import, a
    # retried call) and then the pipeline have IDLE_TIMEOUT more to end.
    idle_by = time.monotonic() + DURATION + IDLE_TIMEOUT
    done = threading.Event()
    monitor = threading.Thread(target=_monitor, args=(product, oracle, done), daemon=True)
    monitor.start()
    schedule.run(idle_by)
    print(f"schedule done at {time.monotonic() - t0:.0f} s; waiting for idle", flush=True)

    results: dict[str, inv.Failures] = {}
    still = product.wait_idle(max(1.0, idle_by - time.monotonic()))
    print(f"idle at {time.monotonic() - t0:.0f} s (pending: {still})", flush=True)
    done.set()
    monitor.join(60)
    regulations = _regulations(product)
    ran = inv.Failures()
    for p in still:
        ran.add(f"still pending {IDLE_TIMEOUT:.0f} s after the schedule", p)
    for e in product.exited():  # none should have exited by itself
        ran.add("a process exited by itself", e)
    for problem in oracle.problems:
        ran.add("a role of the schedule crashed or did not end", problem)
    ran.info.append(_ran(oracle))
    results["0. the schedule ran and the pipeline went idle"] = ran
    product.stop_all()

    rebuilt: list[Any] = []
    builder = threading.Thread(
        target=_into(
            rebuilt, lambda: facts.rebuild(product.paths, product.root / "rebuild", product.env)
        ),
        daemon=True,
    )
    builder.start()
    paths = product.paths
    filed_deletes = [p for p in schedule.personas if p.user_id in oracle.deleted_users()]
    secret = paths.secret_file.read_text().strip()
    checks: list[tuple[str, Callable[[], inv.Failures]]] = [
        (
            "1. events_exactly_once",
            lambda: inv.events_exactly_once(
                oracle, facts.read_events(paths), facts.read_dropped(paths)
            ),
        ),
        (
            "3. regulations_finished",
            lambda: inv.regulations_finished(oracle, regulations, "regulations" in ROLES),
        ),
        (
            "4. deleted_leave_nothing",
            lambda: inv.deleted_leave_nothing(
                oracle,
                paths,
                facts.personas_identifiers(filed_deletes, secret),
                facts.finished_deletes(regulations, [p.user_id for p in filed_deletes], paths),
            ),
        ),
        (
            "5. emails_at_most_once",
            lambda: inv.emails_at_most_once(
                oracle,
                facts.read_mailbox(paths),
                facts.read_sent_emails(paths),
                "commands" in ROLES,
            ),
        ),
        (
            "6. journeys_replay",
            lambda: inv.journeys_replay(
                oracle,
                *facts.read_journeys(paths),
                _replays(product, schedule, oracle),
                "commands" in ROLES,
            ),
        ),
        ("8. no_duplicate_in_any_snapshot", lambda: inv.no_duplicate_in_any_snapshot(oracle)),
        (
            "7. no_failed_pass_after_recovery",
            lambda: inv.no_failed_pass_after_recovery(
                oracle, product.log_lines(WATCHER), facts.failed_dagster_runs(paths)
            ),
        ),
    ]
    for name, check in checks:
        t = time.monotonic()
        results[name] = _checked(check)
        print(f"{name}: {time.monotonic() - t:.0f} s", flush=True)
    builder.join(1800)
    name = "2. marts_equal_rebuild"
    if not rebuilt or isinstance(rebuilt[0], BaseException):
        results[name] = inv.Failures()
        results[name].add("the rebuild failed", str(rebuilt[0] if rebuilt else "it did not end"))
    else:
        results[name] = _checked(
            lambda: inv.marts_equal_rebuild(facts.read_marts(paths), rebuilt[0])
        )

    oracle.dump(product.root / "oracle.json")
    summary = _summary(oracle, results, product, time.monotonic() - t0)
    (product.root / "report.txt").write_text(summary)
    print(summary, flush=True)
    if any(results.values()):
        pytest.fail(summary, pytrace=False)


def _monitor(product: Product, oracle: Oracle, done: threading.Event) -> None:
    """Reads marts.events every few seconds, as an analyst or the API would, until done."""
    while not done.wait(MONITOR_S):
        at = time.time()
        try:
            oracle.snapshot(Snapshot(at, *facts.read_duplicates(product.paths)))
        except Exception as e:  # the lake mid-purge, say: a read that failed is noted
            oracle.snapshot(Snapshot(at, 0, 0, 0, f"{type(e).__name__}: {str(e)[:300]}"))


def _into(out: list[Any], fn: Callable[[], Any]) -> Callable[[], None]:
    def target() -> None:
        try:
            out.append(fn())
        except BaseException as e:  # reported as the check's failure
            out.append(e)

    return target


def _checked(check: Callable[[], inv.Failures]) -> inv.Failures:
    """A check's failures; a check that raised is a failure of it, with the error."""
    try:
        return check()
    except Exception as e:
        f = inv.Failures()
        f.add(f"the check raised {type(e).__name__}", f"{e}\n{traceback.format_exc()[-3000:]}")
        return f


def _regulations(product: Product) -> list[dict[str, Any]]:
    """Every regulation of the demo account, as `GET regulations/{id}` answers."""
    r = product.get("regulations")
    assert r.status_code == 200, r.text
    out = []
    for item in r.json()["data"]:
        one = product.get(f"regulations/{item['regulationId']}")
        out.append(one.json() if one.status_code == 200 else {**item, "error": one.text})
    return out


def _replays(product: Product, schedule: Schedule, oracle: Oracle) -> dict[str, list[str]]:
    """The path through the journey that dry_run replays now for each persona never regulated
    that started it (the step ids of its lines)."""
    from mallard.journeys import load_journeys_and_errors
    from orchestration.delivery.journeys import dry_run
    from tests.system.product import JOURNEY_ID

    journeys, broken = load_journeys_and_errors(product.config)
    assert JOURNEY_ID in journeys, broken
    eligible = {p.user_id for p in schedule.personas} - oracle.regulated_users()
    started = {s.user_id for s in inv.journey_starts(oracle, eligible)}

    def replay(user: str) -> list[str]:
        lines = dry_run(product.paths, journeys[JOURNEY_ID], user)
        return [line.split(" ", 1)[0] for line in lines if not line.startswith("end:")]

    # A dry run attaches the lake (~0.6 s, in DuckDB, off the GIL): a few at once.
    with (
        mock.patch.dict(os.environ, {"MALLARD_CONFIG_DIR": str(product.config)}),
        ThreadPoolExecutor(4) as pool,
    ):
        users = sorted(started)
        return dict(zip(users, pool.map(replay, users), strict=True))


def _ran(oracle: Oracle) -> str:
    acked = sum(1 for s in oracle.sent.values() if s.event_ids)
    prefs = Counter(p.status for p in oracle.preferences)
    runs = Counter(f"{r.what.split(' ')[0]} {r.returncode}" for r in oracle.runs)
    return (
        f"{len(oracle.sent)} messages ({acked} acked), filings"
        f" {dict(Counter(f.regulation_type for f in oracle.filings if f.status == 200))},"
        f" preference updates by status {dict(prefs)}, commands run {dict(runs)}"
    )


def _summary(
    oracle: Oracle, results: dict[str, inv.Failures], product: Product, took: float
) -> str:
    by_victim = Counter(k.victim for k in oracle.kills if k.pid)
    kills = ", ".join(
        f"{k.victim}@+{k.at - oracle.started:.0f}s" + ("" if k.pid else f" ({k.detail})")
        for k in oracle.kills[-12:]
    )
    if len(oracle.kills) > 12:
        kills = f"{len(oracle.kills)} ({dict(by_victim)}), the last: {kills}"
    lines = [
        f"system test seed {SEED} ({DURATION:.0f} s schedule, {took:.0f} s in all); replay:"
        f" MALLARD_SYSTEM_SEED={SEED} MALLARD_SYSTEM_S={DURATION:.0f}"
        + ("" if set(ROLES) == set(ALL_ROLES) else f" MALLARD_SYSTEM_ROLES={','.join(ROLES)}")
        + " .venv/bin/python -m pytest -m system tests/system -s",
        f"  kills: {kills or 'none'}",
        f"  files: {product.root} (oracle.json, plan.json, report.txt, data/run/*.log)",
    ]
    for name, failures in sorted(results.items()):
        lines.append(f"{'FAIL' if failures else 'ok  '} {name}")
        lines += [f"       ({note})" for note in failures.info]
        lines += [f"       {line}" for line in failures.report()]
    others = oracle.anomalies
    if others:
        lines.append(f"  {len(others)} unexpected answers (not failures):")
        lines += [f"       {a[:300]}" for a in others[:10]]
    return "\n".join(lines)
