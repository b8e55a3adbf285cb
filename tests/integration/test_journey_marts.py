"""marts.journey_steps and marts.journey_instances from journey events, through a real server and
two `mallard pipeline run` passes.

The journey_* tracks are posted as the journey runtime records them (library mallard-dispatch,
the customer's userId, the journey clock's time as `timestamp`), split across the passes so the
second is incremental: ann's instance starts in the first pass and exits in the second, bob's
loops back to a step (visit 2) in the second and stays active. ann's first transition enters two
steps at one clock time (a send, then its wait): the later-stamped one is the current step.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from mallard.harness import Server, free_port, init_data_dir
from mallard.paths import DataPaths
from mallard.warehouse import connect
from orchestration.regulations import subjects
from orchestration.regulations.access import DERIVED
from tests.conftest import wait_landed

pytestmark = pytest.mark.integration

# Journey clock times, ahead of the receipt times as an injected test clock may be.
T0 = "2031-05-01T09:00:00Z"
T1 = "2031-05-03T09:00:00Z"
T2 = "2031-05-03T09:00:05Z"
T3 = "2031-05-04T09:00:00Z"
DUE_PAUSE = T1
DUE_CLICKED = "2031-05-04T09:00:00Z"
DUE_CHECK1 = "2031-05-01T10:00:00Z"
DUE_CHECK2 = "2031-05-03T10:00:05Z"

STEP_COLUMNS = (
    "message_id, user_id, journey_id, instance_id, step_id, step_type, previous_step_id, visit,"
    " due_at, entered_at"
)
INSTANCE_COLUMNS = (
    "instance_id, journey_id, user_id, command_event_id, started_at, entry_step_id,"
    " current_step_id, current_step_entered_at, status, exited_at, exit_reason, steps_entered"
)


@dataclass
class World:
    server: Server
    event_ids: dict[str, str] = field(default_factory=dict)  # messageId -> eventId
    after_first: dict[str, list[tuple[Any, ...]]] = field(default_factory=dict)
    after_second: dict[str, list[tuple[Any, ...]]] = field(default_factory=dict)

    def record(self, message_id: str, user: str, event: str, at: str, **props: Any) -> None:
        """A journey event as the runtime records it (keyword arguments: its properties)."""
        r = self.server.post(
            "track",
            {
                "userId": user,
                "event": event,
                "messageId": message_id,
                "timestamp": at,
                "properties": _camel(props),
                "context": {"library": {"name": "mallard-dispatch"}},
            },
        )
        assert r.status_code == 200, r.text
        self.event_ids[message_id] = str(r.json()["eventId"])

    def entered(
        self,
        message_id: str,
        user: str,
        at: str,
        journey: str,
        instance: str,
        step: str,
        step_type: str,
        previous: str | None,
        visit: int,
        due: str | None = None,
    ) -> None:
        self.record(
            message_id,
            user,
            "journey_step_entered",
            at,
            journey_id=journey,
            instance_id=instance,
            step_id=step,
            step_type=step_type,
            previous_step_id=previous,
            visit=visit,
            due_at=due,
        )

    def run_pass(self, message_ids: list[str]) -> dict[str, list[tuple[Any, ...]]]:
        wait_landed(self.server.data_dir, [self.event_ids[m] for m in message_ids])
        self.server.pipeline()
        conn = connect(DataPaths(self.server.data_dir), read_only=True)
        try:
            steps = conn.execute(
                f"select {_iso(STEP_COLUMNS)} from lake.marts.journey_steps"
                " order by instance_id, entered_at, event_id"
            ).fetchall()
            instances = conn.execute(
                f"select {_iso(INSTANCE_COLUMNS)} from lake.marts.journey_instances"
                " order by instance_id"
            ).fetchall()
            keys = conn.execute(
                "select distinct s.account_id, s.client_id, s.brand_id,"
                " s.customer_id = c.customer_id, i.account_id = s.account_id,"
                " i.customer_id = s.customer_id"
                " from lake.marts.journey_steps as s"
                " join lake.marts.customers as c on c.user_id = s.user_id"
                " join lake.marts.journey_instances as i on i.instance_id = s.instance_id"
            ).fetchall()
            events = conn.execute(
                "select event_id, message_id, received_at is not null"
                " from lake.marts.journey_steps order by message_id"
            ).fetchall()
        finally:
            conn.close()
        return {"steps": steps, "instances": instances, "keys": keys, "events": events}


def _iso(columns: str) -> str:
    """The columns, times as ISO text in UTC."""
    times = {"due_at", "entered_at", "started_at", "current_step_entered_at", "exited_at"}
    out = []
    for col in (c.strip() for c in columns.split(",")):
        if col in times:
            out.append(f"strftime({col} at time zone 'UTC', '%Y-%m-%dT%H:%M:%SZ') as {col}")
        else:
            out.append(col)
    return ", ".join(out)


def _camel(props: dict[str, Any]) -> dict[str, Any]:
    """snake_case keyword arguments as the runtime's camelCase properties."""
    return {
        k.split("_")[0] + "".join(p.title() for p in k.split("_")[1:]): v for k, v in props.items()
    }


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    data_dir = tmp_path_factory.mktemp("journeys") / "data"
    srv = Server(
        data_dir, free_port(), init_data_dir(data_dir), env={"MALLARD_ROLL_INTERVAL_S": "0.3"}
    )
    srv.start()
    try:
        w = World(srv)
        # First pass: both instances start; ann enters hello and pause at one clock time.
        w.record("a-start", "ann", "journey_started", T0, journey_id="welcome_series",
                 instance_id="inst-a", step_id="hello", command_event_id="cmd-a",
                 reentry=False)  # fmt: skip
        w.entered("a-hello", "ann", T0, "welcome_series", "inst-a", "hello", "send", None, 1)
        w.entered("a-pause", "ann", T0, "welcome_series", "inst-a", "pause", "wait", "hello", 1,
                  DUE_PAUSE)  # fmt: skip
        w.record("b-start", "bob", "journey_started", T0, journey_id="loop_demo",
                 instance_id="inst-b", step_id="check", command_event_id="cmd-b",
                 reentry=False)  # fmt: skip
        w.entered("b-check1", "bob", T0, "loop_demo", "inst-b", "check", "wait", None, 1,
                  DUE_CHECK1)  # fmt: skip
        w.entered("b-poll", "bob", DUE_CHECK1, "loop_demo", "inst-b", "poll", "branch", "check", 1)
        first = ["a-start", "a-hello", "a-pause", "b-start", "b-check1", "b-poll"]
        w.after_first = w.run_pass(first)

        # Second pass: ann waits for a click, gets it and exits at the exit step; bob loops back.
        w.entered("a-clicked", "ann", T1, "welcome_series", "inst-a", "clicked", "wait_for",
                  "pause", 1, DUE_CLICKED)  # fmt: skip
        w.entered("a-done", "ann", T2, "welcome_series", "inst-a", "done", "exit", "clicked", 1)
        w.record("a-exit", "ann", "journey_exited", T2, journey_id="welcome_series",
                 instance_id="inst-a", step_id="done", reason="exit_step")  # fmt: skip
        w.entered("b-check2", "bob", T2, "loop_demo", "inst-b", "check", "wait", "poll", 2,
                  DUE_CHECK2)  # fmt: skip
        w.after_second = w.run_pass(["a-clicked", "a-done", "a-exit", "b-check2"])
        yield w
    finally:
        srv.stop()


