"""Who enters a journey, on real processes with an injected clock: each re-entry policy, a
replayed start_journey, stepIdToTrigger, a Suppress regulation (never enters) and NoTrack
(commands still work, so the customer enters). Journeys of a test config dir; each sends the
transactional welcome after an hour, so a loopback SMTP sink counts the instances that ran."""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
from aiosmtpd.controller import Controller

from mallard.harness import Server
from mallard.offline import TELEMETRY_OFF
from mallard.paths import DataPaths
from mallard.processes import stop_groups
from tests.conftest import REPO, free_port, init_data_dir, mallard, wait_landed

pytestmark = pytest.mark.integration

T0 = datetime(2030, 3, 2, 8, 0, tzinfo=UTC)
HOURLY = """
name = "{name}"
reentry = "{reentry}"
[[steps]]
id = "pause"
type = "wait"
duration = "1h"
next = "hello"
[[steps]]
id = "hello"
type = "send"
asset = "welcome"
"""


class Sink:
    def __init__(self) -> None:
        self.to: list[str] = []

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:  # noqa: N802
        self.to.extend(envelope.rcpt_tos)
        return "250 OK"


@dataclass
class Entry:
    server: Server
    sink: Sink
    clock: Path
    counts: dict[str, list[str]] = field(default_factory=dict)  # moment -> sink addresses

    def at(self, t: datetime) -> None:
        self.clock.write_text(t.isoformat())

    def dispatch(self) -> None:
        """The dispatcher alone (no pass): what the watcher does between passes when a wait
        falls due."""
        out = mallard("dispatch", data_dir=self.server.data_dir, env=self.server.env)
        assert out.returncode == 0, out.stdout + out.stderr

    def run_pass(self) -> None:
        out = self.server.pipeline()
        assert out.returncode == 0, out.stdout + out.stderr

    def post(self, action: str, body: dict[str, Any]) -> str:
        r = self.server.post(action, body)
        assert r.status_code == 200, r.text
        return str(r.json()["eventId"])

    def start(self, user: str, journey: str, message_id: str, **props: Any) -> str:
        return self.post(
            "track",
            {
                "userId": user,
                "event": "start_journey",
                "messageId": message_id,
                "properties": {"journeyIdToTrigger": journey, **props},
            },
        )

    def instances(self) -> list[tuple[str, str, str, str | None]]:
        """(userId, journey, status, exit reason) of every instance, sorted."""
        with sqlite3.connect(self.server.data_dir / "outbox.sqlite") as conn:
            return sorted(
                conn.execute(
                    "select user_id, journey_id, status, exit_reason from journey_instances"
                ).fetchall()
            )


