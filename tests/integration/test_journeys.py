"""Journeys on real processes with an injected clock (MALLARD_NOW=file:...): a server, `mallard
pipeline run` as the dispatcher, a loopback SMTP sink. The repository's welcome series (send
welcome -> wait 2d -> wait_for email_clicked in the welcome email, 1d -> branch on
traits.plan -> reminder or done) taken by three customers, one per path:

- `clicker` clicks the welcome email's link while waiting: welcome only, exits at `done`;
- `pro` does not click, times out, and the branch sends them to `done`: welcome only;
- `basic` does not click, times out, and gets the reminder: welcome and reminder.

The sends are counted at the sink and the journey events read from the events API. Every
advance here moves its instances over two processes (MALLARD_JOURNEY_SPLIT_AT=1).
"""

from __future__ import annotations

import email
import email.policy
import re
import sqlite3
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from email.message import EmailMessage
from html import unescape
from pathlib import Path
from typing import Any

import httpx
import pyarrow.parquet as pq
import pytest
from aiosmtpd.controller import Controller

from mallard.harness import Server
from tests.conftest import free_port, init_data_dir, mallard, wait_landed

pytestmark = pytest.mark.integration

T0 = datetime(2030, 1, 6, 9, 0, tzinfo=UTC)
USERS = {
    "clicker": {"email": "clicker@example.com", "firstName": "Cleo", "plan": "basic"},
    "pro": {"email": "pro@example.com", "firstName": "Pat", "plan": "pro"},
    "basic": {"email": "basic@example.com", "firstName": "Bea", "plan": "basic"},
}


class Sink:
    def __init__(self) -> None:
        self.raw: list[bytes] = []

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:  # noqa: N802
        self.raw.append(envelope.original_content or envelope.content)
        return "250 OK"

    def messages(self) -> list[EmailMessage]:
        out = []
        for raw in self.raw:
            msg = email.message_from_bytes(raw, policy=email.policy.default)
            assert isinstance(msg, EmailMessage)
            out.append(msg)
        return out

    def subjects(self, address: str) -> list[str]:
        return [str(m["Subject"]) for m in self.messages() if m["To"] == address]


@dataclass
class Run:
    server: Server
    sink: Sink
    clock: Path
    outs: list[str] = field(default_factory=list)
    after_first_day: dict[str, list[str]] = field(default_factory=dict)
    starts: dict[str, str] = field(default_factory=dict)  # user -> start_journey eventId
    events: list[dict[str, Any]] = field(default_factory=list)

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
        self.outs.append(out.stdout)

    def post(self, action: str, body: dict[str, Any]) -> str:
        r = self.server.post(action, body)
        assert r.status_code == 200, r.text
        return str(r.json()["eventId"])


def _click_welcome(sink: Sink, address: str) -> None:
    [welcome] = [m for m in sink.messages() if m["To"] == address]
    html = welcome.get_body(preferencelist=("html",))
    assert html is not None
    links = re.findall(r'href="([^"]+/cdp/email/c/[^"]+)"', html.get_content())  # type: ignore[attr-defined]
    assert links
    r = httpx.get(unescape(links[0]), timeout=30, follow_redirects=False)
    assert r.status_code == 302, r.text


