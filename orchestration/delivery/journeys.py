"""Journeys at run time: who is at which step of which journey, and moving them on.

A journey's definition is a file (mallard/journeys.py reads and checks it); its customers'
state is here, in tables of the outbox's database (`data/outbox.sqlite`), so moving a customer
to a step, queuing that step's send and recording the step's event are one SQLite transaction:
a crash leaves either all of it or none, and the next dispatch redoes what is missing with
the same send ids (the outbox then sends at most once more, as for any send).

- Entering: a planned `start_journey` command makes an instance (its id derives from the
  command's eventId, so a replayed command enters once) at the first step or at
  `stepIdToTrigger`, unless the re-entry policy says no: `never` (the customer was in this
  journey before), `after_exit` (an instance of it is active), `always` (every start enters).
  Journey data is the command's root keys plus its properties other than the trigger keys,
  which assets see as root keys of their merge data.
- Moving: `send` queues the asset's send (the dispatcher's guards and rendering: a skipped or
  failed send is recorded as for any command) and goes on; `wait` is due after its duration;
  `wait_for` goes on when the customer's event (with its `where`) is in the warehouse, received
  after the step was entered, or takes `on_timeout` when its timeout is due; `branch` takes the
  first case whose condition holds on the customer's current traits, preferences and events
  since entry, else `else`; `exit` and a step without a next end the instance. An instance
  whose journey has `exit_on` ends when the customer's exit_on event arrives after entry.
- Events: `journey_started`, `journey_step_entered` and `journey_exited` (with a reason) are
  rows of `journey_events` in the same transaction; the dispatcher records them as it records
  send outcomes, with messageIds derived from their keys (recorded twice, stored once).
- Clocks: waits and timeouts are due by mallard/clock.py's clock (injectable: MALLARD_NOW);
  "since entry" compares the events' real receivedAt with the real time of the entry.

A customer a regulation suppressed or deleted leaves every journey at the next move, with no
event recorded about them.
"""

from __future__ import annotations

import hashlib
import logging
import sqlite3
import time
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from mallard import clock, jsontext

if TYPE_CHECKING:
    from mallard.journeys import Journey, Step
    from orchestration.delivery.dispatch import Command, Facts, Lake, Regulated
    from orchestration.delivery.outbox import Outbox

log = logging.getLogger(__name__)

ACTIVE, EXITED = "active", "exited"
# Steps one instance may enter in one move: a definition without a wait in a loop is refused by
# `mallard journeys check`; this bounds one that slipped through.
MAX_STEPS_PER_MOVE = 100
# The journey-data keys of a start_journey's properties that are not data.
TRIGGER_KEYS = ("journeyIdToTrigger", "stepIdToTrigger")

SCHEMA = """
create table if not exists journey_instances (
    instance_id text primary key,
    journey_id text not null,
    account_id text not null,
    client_id text not null,
    brand_id text not null,
    customer_id text not null,
    user_id text,
    anonymous_id text,
    command_event_id text not null,
    data text not null,
    step_id text not null,
    visits text not null,
    step_entered_at real not null,
    step_entered_real real not null,
    due_at real,
    status text not null,
    exit_reason text,
    started_at real not null,
    started_real real not null,
    exited_at real
);
create index if not exists journey_due on journey_instances (status, due_at);
create index if not exists journey_customer
    on journey_instances (account_id, journey_id, customer_id);
create table if not exists journey_events (
    event_key text primary key,
    instance_id text not null,
    event text not null,
    properties text not null,
    at real not null,
    recorded integer not null default 0
);
create index if not exists journey_events_unrecorded on journey_events (recorded);
"""

_COLUMNS = (
    "instance_id, journey_id, account_id, client_id, brand_id, customer_id, user_id,"
    " anonymous_id, command_event_id, data, step_id, visits, step_entered_at,"
    " step_entered_real, due_at, status, exit_reason, started_at, started_real, exited_at"
)