@pytest.fixture(scope="module")
def entry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Entry]:
    root = tmp_path_factory.mktemp("journey-entry")
    config = root / "config"
    shutil.copytree(REPO / "config", config)
    for reentry in ("never", "after_exit", "always"):
        (config / "journeys" / f"hourly_{reentry}.toml").write_text(
            HOURLY.format(name=f"Hourly ({reentry})", reentry=reentry)
        )
    sink, smtp_port, port = Sink(), free_port(), free_port()
    controller = Controller(sink, hostname="127.0.0.1", port=smtp_port)
    controller.start()
    data = root / "data"
    server = Server(
        data,
        port,
        init_data_dir(data),
        env={
            "MALLARD_ROLL_INTERVAL_S": "0.3",
            "MALLARD_CONFIG_DIR": str(config),
            "MALLARD_SMTP_URL": f"smtp://127.0.0.1:{smtp_port}",
            "MALLARD_NOW": f"file:{root / 'clock'}",
        },
    )
    server.start()
    try:
        e = Entry(server, sink, root / "clock")
        e.at(T0 - timedelta(hours=1))
        users = {
            "ann": {"email": "ann@example.com"},
            "pro": {"email": "pro@example.com", "plan": "pro"},
            "sup": {"email": "sup@example.com"},
            "nt": {"email": "nt@example.com"},
        }
        wait_landed(
            data,
            [
                e.post("identify", {"userId": u, "event": "identify", "traits": t})
                for u, t in users.items()
            ],
        )
        e.run_pass()

        e.at(T0)
        ids = []
        for reentry in ("never", "after_exit", "always"):
            ids.append(e.start("ann", f"hourly_{reentry}", f"{reentry}-1"))
            ids.append(e.start("ann", f"hourly_{reentry}", f"{reentry}-2"))
        ids.append(e.start("ann", "hourly_always", "always-2"))  # replayed: the same messageId
        ids.append(e.start("pro", "welcome_series", "pro-mid", stepIdToTrigger="nudge"))
        ids.append(e.start("sup", "hourly_always", "sup-1"))
        wait_landed(data, ids)
        # Suppressed after its start_journey was accepted and landed, before any dispatch.
        r = server.post(
            "regulations",
            {"regulationType": "SUPPRESS", "subject": {"type": "USER_ID", "ids": ["sup"]}},
        )
        assert r.status_code == 200, r.text
        r = server.post(
            "regulations",
            {"regulationType": "NO_TRACK", "subject": {"type": "USER_ID", "ids": ["nt"]}},
        )
        assert r.status_code == 200, r.text
        nt = e.start("nt", "hourly_never", "nt-1")  # a command: NoTrack lets it through
        assert nt is not None
        wait_landed(data, [nt])
        e.run_pass()
        e.counts["entered"] = sorted(sink.to)

        e.at(T0 + timedelta(hours=1, minutes=1))
        e.dispatch()  # every hourly instance sends and completes
        e.counts["first hour"] = sorted(sink.to)

        e.at(T0 + timedelta(hours=2))
        wait_landed(
            data,
            [e.start("ann", f"hourly_{r}", f"{r}-3") for r in ("never", "after_exit", "always")],
        )
        e.run_pass()
        e.at(T0 + timedelta(hours=3, minutes=1))
        e.dispatch()
        e.counts["second hour"] = sorted(sink.to)
        e.run_pass()  # the journey events load
        yield e
    finally:
        server.stop()
        controller.stop()


def test_each_reentry_policy(entry: Entry) -> None:
    ann = [i for i in entry.instances() if i[0] == "ann"]
    by_journey: dict[str, int] = {}
    for _, journey, status, reason in ann:
        assert (status, reason) == ("exited", "completed")
        by_journey[journey] = by_journey.get(journey, 0) + 1
    # never: once ever; after_exit: not beside an active one, again after it exited;
    # always: every start (the replayed messageId is one start).
    assert by_journey == {"hourly_never": 1, "hourly_after_exit": 2, "hourly_always": 3}
    assert entry.counts["first hour"].count("ann@example.com") == 1 + 1 + 2
    assert entry.counts["second hour"].count("ann@example.com") == 1 + 1 + 2 + 1 + 1


def test_step_id_to_trigger_starts_mid_journey(entry: Entry) -> None:
    assert ("pro", "welcome_series", "exited", "exit_step") in entry.instances()
    events = entry.server.get("profiles/userId:pro/events", params={"sort": "asc", "size": 100})
    assert events.status_code == 200, events.text
    steps = [
        (e["eventAction"], e["rawData"]["properties"].get("stepId"))
        for e in events.json()["data"]
        if e["eventAction"].startswith("journey_")
    ]
    assert steps == [
        ("journey_started", "nudge"),
        ("journey_step_entered", "nudge"),
        ("journey_step_entered", "done"),
        ("journey_exited", "done"),
    ]
    assert "pro@example.com" not in entry.counts["second hour"]  # the welcome step was skipped


def test_a_suppressed_customer_never_enters(entry: Entry) -> None:
    assert [i for i in entry.instances() if i[0] == "sup"] == []
    assert "sup@example.com" not in entry.counts["second hour"]


def test_no_track_does_not_stop_journeys(entry: Entry) -> None:
    assert [i for i in entry.instances() if i[0] == "nt"] == [
        ("nt", "hourly_never", "exited", "completed")
    ]
    assert entry.counts["first hour"].count("nt@example.com") == 1