def _wait_landed_event(data: Path, event: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for f in (data / "landing").glob("date=*/*.parquet"):
            if event in pq.read_table(f, columns=["event"]).column("event").to_pylist():
                return
        time.sleep(0.2)
    raise AssertionError(f"no {event} landed after {timeout}s")


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    root = tmp_path_factory.mktemp("journeys")
    sink, smtp_port, port = Sink(), free_port(), free_port()
    controller = Controller(sink, hostname="127.0.0.1", port=smtp_port)
    controller.start()
    clock = root / "clock"
    data = root / "data"
    server = Server(
        data,
        port,
        init_data_dir(data),
        env={
            "MALLARD_ROLL_INTERVAL_S": "0.3",
            "MALLARD_SMTP_URL": f"smtp://127.0.0.1:{smtp_port}",
            "MALLARD_PUBLIC_URL": f"http://127.0.0.1:{port}",
            "MALLARD_NOW": f"file:{clock}",
            # Every advance hands every second instance to a second process (the path of a
            # large move): the paths and their sends are the same as with one.
            "MALLARD_JOURNEY_SPLIT_AT": "1",
        },
    )
    server.start()
    try:
        r = Run(server, sink, clock)
        r.at(T0 - timedelta(hours=1))
        wait_landed(
            data,
            [
                r.post("identify", {"userId": u, "event": "identify", "traits": t})
                for u, t in USERS.items()
            ],
        )
        r.run_pass()
        # The reminder is marketing mail: basic opts in to email on the preferences API.
        sid = server.get("profiles/userId:basic/meta").json()["_subscriptionId"]
        p = httpx.post(
            f"{server.url}/cdp/marketing-preferences/{sid}",
            json={"channels": [{"channel": "email", "subscribed": True}]},
            timeout=30,
        )
        assert p.status_code == 200, p.text

        r.at(T0)
        for u in USERS:
            r.starts[u] = r.post(
                "track",
                {
                    "userId": u,
                    "event": "start_journey",
                    "messageId": f"start-{u}",
                    "properties": {"journeyIdToTrigger": "welcome_series", "source": "signup"},
                },
            )
        # The same start again (a retried request): one instance.
        r.post(
            "track",
            {
                "userId": "clicker",
                "event": "start_journey",
                "messageId": "start-clicker",
                "properties": {"journeyIdToTrigger": "welcome_series", "source": "signup"},
            },
        )
        wait_landed(data, list(r.starts.values()))
        r.run_pass()  # enters everyone; the welcome goes out; the wait begins
        r.at(T0 + timedelta(days=1))
        r.dispatch()  # a day in: nothing is due
        r.after_first_day = {u: sink.subjects(t["email"]) for u, t in USERS.items()}
        r.at(T0 + timedelta(days=2, minutes=1))
        r.dispatch()  # the wait is over: everyone waits for a click
        _click_welcome(sink, USERS["clicker"]["email"])
        r.at(T0 + timedelta(days=2, minutes=2))
        # The click lands through the collector; this pass loads it, then moves clicker on.
        _wait_landed_event(data, "email_clicked")
        r.run_pass()
        r.at(T0 + timedelta(days=3, minutes=5))
        r.dispatch()  # the others time out: pro to done, basic to the reminder
        r.run_pass()  # the last events load
        ev = server.get("events/", params={"sort": "asc", "size": 100})
        assert ev.status_code == 200, ev.text
        r.events = ev.json()["data"]
        assert len(r.events) < 100  # all on one page
        yield r
    finally:
        server.stop()
        controller.stop()


def _journey_events(run: Run, user: str) -> list[tuple[str, str | None, str | None]]:
    out = []
    for e in run.events:
        if e["userId"] == user and e["eventAction"].startswith("journey_"):
            p = e["rawData"]["properties"]
            out.append((e["eventAction"], p.get("stepId"), p.get("reason")))
    return out


def test_each_path_gets_exactly_its_sends(run: Run) -> None:
    assert run.after_first_day == {
        "clicker": ["Welcome, Cleo"],
        "pro": ["Welcome, Pat"],
        "basic": ["Welcome, Bea"],
    }
    assert run.sink.subjects("clicker@example.com") == ["Welcome, Cleo"]
    assert run.sink.subjects("pro@example.com") == ["Welcome, Pat"]
    assert run.sink.subjects("basic@example.com") == [
        "Welcome, Bea",
        "Bea, your account is waiting",
    ]
    assert len(run.sink.raw) == 4


def test_each_path_records_its_journey_events(run: Run) -> None:
    entered = [("journey_started", "hello", None), ("journey_step_entered", "hello", None)]
    waited = [
        ("journey_step_entered", "pause", None),
        ("journey_step_entered", "clicked", None),
    ]
    assert _journey_events(run, "clicker") == [
        *entered,
        *waited,
        ("journey_step_entered", "done", None),
        ("journey_exited", "done", "exit_step"),
    ]
    assert _journey_events(run, "pro") == [
        *entered,
        *waited,
        ("journey_step_entered", "nudge", None),
        ("journey_step_entered", "done", None),
        ("journey_exited", "done", "exit_step"),
    ]
    assert _journey_events(run, "basic") == [
        *entered,
        *waited,
        ("journey_step_entered", "nudge", None),
        ("journey_step_entered", "reminder", None),
        ("journey_step_entered", "done", None),
        ("journey_exited", "done", "exit_step"),
    ]


def test_journey_events_carry_the_journey_clock(run: Run) -> None:
    [started] = [
        e for e in run.events if e["userId"] == "pro" and e["eventAction"] == "journey_started"
    ]
    p = started["rawData"]["properties"]
    assert p["journeyId"] == "welcome_series" and p["commandEventId"] == run.starts["pro"]
    assert started["rawData"]["timestamp"].startswith("2030-01-06T09:00")
    [pause] = [
        e
        for e in run.events
        if e["userId"] == "pro"
        and e["eventAction"] == "journey_step_entered"
        and e["rawData"]["properties"]["stepId"] == "pause"
    ]
    assert pause["rawData"]["properties"]["dueAt"].startswith("2030-01-08T09:00")


def test_journey_sends_are_the_start_commands_and_name_the_step(run: Run) -> None:
    status = run.server.get(f"events/{run.starts['basic']}/status")
    assert status.status_code == 200, status.text
    assert [s["status"] for s in status.json()["sends"]] == ["sent", "sent"]
    sent = [
        e["rawData"]["properties"]
        for e in run.events
        if e["userId"] == "basic" and e["eventAction"] == "email_sent"
    ]
    assert sorted((p["stepId"], p["assetId"]) for p in sent) == [
        ("hello", "welcome"),
        ("reminder", "reminder"),
    ]
    assert {p["journeyId"] for p in sent} == {"welcome_series"}


def test_an_analyst_sees_the_paths_in_sql(run: Run) -> None:
    from mallard.paths import DataPaths
    from mallard.warehouse import connect

    conn = connect(DataPaths(run.server.data_dir), read_only=True)
    try:
        instances = conn.execute(
            "select user_id, status, current_step_id, exit_reason, steps_entered"
            " from lake.marts.journey_instances order by user_id"
        ).fetchall()
        sends = conn.execute(
            "select user_id, asset_id, outcome, journey_id, journey_step_id"
            " from lake.marts.deliveries where journey_id is not null order by user_id, asset_id"
        ).fetchall()
    finally:
        conn.close()
    assert instances == [
        ("basic", "exited", "done", "exit_step", 6),
        ("clicker", "exited", "done", "exit_step", 4),
        ("pro", "exited", "done", "exit_step", 5),
    ]
    # Opens and clicks name the send (send_id), not the journey: a join on send_id finds it.
    assert sends == [
        ("basic", "reminder", "sent", "welcome_series", "reminder"),
        ("basic", "welcome", "sent", "welcome_series", "hello"),
        ("clicker", "welcome", "sent", "welcome_series", "hello"),
        ("pro", "welcome", "sent", "welcome_series", "hello"),
    ]


def _outbox_rows(run: Run) -> list[str]:
    """The outbox's schema and every row, as SQL statements."""
    with sqlite3.connect(run.server.data_dir / "outbox.sqlite") as conn:
        return list(conn.iterdump())


def test_a_dry_run_names_the_sends_and_sends_nothing(run: Run) -> None:
    outbox, at_sink = _outbox_rows(run), len(run.sink.raw)
    assert any('INSERT INTO "sends"' in row for row in outbox)  # the walk's four sends
    out = mallard(
        "journeys",
        "dry-run",
        "welcome_series",
        "--user",
        "basic",
        data_dir=run.server.data_dir,
        env=run.server.env,
    )
    assert out.stdout.splitlines() == [
        "welcome_series (Welcome series) for userId basic, nothing is sent:",
        "  hello (send): welcome: would send to basic@example.com",
        "  pause (wait): 2d",
        "  clicked (wait_for): no email_clicked within 1d: times out",
        "  nudge (branch): else -> reminder",
        "  reminder (send): reminder: would send to basic@example.com",
        "  done (exit): leaves the journey",
    ], out.stdout + out.stderr
    assert len(run.sink.raw) == at_sink
    assert _outbox_rows(run) == outbox