@dataclass
class Instance:
    instance_id: str
    journey_id: str
    account_id: str
    client_id: str
    brand_id: str
    customer_id: str
    user_id: str | None
    anonymous_id: str | None
    command_event_id: str
    data: dict[str, Any]
    step_id: str
    visits: dict[str, int]
    step_entered_at: float
    step_entered_real: float
    due_at: float | None
    status: str
    exit_reason: str | None
    started_at: float
    started_real: float
    exited_at: float | None

    @classmethod
    def from_row(cls, row: tuple[Any, ...]) -> Instance:
        values = list(row)
        values[9] = jsontext.loads(values[9])
        values[11] = jsontext.loads(values[11])
        return cls(*values)

    def row(self) -> tuple[Any, ...]:
        return (
            self.instance_id,
            self.journey_id,
            self.account_id,
            self.client_id,
            self.brand_id,
            self.customer_id,
            self.user_id,
            self.anonymous_id,
            self.command_event_id,
            jsontext.dumps(self.data, sort_keys=True),
            self.step_id,
            jsontext.dumps(self.visits, sort_keys=True),
            self.step_entered_at,
            self.step_entered_real,
            self.due_at,
            self.status,
            self.exit_reason,
            self.started_at,
            self.started_real,
            self.exited_at,
        )


def ensure_schema(conn: sqlite3.Connection) -> None:
    conn.executescript(SCHEMA)


def instance_id(command_event_id: str, journey_id: str) -> str:
    return hashlib.sha256(f"{command_event_id}\x1f{journey_id}".encode()).hexdigest()[:32]


@dataclass
class Seen:
    """The events of the customers in question, from the warehouse, for wait_for, exit_on and
    `events.*` conditions: (event name lower-cased, properties, receivedAt epoch) by customer."""

    events: dict[str, list[tuple[str, dict[str, Any], float]]] = field(default_factory=dict)

    def matching(self, customer_id: str, event: str, since: float, where: Any = None) -> bool:
        name = event.lower()
        for n, props, at in self.events.get(customer_id, ()):
            if (
                n == name
                and at >= since
                and (where is None or where.evaluate({"properties": props}))
            ):
                return True
        return False

    def counts(self, customer_id: str, since: float) -> dict[str, int]:
        out: dict[str, int] = {}
        for n, _, at in self.events.get(customer_id, ()):
            if at >= since:
                out[n] = out.get(n, 0) + 1
        return out


def read_seen(lake: Lake, customer_ids: list[str], since: float) -> Seen:
    """The customers' events received since `since` (epoch seconds), from the warehouse."""
    seen = Seen()
    if not customer_ids or not lake.has("intermediate", "int_messages_identified"):
        return seen
    from mallard.warehouse import STRINGS, strings

    rows = lake.conn.execute(
        "select customer_id, lower(event_name), properties, epoch(received_at)"
        " from lake.intermediate.int_messages_identified"
        f" where customer_id in (select unnest({STRINGS})) and received_at >= to_timestamp(?)"
        " and event_name is not null",
        [strings(sorted(set(customer_ids))), since],
    ).fetchall()
    for cid, name, props, at in rows:
        seen.events.setdefault(cid, []).append(
            (name, jsontext.loads(props) if props else {}, float(at))
        )
    return seen


