"""Journeys under `kill -9`: the dispatcher (`mallard dispatch`) SIGKILLed 20 times at random
points while it moves 30 customers through two journeys ends in the state an uninterrupted
dispatcher reaches from the same data dir: the same instances, the same journey events, the
same sends, no step skipped, each send at the SMTP sink at least once and at most once more per
crash that caught it in flight (the outbox's guarantee), and each journey event once in the
warehouse.

One data dir is built with a server: 30 customers (plan pro/basic, half opted in to marketing
email), a `start_journey` for each into the repository's welcome series and into `activation`
(a wait_for on `feature_used`, then a branch on how many), modelled by a pass whose dispatch is
left out (so nothing is planned yet). It is copied twice; on each copy the injected clock
(MALLARD_NOW=file:) walks the same schedule and `mallard dispatch` runs at each time:

- reference: once per time, uninterrupted;
- faulted: killed (SIGKILL, by pid) after a seeded random delay within the reference run's
  duration, or at a fault point (MALLARD_FAULT_KILL_AT: journey_before_move, journey_in_move,
  journey_after_move in dispatch.advance(), dispatch_after_send in send_due), run again until
  one run exits 0; a killed run's leases are expired by hand (as LEASE_S later would).

Between the first and second times both copies land the same `feature_used` events (2 for some
customers, 1 for others) and run a pass without dispatch, so activation's wait_for and branch
see them. A last `mallard pipeline run` on each copy loads the recorded events.
"""

from __future__ import annotations

import email
import email.policy
import hashlib
import json
import os
import random
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pyarrow.parquet as pq
import pytest
from aiosmtpd.controller import Controller

from collector.messages import Tenant, stamp
from collector.roller import roll_segment
from collector.wal import SEALED_SUFFIX, frame
from mallard.offline import TELEMETRY_OFF
from mallard.paths import DataPaths
from orchestration.warehouse import lake_connection
from tests.conftest import REPO, Server, free_port, init_data_dir, mallard, wait_landed

pytestmark = [pytest.mark.integration, pytest.mark.faults]

SEED = int(os.environ.get("MALLARD_TEST_SEED", "20301"))
KILLS = 20
N = 30
T0 = datetime(2030, 1, 6, 9, 0, tzinfo=UTC)
# The dispatch times: entry and welcome; activation's events seen; welcome's wait over and
# activation's timeout; welcome's wait_for timed out (branch, reminder).
SCHEDULE = [
    T0,
    T0 + timedelta(hours=1),
    T0 + timedelta(days=2, minutes=1),
    T0 + timedelta(days=3, minutes=5),
]
EVENTS_BEFORE = 1  # the feature_used events land before SCHEDULE[1]
RANDOM = "random"  # killed after a random delay within the reference run's duration
# How the runs at each time are killed (fault points: MALLARD_FAULT_KILL_AT): 20 in all.
KILL_PLAN = [
    ["dispatch_after_send"] * 2 + ["journey_in_move"] + [RANDOM] * 3,  # entry, 30 welcomes
    ["journey_in_move", "journey_after_move", "dispatch_after_send", RANDOM],  # 6 sends
    ["journey_before_move", RANDOM, RANDOM],  # waits over, timeouts: moves, no send
    ["dispatch_after_send"] * 2 + ["journey_in_move", "journey_after_move"] + [RANDOM] * 3,
]
TIMEOUT_S = 120
USERS = [f"u{i:02d}" for i in range(N)]
PRO = {u for i, u in enumerate(USERS) if i % 3 == 0}
OPTED_IN = {u for i, u in enumerate(USERS) if i % 2 == 0}
FEATURE_USED = {u: (2 if i % 5 == 0 else 1) for i, u in enumerate(USERS) if i % 5 in (0, 1)}

ACTIVATION = """
name = "Activation"
reentry = "never"

[[steps]]
id = "watch"
type = "wait_for"
event = "feature_used"
timeout = "2d"
next = "count"
on_timeout = "gone"

[[steps]]
id = "count"
type = "branch"
cases = [{ if = "events.feature_used >= 2", goto = "power" }]
else = "gone"

[[steps]]
id = "power"
type = "send"
asset = "welcome"
next = "gone"

[[steps]]
id = "gone"
type = "exit"
"""