# The daemon's backstop sensor evaluated on the data dir, then again while a watcher holds the
# lock; prints what each evaluation answered.
_SENSOR = """
import sys
from pathlib import Path
import dagster as dg
from mallard.paths import DataPaths
from orchestration.defs.delivery import dispatch_when_due
from orchestration.locks import watcher_lock
from orchestration.resources import LakeResource

paths = DataPaths(Path(sys.argv[1]))
with dg.DagsterInstance.from_config(str(paths.dagster_home)) as instance:
    ctx = dg.build_sensor_context(
        instance=instance, resources={"lake": LakeResource(data_dir=str(paths.root))}
    )
    print(type(dispatch_when_due(ctx)).__name__)
    with watcher_lock(paths):
        print(type(dispatch_when_due(ctx)).__name__)
"""


def _sensor(entry: Entry) -> list[str]:
    env = {**os.environ, **entry.server.env, "MALLARD_DATA_DIR": str(entry.server.data_dir)}
    out = subprocess.run(
        [sys.executable, "-c", _SENSOR, str(entry.server.data_dir)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout.split()


# The tag Dagster gives a run that a sensor requested: the sensor's name.
SENSOR_TAG = "dagster/sensor_name"
# A bound, not a measure: the daemon's start-up, a 15 s sensor interval and the run's launch
# on a loaded host take well under it.
DAEMON_DEADLINE_S = 600


def _sensor_runs(entry: Entry, sensor: str) -> list[dg.DagsterRunStatus]:
    """The statuses of the dispatch runs this sensor requested."""
    home = DataPaths(entry.server.data_dir).dagster_home
    with dg.DagsterInstance.from_config(str(home)) as instance:
        runs = instance.get_runs(filters=dg.RunsFilter(tags={SENSOR_TAG: sensor}))
        return [r.status for r in runs if r.job_name == "dispatch"]


def _daemon(entry: Entry, log: Path) -> subprocess.Popen[bytes]:
    """`dagster-daemon run` on the data dir, as `mallard up` starts it (mallard/up.py)."""
    paths = DataPaths(entry.server.data_dir)
    env = {
        **os.environ,
        **entry.server.env,
        "MALLARD_DATA_DIR": str(paths.root),
        "DAGSTER_HOME": str(paths.dagster_home),
        **TELEMETRY_OFF,
    }
    with open(log, "ab") as out:
        return subprocess.Popen(
            [str(Path(sys.executable).parent / "dagster-daemon"), "run"]
            + ["-m", "orchestration.definitions"],
            cwd=REPO,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def test_the_daemon_dispatches_when_a_wait_falls_due(entry: Entry, tmp_path: Path) -> None:
    """Runs last: it starts one more instance and moves the clock."""
    entry.at(T0 + timedelta(hours=4))
    wait_landed(entry.server.data_dir, [entry.start("ann", "hourly_always", "always-4")])
    entry.run_pass()  # enters: the wait is due at T0+5h
    assert _sensor(entry) == ["SkipReason", "SkipReason"]  # not due yet
    entry.at(T0 + timedelta(hours=5, minutes=1))
    assert _sensor(entry) == ["RunRequest", "SkipReason"]  # due; a watcher would take it
    waiting = [i for i in entry.instances() if i[2] != "exited"]
    assert waiting == [("ann", "hourly_always", "active", None)]
    sent_before = entry.sink.to.count("ann@example.com")

    # The real daemon, no watcher: its sensor launches a dispatch run, which sends the welcome.
    log = tmp_path / "dagster-daemon.log"
    daemon = _daemon(entry, log)
    terminal = {
        dg.DagsterRunStatus.SUCCESS,
        dg.DagsterRunStatus.FAILURE,
        dg.DagsterRunStatus.CANCELED,
    }
    try:
        deadline = time.monotonic() + DAEMON_DEADLINE_S
        runs = _sensor_runs(entry, "dispatch_when_due")
        while not any(r in terminal for r in runs):
            assert daemon.poll() is None, log.read_text()[-6000:]
            assert time.monotonic() < deadline, (runs, log.read_text()[-6000:])
            time.sleep(1)
            runs = _sensor_runs(entry, "dispatch_when_due")
    finally:
        stop_groups([daemon], 30)
    assert dg.DagsterRunStatus.SUCCESS in runs, (runs, log.read_text()[-6000:])
    assert entry.sink.to.count("ann@example.com") == sent_before + 1
    assert [i for i in entry.instances() if i[2] != "exited"] == []