class Mover:
    """Moves instances inside one outbox transaction (`conn`); see the module docstring."""

    def __init__(
        self,
        conn: sqlite3.Connection,
        outbox: Outbox,
        journeys: Mapping[str, Journey],
        assets: Mapping[str, Any],
        plan_send: Any,
        facts: Facts,
        seen: Seen,
        regulated: Regulated,
        now: float,
    ) -> None:
        self.conn = conn
        self.outbox = outbox
        self.journeys = journeys
        self.assets = assets
        self.plan_send = plan_send  # (Command, Facts) -> send rows, the dispatcher's guards
        self.facts = facts
        self.seen = seen
        self.regulated = regulated
        self.now = now
        self.real = time.time()
        self.entered = 0
        self.moved = 0
        self.exited = 0
        self._order: dict[str, int] = {}  # instance id -> events recorded in this move
        self._events: list[tuple[Any, ...]] = []  # journey_events rows to insert (flush)
        self._saves: dict[str, tuple[Any, ...]] = {}  # instance id -> its update (flush)
        self._sends: list[tuple[Any, ...]] = []  # rows of the sends table (flush)

    # --- entering ---------------------------------------------------------------------------

    def enter(self, cmd: Command) -> Instance | None:
        props = cmd.merge_data.get("properties")
        props = props if isinstance(props, dict) else {}
        journey_id = props.get("journeyIdToTrigger")
        journey = self.journeys.get(journey_id) if isinstance(journey_id, str) else None
        if journey is None:
            log.warning("start_journey %s: journey %r is not loaded", cmd.event_id, journey_id)
            return None
        if self.regulated.excludes(cmd.account_id, cmd.user_id):
            return None
        entry = props.get("stepIdToTrigger") or journey.first
        if entry not in journey.steps:
            log.warning("start_journey %s: no step %r in %s", cmd.event_id, entry, journey_id)
            return None
        iid = instance_id(cmd.event_id, journey.journey_id)
        before = [
            # An instance moved in this transaction has its state here, not yet in its row.
            self._saves[r[0]][5] if r[0] in self._saves else r[1]
            for r in self.conn.execute(
                "select instance_id, status from journey_instances where account_id = ?"
                " and journey_id = ? and customer_id = ? and instance_id != ?",
                (cmd.account_id, journey.journey_id, cmd.customer_id, iid),
            )
        ]
        if journey.reentry == "never" and before:
            return None
        if journey.reentry == "after_exit" and ACTIVE in before:
            return None
        data = dict(cmd.merge_data)
        for k, v in props.items():
            if k not in TRIGGER_KEYS:
                data.setdefault(k, v)
        inst = Instance(
            iid,
            journey.journey_id,
            cmd.account_id,
            cmd.client_id,
            cmd.brand_id,
            cmd.customer_id,
            cmd.user_id,
            cmd.merge_data.get("anonymousId"),
            cmd.event_id,
            data,
            entry,
            {},
            self.now,
            self.real,
            None,
            ACTIVE,
            None,
            self.now,
            self.real,
            None,
        )
        cur = self.conn.execute(
            f"insert or ignore into journey_instances ({_COLUMNS}) values ({', '.join('?' * 20)})",
            inst.row(),
        )
        if cur.rowcount == 0:  # entered by this command already
            return None
        self.entered += 1
        self._event(
            inst,
            "journey_started",
            {"stepId": entry, "commandEventId": cmd.event_id, "reentry": journey.reentry},
        )
        self._enter_step(inst, journey, entry, previous=None)
        self.move(inst)
        return inst

    # --- moving -----------------------------------------------------------------------------

    def move(self, inst: Instance) -> None:
        """Takes the instance through every step that is due now, then saves it."""
        journey = self.journeys.get(inst.journey_id)
        if journey is None:
            self._exit(inst, "journey_removed", record=True)
        elif self.regulated.excludes(inst.account_id, inst.user_id):
            self._exit(inst, "customer_regulated", record=False)
        elif journey.exit_on and self.seen.matching(
            inst.customer_id, journey.exit_on, inst.started_real
        ):
            self._exit(inst, "exit_on", record=True)
        else:
            for _ in range(MAX_STEPS_PER_MOVE):
                if inst.status != ACTIVE or not self._step(inst, journey):
                    break
            else:
                log.error(
                    "journey %s instance %s: too many steps in one move",
                    inst.journey_id,
                    inst.instance_id,
                )
        self._save(inst)

    def _step(self, inst: Instance, journey: Journey) -> bool:
        """Does the current step's work if it is due; whether the instance moved on."""
        step = journey.step(inst.step_id)
        if step.type == "send":
            self._send(inst, step)
            return self._goto(inst, journey, step.next)
        if step.type == "wait":
            if inst.due_at is not None and self.now < inst.due_at:
                return False
            return self._goto(inst, journey, step.next)
        if step.type == "wait_for":
            assert step.event is not None
            if self.seen.matching(inst.customer_id, step.event, inst.step_entered_real, step.where):
                return self._goto(inst, journey, step.next)
            if inst.due_at is not None and self.now >= inst.due_at:
                if step.on_timeout is None:
                    self._exit(inst, "timeout", record=True)
                    return False
                return self._goto(inst, journey, step.on_timeout)
            return False
        if step.type == "branch":
            ctx = self._context(inst)
            for condition, target in step.cases:
                if condition.evaluate(ctx):
                    return self._goto(inst, journey, target)
            return self._goto(inst, journey, step.else_)
        self._exit(inst, "exit_step", record=True)  # exit
        return False

    def _context(self, inst: Instance) -> dict[str, Any]:
        traits, _ = self.facts.customers.get(inst.customer_id, ({}, None))
        prefs: dict[str, Any] = {"channel": {}, "category": {}, "unsubscribeAll": False}
        for (kind, key), value in self.facts.preferences.get(inst.customer_id, {}).items():
            if kind in ("channel", "category"):
                prefs[kind][key] = value
            else:
                prefs[key] = value
        return {
            "traits": traits,
            "preferences": prefs,
            "events": self.seen.counts(inst.customer_id, inst.started_real),
            "properties": {},
        }

    def _goto(self, inst: Instance, journey: Journey, target: str | None) -> bool:
        if target is None:
            self._exit(inst, "completed", record=True)
            return False
        self._enter_step(inst, journey, target, previous=inst.step_id)
        return True

    def _enter_step(
        self, inst: Instance, journey: Journey, step_id: str, previous: str | None
    ) -> None:
        step = journey.step(step_id)
        inst.step_id = step_id
        inst.visits[step_id] = inst.visits.get(step_id, 0) + 1
        inst.step_entered_at, inst.step_entered_real = self.now, self.real
        inst.due_at = None
        if step.type == "wait":
            inst.due_at = self.now + float(step.duration_s or 0)
        elif step.type == "wait_for":
            inst.due_at = self.now + float(step.timeout_s or 0)
        self.moved += 1
        self._event(
            inst,
            "journey_step_entered",
            {
                "stepId": step_id,
                "stepType": step.type,
                "previousStepId": previous,
                "visit": inst.visits[step_id],
                "dueAt": clock.iso(inst.due_at) if inst.due_at is not None else None,
            },
        )

    def _send(self, inst: Instance, step: Step) -> None:
        from mallard.commands import SEND_COMMAND
        from orchestration.delivery.dispatch import Command

        visit = inst.visits.get(inst.step_id, 1)
        command = SEND_COMMAND.get(self._channel(step), "send_email")
        cmd = Command(
            f"{inst.instance_id}:{inst.step_id}:{visit}",
            "",
            inst.client_id,
            inst.account_id,
            inst.brand_id,
            inst.customer_id,
            inst.user_id,
            command,
            step.asset,
            inst.data,
        )
        rows = self.plan_send(cmd, self.facts)
        for r in rows:
            r["payload"]["journey"] = {
                "journeyId": inst.journey_id,
                "instanceId": inst.instance_id,
                "stepId": inst.step_id,
            }
        from orchestration.delivery.outbox import send_rows

        self._sends += send_rows([(inst.command_event_id, r) for r in rows], self.real)

    def _channel(self, step: Step) -> str:
        """The channel of the step's asset (email for one that does not load: its send fails
        naming the asset)."""
        asset = self.assets.get(step.asset or "")
        return str(getattr(asset, "channel", "email"))

    def _exit(self, inst: Instance, reason: str, record: bool) -> None:
        inst.status, inst.exit_reason, inst.exited_at, inst.due_at = EXITED, reason, self.now, None
        self.exited += 1
        if record:
            self._event(inst, "journey_exited", {"stepId": inst.step_id, "reason": reason})

    def _event(self, inst: Instance, event: str, props: dict[str, Any]) -> None:
        """Records a journey event; the events of one move are 1 ms apart in time, so reads
        in time order show them in the order they happened."""
        seq = sum(inst.visits.values())
        order = self._order.get(inst.instance_id, 0)
        self._order[inst.instance_id] = order + 1
        key = f"{inst.instance_id}:{event}:{seq}:{props.get('stepId')}"
        self._events.append(
            (
                key,
                inst.instance_id,
                event,
                jsontext.dumps(
                    {"journeyId": inst.journey_id, "instanceId": inst.instance_id} | props
                ),
                self.now + order / 1000,
            )
        )

    def flush(self) -> None:
        """Writes the sends, events and instance states the moves made, in the transaction:
        one statement each for the batch (the caller commits)."""
        if self._sends:
            from orchestration.delivery.outbox import insert_send_rows

            insert_send_rows(self.conn, self._sends)
            self._sends.clear()
        if self._events:
            self.conn.executemany(
                "insert or ignore into journey_events"
                " (event_key, instance_id, event, properties, at) values (?, ?, ?, ?, ?)",
                self._events,
            )
            self._events.clear()
        if self._saves:
            self.conn.executemany(
                "update journey_instances set step_id = ?, visits = ?, step_entered_at = ?,"
                " step_entered_real = ?, due_at = ?, status = ?, exit_reason = ?, exited_at = ?"
                " where instance_id = ?",
                list(self._saves.values()),
            )
            self._saves.clear()

    def _save(self, inst: Instance) -> None:
        self._saves[inst.instance_id] = (
            inst.step_id,
            jsontext.dumps(inst.visits, sort_keys=True),
            inst.step_entered_at,
            inst.step_entered_real,
            inst.due_at,
            inst.status,
            inst.exit_reason,
            inst.exited_at,
            inst.instance_id,
        )