# `mallard pipeline run` without its dispatch step: the commands are modelled, not planned.
PASS_WITHOUT_DISPATCH = """
import sys
import orchestration.pipeline as p
p.dispatch_step = lambda paths: p.StepResult("dispatch", True, "left out by the test")
from mallard.cli import main
sys.exit(main(["pipeline", "run"]))
"""


class Sink:
    """A loopback SMTP server that keeps each message's Message-ID."""

    def __init__(self) -> None:
        self.message_ids: list[str] = []
        self.port = free_port()
        self.controller = Controller(self, hostname="127.0.0.1", port=self.port)

    @property
    def url(self) -> str:
        return f"smtp://127.0.0.1:{self.port}"

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:  # noqa: N802
        msg = email.message_from_bytes(envelope.content, policy=email.policy.default)
        self.message_ids.append(str(msg["Message-ID"]))
        return "250 OK"


@dataclass
class Base:
    data: Path
    config: Path
    creds: dict[str, str]


@dataclass
class Copy:
    """A copy of the base data dir with its own clock file and SMTP sink."""

    data: Path
    clock: Path
    config: Path
    creds: dict[str, str]
    sink: Sink
    durations: list[float] = field(default_factory=list)  # of the runs that exited 0
    kills: list[str] = field(default_factory=list)  # how each kill was made
    misses: list[str] = field(default_factory=list)  # runs that ended before their kill
    in_flight: Counter[str] = field(default_factory=Counter)  # send id -> kills while sending
    runs: int = 0
    final: dict[str, Any] = field(default_factory=dict)  # state() after the schedule

    @property
    def env(self) -> dict[str, str]:
        return {
            "MALLARD_DATA_DIR": str(self.data),
            "MALLARD_CONFIG_DIR": str(self.config),
            "MALLARD_NOW": f"file:{self.clock}",
            "MALLARD_SMTP_URL": self.sink.url,
            "MALLARD_PUBLIC_URL": "http://127.0.0.1:9",
            **TELEMETRY_OFF,
        }

    def at(self, t: datetime) -> None:
        self.clock.write_text(t.isoformat())

    def dispatch(self, kill_after: float | None = None, fault: str | None = None) -> int:
        """One `mallard dispatch`; SIGKILLed after `kill_after` s if still running. Its exit
        code (-9: killed)."""
        env = {**os.environ, **self.env}
        if fault:
            env["MALLARD_FAULT_KILL_AT"] = fault
        t = time.monotonic()
        proc = subprocess.Popen(
            [sys.executable, "-m", "mallard.cli", "dispatch"],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.runs += 1
        try:
            if kill_after is not None:
                try:
                    proc.wait(kill_after)
                except subprocess.TimeoutExpired:
                    os.kill(proc.pid, signal.SIGKILL)
            out, err = proc.communicate(timeout=TIMEOUT_S)
        finally:
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait(10)
        if proc.returncode == 0:
            self.durations.append(time.monotonic() - t)
        else:
            assert proc.returncode == -signal.SIGKILL, (proc.returncode, out, err)
            self._after_kill()
        return proc.returncode

    def _after_kill(self) -> None:
        """The dead dispatcher's sends in flight are counted, and their lease runs out (LEASE_S
        later; here: now), so the next run claims them again."""
        with sqlite3.connect(self.data / "outbox.sqlite", timeout=30) as conn:
            for (sid,) in conn.execute("select send_id from sends where status = 'sending'"):
                self.in_flight[sid] += 1
            conn.execute("update sends set lease_until = 0 where status = 'sending'")

    def pass_without_dispatch(self) -> None:
        _pass_without_dispatch(self.env)

    def land_feature_used(self) -> None:
        """The same `feature_used` events on each copy, received now (after the entries),
        landed as a collector lands its log."""
        paths = DataPaths(self.data)
        tenant = Tenant(self.creds["clientId"], self.creds["accountId"], self.creds["brandId"])
        now = datetime.now(UTC)
        msgs = [
            stamp(
                "track",
                {"userId": u, "event": "feature_used", "messageId": f"feature-{u}-{k}"},
                tenant,
                channel="server",
                source="jkill",
                received=now,
                request_ip=None,
            )
            for u, n in FEATURE_USED.items()
            for k in range(n)
        ]
        folder = paths.wal_dir / "jkill"
        folder.mkdir(parents=True, exist_ok=True)
        segment = folder / f"{1:016d}{SEALED_SUFFIX}"
        segment.write_bytes(b"".join(frame(json.dumps(m).encode()) for m in msgs))
        assert roll_segment(segment, paths, "jkill")

    def state(self) -> dict[str, Any]:
        with sqlite3.connect(self.data / "outbox.sqlite", timeout=30) as conn:
            return {
                "instances": conn.execute(
                    "select instance_id, journey_id, customer_id, step_id, status, exit_reason,"
                    " visits, due_at from journey_instances order by instance_id"
                ).fetchall(),
                "events": conn.execute(
                    "select event_key, instance_id, event, properties, at, recorded"
                    " from journey_events order by event_key"
                ).fetchall(),
                "sends": conn.execute(
                    "select send_id, command_event_id, asset_id, recipient, status, reason,"
                    " recorded from sends order by send_id"
                ).fetchall(),
                "planned": conn.execute(
                    "select command_event_id from planned order by 1"
                ).fetchall(),
            }

    def warehouse(self) -> dict[str, Counter[str]]:
        conn = lake_connection(DataPaths(self.data))
        try:
            rows = conn.execute(
                "select event_name, message_id, json_extract_string(properties, '$.sendId')"
                " from lake.intermediate.int_messages_identified"
                " where event_name like 'journey_%' or event_name like 'email_%'"
            ).fetchall()
        finally:
            conn.close()
        return {
            "journey": Counter(m for a, m, _ in rows if a.startswith("journey_")),
            "email": Counter(f"{a}:{s}" for a, _, s in rows if a.startswith("email_")),
        }


def _landed_twice(data: Path) -> int:
    """Journey events landed more than once (a run killed between writing its records and
    marking them recorded writes them again)."""
    ids: Counter[str] = Counter()
    for f in data.glob("landing/date=*/*.parquet"):
        t = pq.read_table(f, columns=["event", "message_id"]).to_pydict()
        ids.update(
            m for e, m in zip(t["event"], t["message_id"], strict=True) if e.startswith("journey_")
        )
    return sum(n - 1 for n in ids.values())


def _pass_without_dispatch(env: dict[str, str]) -> None:
    out = subprocess.run(
        [sys.executable, "-c", PASS_WITHOUT_DISPATCH],
        cwd=REPO,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout + out.stderr


def _copy(base: Base, dst: Path) -> Copy:
    shutil.copytree(base.data, dst / "data", symlinks=True)
    # DuckLake's catalog names its data path: the copy's names the copy's.
    with sqlite3.connect(dst / "data" / "lake" / "catalog.sqlite") as catalog:
        catalog.execute(
            "update ducklake_metadata set value = ? where key = 'data_path'",
            [f"{dst / 'data'}/lake/files/"],
        )
    sink = Sink()
    sink.controller.start()
    return Copy(dst / "data", dst / "clock", base.config, base.creds, sink)


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Base]:
    root = tmp_path_factory.mktemp("journeys-killed")
    config = root / "config"
    shutil.copytree(REPO / "config", config)
    (config / "journeys" / "activation.toml").write_text(ACTIVATION)
    clock = root / "clock"
    clock.write_text((T0 - timedelta(hours=1)).isoformat())
    data = root / "data"
    env = {
        "MALLARD_ROLL_INTERVAL_S": "0.3",
        "MALLARD_CONFIG_DIR": str(config),
        "MALLARD_NOW": f"file:{clock}",
        # Nothing listens: the only dispatch that runs here (the first pass's) has nothing to send.
        "MALLARD_SMTP_URL": f"smtp://127.0.0.1:{free_port()}",
    }
    mallard("journeys", "check", data_dir=data, env=env)
    creds = init_data_dir(data)
    server = Server(data, free_port(), creds, env=env)
    server.start()
    try:
        ids = []
        for i, u in enumerate(USERS):
            traits = {
                "email": f"{u}@example.com",
                "firstName": f"N{i}",
                "plan": "pro" if u in PRO else "basic",
            }
            r = server.post("identify", {"userId": u, "event": "identify", "traits": traits})
            assert r.status_code == 200, r.text
            ids.append(str(r.json()["eventId"]))
        wait_landed(data, ids)
        out = server.pipeline()
        assert out.returncode == 0, out.stdout + out.stderr
        for u in sorted(OPTED_IN):  # the reminder is marketing mail
            sid = server.get(f"profiles/userId:{u}/meta").json()["_subscriptionId"]
            p = httpx.post(
                f"{server.url}/cdp/marketing-preferences/{sid}",
                json={"channels": [{"channel": "email", "subscribed": True}]},
                timeout=30,
            )
            assert p.status_code == 200, p.text
        clock.write_text(T0.isoformat())
        starts = []
        for u in USERS:
            for journey in ("welcome_series", "activation"):
                r = server.post(
                    "track",
                    {
                        "userId": u,
                        "event": "start_journey",
                        "messageId": f"start-{journey}-{u}",
                        "properties": {"journeyIdToTrigger": journey, "source": "signup"},
                    },
                )
                assert r.status_code == 200, r.text
                starts.append(str(r.json()["eventId"]))
        wait_landed(data, starts)
    finally:
        server.stop()
    _pass_without_dispatch({**env, "MALLARD_DATA_DIR": str(data)})
    with sqlite3.connect(data / "outbox.sqlite") as conn:
        assert conn.execute("select count(*) from journey_instances").fetchone() == (0,)
    yield Base(data, config, creds)


def _walk(copy: Copy, rng: random.Random | None, ref: Copy | None) -> None:
    """The schedule on `copy`: uninterrupted (rng None), or with KILLS kills: at each time the
    modes of KILL_PLAN (order below), a run that ends without being killed (the point it waited
    for was not reached: its work was done) not counted; then runs until one exits 0; kills
    still owed at the end are made by random delays at the last time."""
    for n, t in enumerate(SCHEDULE):
        copy.at(t)
        if n == EVENTS_BEFORE:
            copy.land_feature_used()
            copy.pass_without_dispatch()
        if rng is not None:
            assert ref is not None
            # A random kill first (it may catch planning or moving under way), then the kills
            # after a send (while sends are left), then the others in a seeded random order.
            modes = list(KILL_PLAN[n])
            modes.remove(RANDOM)
            rng.shuffle(modes)
            modes.sort(key=lambda m: m != "dispatch_after_send")
            modes.insert(0, RANDOM)
            for attempt in range(60):
                if attempt < len(modes):
                    mode = modes[attempt]
                elif n == len(SCHEDULE) - 1 and len(copy.kills) < KILLS:
                    mode = RANDOM
                else:
                    break
                if mode == RANDOM:
                    # Within a run's duration: the reference's at this time (the first kill
                    # within its first 60%, while the work is under way), or for the kills
                    # owed at the end, this copy's last run that was not killed.
                    took = ref.durations[n] if attempt < len(modes) else copy.durations[-1]
                    delay = rng.uniform(0.2, (0.6 if attempt == 0 else 0.95) * took)
                    rc = copy.dispatch(kill_after=delay)
                    how = f"{t:%dT%H:%M} after {delay:.2f}s"
                else:
                    rc = copy.dispatch(fault=mode)
                    how = f"{t:%dT%H:%M} at {mode}"
                if rc != 0:
                    copy.kills.append(how)
                else:
                    copy.misses.append(how)
        for _ in range(5):
            if copy.dispatch() == 0:
                break
        else:
            raise AssertionError(f"no dispatch at {t} exited 0")
        with sqlite3.connect(copy.data / "outbox.sqlite") as conn:
            left = conn.execute(
                "select count(*) from sends where status in ('pending', 'sending')"
            ).fetchone()
        assert left == (0,), (t, left)


@pytest.fixture(scope="module")
def walked(base: Base, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Copy, Copy]]:
    root = tmp_path_factory.mktemp("copies")
    ref, faulted = _copy(base, root / "reference"), _copy(base, root / "faulted")
    try:
        t = time.monotonic()
        _walk(ref, None, None)
        _walk(faulted, random.Random(SEED), ref)
        for c in (ref, faulted):
            c.final = c.state()
            c.at(SCHEDULE[-1] + timedelta(minutes=1))
            mallard("pipeline", "run", data_dir=c.data, env=c.env, timeout=300)
        print(
            f"\nseed {SEED}: {len(faulted.kills)} kills in {faulted.runs} runs"
            f" (reference: {ref.runs} runs of {[round(d, 2) for d in ref.durations]} s);"
            f" {len(faulted.sink.message_ids) - len(set(faulted.sink.message_ids))} re-sends;"
            f" {_landed_twice(faulted.data)} journey events landed again;"
            f" {time.monotonic() - t:.0f} s\n  killed: "
            + "\n  killed: ".join(faulted.kills)
            + "".join(f"\n  ended first: {m}" for m in faulted.misses)
        )
        yield ref, faulted
    finally:
        ref.sink.controller.stop()
        faulted.sink.controller.stop()