def _step(*row: Any) -> tuple[Any, ...]:
    """A journey_steps row: message_id, user_id, journey_id, instance_id, step_id, step_type,
    previous_step_id, visit, due_at, entered_at."""
    return row


FIRST_STEPS = [
    _step("a-hello", "ann", "welcome_series", "inst-a", "hello", "send", None, 1, None, T0),
    _step("a-pause", "ann", "welcome_series", "inst-a", "pause", "wait", "hello", 1, DUE_PAUSE, T0),
    _step("b-check1", "bob", "loop_demo", "inst-b", "check", "wait", None, 1, DUE_CHECK1, T0),
    _step("b-poll", "bob", "loop_demo", "inst-b", "poll", "branch", "check", 1, None, DUE_CHECK1),
]
SECOND_STEPS = [
    *FIRST_STEPS[:2],
    _step(
        "a-clicked",
        "ann",
        "welcome_series",
        "inst-a",
        "clicked",
        "wait_for",
        "pause",
        1,
        DUE_CLICKED,
        T1,
    ),  # fmt: skip
    _step("a-done", "ann", "welcome_series", "inst-a", "done", "exit", "clicked", 1, None, T2),
    *FIRST_STEPS[2:],
    _step("b-check2", "bob", "loop_demo", "inst-b", "check", "wait", "poll", 2, DUE_CHECK2, T2),
]


def test_journey_steps_has_one_row_per_step_entered(world: World) -> None:
    assert world.after_first["steps"] == FIRST_STEPS
    assert world.after_second["steps"] == SECOND_STEPS
    # event_id is the eventId the collector answered each journey_step_entered with.
    events = world.after_second["events"]
    assert sorted(m for _, m, _ in events) == sorted(row[0] for row in SECOND_STEPS)
    assert all(e == world.event_ids[m] and received for e, m, received in events)


def test_the_marts_carry_the_tenant_and_the_customer(world: World) -> None:
    creds = world.server.creds
    tenant = (creds["accountId"], creds["clientId"], creds["brandId"])
    assert world.after_second["keys"] == [(*tenant, True, True, True)]


def test_an_instance_started_in_one_pass_is_active_there(world: World) -> None:
    assert world.after_first["instances"] == [
        ("inst-a", "welcome_series", "ann", "cmd-a", T0, "hello", "pause", T0, "active",
         None, None, 2),
        ("inst-b", "loop_demo", "bob", "cmd-b", T0, "check", "poll", DUE_CHECK1, "active",
         None, None, 2),
    ]  # fmt: skip


def test_an_exit_in_a_later_pass_recomputes_the_instance_from_all_its_events(
    world: World,
) -> None:
    assert world.after_second["instances"] == [
        ("inst-a", "welcome_series", "ann", "cmd-a", T0, "hello", "done", T2, "exited",
         T2, "exit_step", 4),
        ("inst-b", "loop_demo", "bob", "cmd-b", T0, "check", "check", T2, "active",
         None, None, 3),
    ]  # fmt: skip


def test_a_delete_and_an_access_export_select_the_customers_journey_rows(world: World) -> None:
    conn = connect(DataPaths(world.server.data_dir), read_only=True)
    try:
        subject = subjects.resolve(conn, world.server.creds["accountId"], ["ann"])
        sels = {s.name: s for s in subjects.selections(conn, subject)}
        counts = {t: subjects.count(conn, sels[t]) for t in DERIVED if "journey" in t}
    finally:
        conn.close()
    assert counts == {"marts.journey_steps": 4, "marts.journey_instances": 1}