def sends_push(journey: Journey | None, assets: Mapping[str, Any]) -> bool:
    """Whether a step of the journey sends a push (its customers' device tokens are read)."""
    return journey is not None and any(
        getattr(assets.get(s.asset or ""), "channel", None) == "push"
        for s in journey.steps.values()
        if s.type == "send"
    )


def watches_events(journey: Journey | None) -> bool:
    """Whether moving the journey's customers needs their events: an exit_on, a wait_for, or
    a branch on `events.*` (None: a journey no longer defined, which ends without them)."""
    return journey is not None and (
        journey.exit_on is not None
        or any(
            s.type == "wait_for" or any("events" in c.paths() for c, _ in s.cases)
            for s in journey.steps.values()
        )
    )


# --- reading the state ----------------------------------------------------------------------


def to_move(
    conn: sqlite3.Connection,
    now: float,
    journeys: Mapping[str, Journey],
    broken: Collection[str] = (),
) -> list[str]:
    """Ids of the active instances that may move now: a wait or timeout due, any at a wait_for
    (its event may have come), every instance of a journey with exit_on or no longer defined
    (a journey whose file does not load now is left as it is)."""
    waiting = [
        (j.journey_id, s.id)
        for j in journeys.values()
        for s in j.steps.values()
        if s.type == "wait_for"
    ]
    whole = [j.journey_id for j in journeys.values() if j.exit_on]
    clauses: list[str] = ["due_at <= ?"]
    params: list[Any] = [now]
    if waiting:
        clauses.append(f"(journey_id, step_id) in (values {', '.join(['(?, ?)'] * len(waiting))})")
        params += [v for pair in waiting for v in pair]
    if whole:
        clauses.append(f"journey_id in ({', '.join('?' * len(whole))})")
        params += whole
    known = [*journeys, *broken]
    clauses.append(f"journey_id not in ({', '.join('?' * len(known))})" if known else "1")
    params += known
    skip = f" and journey_id not in ({', '.join('?' * len(broken))})" if broken else ""
    rows = conn.execute(
        f"select instance_id from journey_instances where status = 'active'"
        f" and ({' or '.join(clauses)}){skip} order by started_at, instance_id",
        [*params, *broken],
    ).fetchall()
    return [r[0] for r in rows]