def test_the_dispatcher_was_killed_as_many_times_as_asked(walked: tuple[Copy, Copy]) -> None:
    ref, faulted = walked
    assert len(faulted.kills) == KILLS
    assert any("after" in k for k in faulted.kills) and any(" at " in k for k in faulted.kills)
    # A kill after the provider's answer re-sends: the at-most-once-more path was taken.
    assert len(faulted.sink.message_ids) > len(set(faulted.sink.message_ids))


def test_the_reference_walks_every_path(walked: tuple[Copy, Copy]) -> None:
    ref, _ = walked
    final = ref.final
    ends = Counter((i[1], i[3], i[4], i[5]) for i in final["instances"])
    assert ends == {
        ("welcome_series", "done", "exited", "exit_step"): N,
        ("activation", "gone", "exited", "exit_step"): N,
    }
    outcomes = Counter((s[2], s[4], s[5]) for s in final["sends"])
    basic_in = len([u for u in OPTED_IN if u not in PRO])
    basic_out = len([u for u in USERS if u not in PRO and u not in OPTED_IN])
    assert outcomes == {
        ("welcome", "sent", None): N + len([n for n in FEATURE_USED.values() if n >= 2]),
        ("reminder", "sent", None): basic_in,
        ("reminder", "skipped", "preferences"): basic_out,
    }
    assert Counter(ref.sink.message_ids) == {
        f"<{s[0]}@mallard>": 1 for s in final["sends"] if s[4] == "sent"
    }