def load(conn: sqlite3.Connection, ids: list[str]) -> list[Instance]:
    """The active instances among `ids`, as they are now (another dispatcher may have moved
    some since they were picked; read again inside the moving transaction, `states` says
    whether it did)."""
    out: list[Instance] = []
    for i in range(0, len(ids), 500):
        chunk = ids[i : i + 500]
        # `+status`: look the ids up by the primary key; on the status index SQLite reads every
        # active instance for each chunk (100k active: 110 ms a chunk of 500 against 7 ms).
        out += [
            Instance.from_row(r)
            for r in conn.execute(
                f"select {_COLUMNS} from journey_instances where +status = 'active'"
                f" and instance_id in ({', '.join('?' * len(chunk))})"
                " order by started_at, instance_id",
                chunk,
            )
        ]
    return out


def state(inst: Instance) -> tuple[str, str, dict[str, int], float]:
    """What a move changes in every instance it moves on: status, step, visits (they only grow)
    and when the step was entered; equal states mean no move happened in between."""
    return (inst.status, inst.step_id, dict(inst.visits), inst.step_entered_at)


def states(
    conn: sqlite3.Connection, ids: list[str]
) -> dict[str, tuple[str, str, dict[str, int], float]]:
    """`state` of the instances among `ids` that are active now."""
    out: dict[str, tuple[str, str, dict[str, int], float]] = {}
    for i in range(0, len(ids), 500):
        chunk = ids[i : i + 500]
        for iid, status, step_id, visits, entered in conn.execute(
            "select instance_id, status, step_id, visits, step_entered_at from journey_instances"
            f" where +status = 'active' and instance_id in ({', '.join('?' * len(chunk))})",
            chunk,
        ):
            out[iid] = (status, step_id, jsontext.loads(visits), entered)
    return out


def due_at(conn: sqlite3.Connection) -> float | None:
    """When the next wait or timeout is due (None: nothing waits)."""
    row = conn.execute(
        "select min(due_at) from journey_instances where status = 'active'"
    ).fetchone()
    return None if row is None or row[0] is None else float(row[0])


def unrecorded(conn: sqlite3.Connection, limit: int = 10_000) -> list[tuple[Any, ...]]:
    """Journey events not recorded yet, with their instance's tenant and customer, in the
    order they were written. By rowid, the order of the `recorded` index: SQLite reads the
    first `limit` and stops (ordered by time it sorted every unrecorded event for each call,
    5.2 s a call with 500,000 waiting against 0.4 s)."""
    return conn.execute(
        "select e.event_key, e.event, e.properties, e.at, i.client_id, i.account_id,"
        " i.brand_id, i.user_id, i.anonymous_id, i.command_event_id, e.rowid"
        " from journey_events e join journey_instances i using (instance_id)"
        " where e.recorded = 0 order by e.rowid limit ?",
        (limit,),
    ).fetchall()


def mark_recorded(conn: sqlite3.Connection, rows: list[tuple[Any, ...]]) -> None:
    """Marks `unrecorded`'s rows recorded, by rowid (their last column): no lookup of the
    text key for each of them."""
    conn.executemany(
        "update journey_events set recorded = 1 where rowid = ?", [(r[-1],) for r in rows]
    )


# --- dry run --------------------------------------------------------------------------------