def test_the_same_end_state_as_uninterrupted(walked: tuple[Copy, Copy]) -> None:
    ref, faulted = walked
    a, b = ref.final, faulted.final
    assert b["planned"] == a["planned"]
    assert b["instances"] == a["instances"]
    assert b["events"] == a["events"]
    assert b["sends"] == a["sends"]
    for state in (a, b):
        assert {e[5] for e in state["events"]} == {1}  # every journey event recorded
        assert {s[6] for s in state["sends"]} == {1}  # every outcome recorded


def test_no_step_skipped(walked: tuple[Copy, Copy]) -> None:
    ref, faulted = walked
    paths: dict[str, dict[str, list[tuple[str, str | None]]]] = {}
    for name, c in (("ref", ref), ("faulted", faulted)):
        by: dict[str, list[tuple[str, str | None]]] = {}
        for _, iid, event, props, _, _ in sorted(c.final["events"], key=lambda e: e[4]):
            p = json.loads(props)
            if event == "journey_step_entered":
                by.setdefault(iid, []).append((p["stepId"], p["previousStepId"]))
        for iid, steps in by.items():
            # Each step entered is entered from the one before it.
            assert [prev for _, prev in steps] == [None, *[s for s, _ in steps[:-1]]], (iid, steps)
        paths[name] = by
    assert paths["faulted"] == paths["ref"]


def test_each_send_arrived_once_and_at_most_once_more_per_crash(
    walked: tuple[Copy, Copy],
) -> None:
    _, faulted = walked
    sent = {s[0] for s in faulted.final["sends"] if s[4] == "sent"}
    got = Counter(faulted.sink.message_ids)
    assert set(got) == {f"<{s}@mallard>" for s in sent}
    for sid in sent:
        n = got[f"<{sid}@mallard>"]
        assert 1 <= n <= 1 + faulted.in_flight[sid], (sid, n, faulted.in_flight[sid])
        if faulted.in_flight[sid] <= 1:
            assert n <= 2


def test_each_journey_event_and_outcome_is_once_in_the_warehouse(
    walked: tuple[Copy, Copy],
) -> None:
    ref, faulted = walked
    for c in (ref, faulted):
        expected = {
            "journey:" + hashlib.sha256(e[0].encode()).hexdigest()[:32] for e in c.final["events"]
        }
        stored = c.warehouse()
        assert stored["journey"] == dict.fromkeys(expected, 1)
        sends = c.final["sends"]
        assert stored["email"] == {f"email_{s[4]}:{s[0]}": 1 for s in sends}
    assert len(faulted.sink.message_ids) >= len(set(faulted.sink.message_ids))