def dry_run(
    paths: Any,
    journey: Journey,
    user_id: str,
    account_id: str | None = None,
    step_id: str | None = None,
    happens: Collection[str] = (),
) -> list[str]:
    """The path a customer would take now, one line per step, changing nothing: sends go
    through the dispatcher's guards with the customer's current traits and preferences (and
    are not sent), waits are passed over, a wait_for's event is taken as happening when named
    in `happens` (else it times out), and branches are decided on current data with each
    event in `happens` counted once. LookupError when the userId names no one customer."""
    from mallard.commands import SEND_COMMAND
    from orchestration.delivery.dispatch import Command, Lake, Planning, outbox_path
    from orchestration.delivery.outbox import Outbox

    lake = Lake(paths)
    outbox = Outbox(outbox_path(paths))
    planning = Planning.load(paths, "")
    try:
        where = "user_id = ?" + (" and account_id = ?" if account_id else "")
        found = lake.conn.execute(
            "select customer_id, client_id, account_id from lake.marts.customers"
            f" where {where} order by account_id limit 2",
            [user_id, *([account_id] if account_id else [])],
        ).fetchall()
        if not found:
            raise LookupError(
                f"no customer with userId {user_id!r}" + (" in that account" if account_id else "")
            )
        if len(found) > 1:
            raise LookupError(f"userId {user_id!r} is in several accounts: name one with --account")
        customer_id, client_id, account = found[0]
        facts = lake.facts([customer_id], [customer_id])
        seen = Seen({customer_id: [(e.lower(), {}, 0.0) for e in happens]})
        mover = planning.mover(None, outbox, facts, seen)
        inst = Instance(
            "dry-run",
            journey.journey_id,
            account,
            client_id,
            "",
            customer_id,
            user_id,
            None,
            "dry-run",
            {},
            "",
            {},
            0.0,
            0.0,
            None,
            ACTIVE,
            None,
            0.0,
            0.0,
            None,
        )
        ctx = mover._context(inst)
        lines: list[str] = []
        current: str | None = step_id or journey.first
        visits: dict[str, int] = {}
        while current is not None and len(lines) < MAX_STEPS_PER_MOVE:
            step = journey.step(current)
            visits[current] = visits.get(current, 0) + 1
            head = f"{current} ({step.type})"
            if step.type == "send":
                channel = str(getattr(planning.assets.get(step.asset or ""), "channel", "email"))
                command = SEND_COMMAND.get(channel, "send_email")
                cmd = Command(
                    f"dry-run:{current}",
                    "",
                    client_id,
                    account,
                    "",
                    customer_id,
                    user_id,
                    command,
                    step.asset,
                    {},
                )
                rows = planning.plan_send_rows(cmd, facts, outbox)
                outcome = (
                    ", ".join(
                        f"would send to {r['recipient']}"
                        if r["status"] == "pending"
                        else f"{r['status']}: {r['reason']}"
                        + (f" ({r['recipient']})" if r.get("recipient") else "")
                        for r in rows
                    )
                    or "nothing (the customer is regulated)"
                )
                lines.append(f"{head}: {step.asset}: {outcome}")
                current = step.next
            elif step.type == "wait":
                lines.append(f"{head}: {clock_text(step.duration_s)}")
                current = step.next
            elif step.type == "wait_for":
                assert step.event is not None
                if step.event.lower() in {e.lower() for e in happens}:
                    lines.append(f"{head}: {step.event} happens")
                    current = step.next
                else:
                    lines.append(
                        f"{head}: no {step.event} within {clock_text(step.timeout_s)}: times out"
                    )
                    current = step.on_timeout
            elif step.type == "branch":
                target, why = step.else_, "else"
                for condition, goto in step.cases:
                    if condition.evaluate(ctx):
                        target, why = goto, f"`{condition.text}` holds"
                        break
                lines.append(f"{head}: {why} -> {target or 'end'}")
                current = target
            else:
                lines.append(f"{head}: leaves the journey")
                current = None
        if current is not None:
            lines.append(f"... stops after {MAX_STEPS_PER_MOVE} steps (a loop)")
        elif lines and not lines[-1].endswith("leaves the journey"):
            lines.append("end: leaves the journey (completed)")
        return lines
    finally:
        planning.close()
        outbox.close()
        lake.close()


def clock_text(seconds: float | None) -> str:
    s = int(seconds or 0)
    for unit, size in (("w", 604800), ("d", 86400), ("h", 3600), ("m", 60)):
        if s >= size and s % size == 0:
            return f"{s // size}{unit}"
    return f"{s}s"
