"""Marts over generated streams: slices equal a full rebuild; traits equal an oracle.

Each of N_STREAMS seeded random streams lives in its own account, so all of them share one lake
and one pipeline run per slice. A stream mixes what real traffic does to the rules: arrival
order unlike event order, SDK retries (same messageId) landing later, events days late, client
clocks off by hours (corrected through sentAt), server batches sharing one receipt time, visitors
identified later (sometimes by a second userId too), nested object and array traits,
firstName/lastName without name, context.campaign on some messages, messageIds that repeat
across accounts, and the events the other marts are made of: send outcomes, journey steps,
preference changes by the preferences endpoint and by identify.

The messages are stamped by the collector's own code and landed as the roller lands them; the
pipeline is the real `mallard pipeline run` (Dagster load + dbt build, unit tests included).
Every pass after the first is incremental (the models take only the messages loaded since the
last finished pass), and folds them into the stored per-customer state. Two passes die before
they finish: one after attribution, one after the customers mart (every per-customer state
already folded once); the next pass must recover from each. The last slice is taken as the
watcher takes files that keep landing: a served pass, then a full one. Then the lake takes the
last window again and one that overlaps it (test_exactly_once): the marts stay those of one
full build.
The oracle below implements the identity, trait and time rules directly from the client messages
and their receipt times, independently of the SQL models.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import shutil
import subprocess
import sys
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from api.params import EventQuery
from api.service import Warehouse
from collector.messages import Tenant, stamp
from collector.roller import records_to_tables
from mallard.harness import close_passes, init_data_dir, pipeline_pass
from mallard.paths import DataPaths
from mallard.warehouse import connect
from orchestration.context import DBT_DIR
from orchestration.environment import dbt_env
from orchestration.load import load_new_files
from orchestration.maintenance import compact_fragmented
from orchestration.window import current_window, open_pass

N_STREAMS = 24
N_SLICES = 4
# Slice -> the models a pass preceding that slice's pass builds before it dies.
INTERRUPTED = {
    1: "+customers",  # every per-customer state folded, the events and the freshness row not
    2: "int_messages_deduped int_identity_map int_messages_identified",  # attribution only
}
# MALLARD_TEST_SEED explores other streams; a failure names the seed it ran with.
SEED = int(os.environ.get("MALLARD_TEST_SEED", "20240301"))
CLIENT = "demo"
# Track names and the action each must get, plus the other message kinds.
ACTIONS = {
    "Logged In": "logged_in",
    "email opened": "email_opened",
    "OrderCompleted": "order_completed",
    "Order Completed": "order_completed",
    "Signed Up": "signed_up",
}
# Tracks the other marts are made of, named as their actions: send outcomes (deliveries),
# journey events (journey_steps, journey_instances) and the preferences endpoint's updates.
MODEL_EVENTS = (
    "email_sent",
    "email_opened",
    "sms_failed",
    "journey_started",
    "journey_step_entered",
    "journey_exited",
    "preferences_updated",
)
TRACK_ACTIONS = ACTIONS | {name: name for name in MODEL_EVENTS}
# The groups of each account; every stream's group calls name some of them.
GROUPS: tuple[str | int, ...] = ("g-acme", "g-initech", 42)  # a groupId may be a number
# Added by the mart, not 2.5; an identify's marketingPreferences is replaced by the preferences.
SERVED_EXTRA_TRAITS = ("id", "externalId", "marketingPreferences")

pytestmark = pytest.mark.integration


# ---------------------------------------------------------------- generation


@dataclass
class Arrival:
    """One message as a client sent it, and when the collector received it."""

    kind: str
    msg: dict[str, Any]
    received: datetime
    channel: str = "server"
    source: str = "http"
    stored: dict[str, Any] = field(default_factory=dict)

    @property
    def account(self) -> str:
        return str(self.stored["accountId"])


def _iso(t: datetime) -> str:
    return t.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _ms(rng: random.Random, lo_s: float, hi_s: float) -> timedelta:
    return timedelta(milliseconds=rng.randint(int(lo_s * 1000), int(hi_s * 1000)))


def _traits(rng: random.Random, n: int) -> dict[str, Any]:
    t: dict[str, Any] = {}
    if rng.random() < 0.6:
        t["plan"] = rng.choice(["free", "pro", "team", None])
    if rng.random() < 0.4:
        t["age"] = rng.randint(18, 90)
    if rng.random() < 0.5:
        keys = rng.sample(["city", "country", "postalCode", "street"], rng.randint(1, 3))
        t["address"] = {k: f"{k}-{rng.randint(1, 5)}" for k in keys}
    if rng.random() < 0.4:
        t["tags"] = rng.sample(["a", "b", "c", "d"], rng.randint(0, 3))
    if rng.random() < 0.5:
        t["firstName"] = rng.choice(["Ann", "Bo", "Cy", "Di"])
    if rng.random() < 0.5:
        t["lastName"] = rng.choice(["Lee", "Moe", "Ng"])
    if rng.random() < 0.15:
        t["name"] = rng.choice(["Given Name", None])
    if rng.random() < 0.4:
        t["email"] = f"user{n}-{rng.randint(1, 3)}@example.com"
    if rng.random() < 0.2:
        t["favorite color"] = rng.choice(["red", "blue"])
    if rng.random() < 0.1:
        t["a.b"] = {"nested": [1, {"x": rng.randint(1, 3)}]}
    if rng.random() < 0.05:
        t["campaign"] = {"name": "set-by-identify"}
    if rng.random() < 0.15:  # a preference change by identify (int_preference_changes)
        t["marketingPreferences"] = {
            "channels": [{"channel": "email", "subscribed": rng.random() < 0.5}],
            "unsubscribeAll": rng.random() < 0.2,
        }
    return t or {"plan": "free"}


def _campaign(rng: random.Random, p: float) -> dict[str, Any]:
    if rng.random() >= p:
        return {}
    return {
        "campaign": {
            "name": rng.choice(["spring", "summer", "retarget"]),
            "source": rng.choice(["google", "newsletter"]),
            "medium": "cpc",
        }
    }


def generate_stream(index: int) -> list[Arrival]:
    rng = random.Random(SEED + index)
    t0 = datetime(2024, 3, 1, tzinfo=UTC) + timedelta(hours=index)
    window_s = 7 * 24 * 3600
    # (kind, message without times, true event time)
    planned: list[tuple[str, dict[str, Any], datetime]] = []
    identify_times: list[datetime] = []

    def at() -> datetime:
        if identify_times and rng.random() < 0.15:
            return rng.choice(identify_times)  # an exact tie on event time
        return t0 + _ms(rng, 0, window_s)

    def event(who: dict[str, str], campaign_p: float) -> None:
        kind = rng.choice(["track", "track", "page", "screen"])
        msg: dict[str, Any] = dict(who)
        if kind == "track":
            msg["event"] = rng.choice(list(ACTIONS))
            msg["properties"] = {"n": rng.randint(1, 9)}
            if msg["event"] == "email opened":
                msg["properties"]["sendType"] = "email"
            if ACTIONS[msg["event"]] == "order_completed":  # read by the guide's example model
                msg["properties"]["revenue"] = f"{msg['properties']['n'] * 9.99:.2f}"
        elif kind == "page":
            msg["event"] = "page"
            msg["name"] = rng.choice(["Home", "Pricing"])
        else:
            msg["name"] = "Main"
        msg["context"] = _campaign(rng, campaign_p)
        planned.append((kind, msg, t0 + _ms(rng, 0, window_s)))

    def identify(who: dict[str, Any], n: int) -> None:
        t = at()
        identify_times.append(t)
        msg = {**who, "event": "identify", "traits": _traits(rng, n), "context": {}}
        msg["context"] = _campaign(rng, 0.2)
        planned.append(("identify", msg, t))

    def alias(user: str, previous: str) -> None:
        msg: dict[str, Any] = {"userId": user, "previousId": previous}
        if rng.random() < 0.3:  # the tag sends the visitor's anonymousId along
            msg["anonymousId"] = previous
        planned.append(("alias", msg, at()))

    def group(who: dict[str, str]) -> None:
        traits: dict[str, Any] = {}
        if rng.random() < 0.7:
            traits["plan"] = rng.choice(["basic", "pro", "enterprise"])
        if rng.random() < 0.5:
            traits["seats"] = rng.randint(1, 50)
        if rng.random() < 0.3:
            keys = rng.sample(["city", "country"], rng.randint(1, 2))
            traits["address"] = {k: f"{k}-{rng.randint(1, 3)}" for k in keys}
        msg: dict[str, Any] = {**who, "groupId": rng.choice(GROUPS), "context": {}}
        if traits or rng.random() < 0.5:  # a group call may carry no traits at all
            msg["traits"] = traits
        planned.append(("group", msg, at()))

    forced_late: dict[int, timedelta] = {}
    users = [f"u{k}" for k in range(rng.randint(2, 4))]
    for n, user in enumerate(users):
        for _ in range(rng.randint(2, 5)):
            identify({"userId": user}, n)
        for _ in range(rng.randint(2, 6)):
            event({"userId": user}, 0.3)
        for _ in range(rng.randint(0, 3)):
            group({"userId": user})
    for k in range(rng.randint(3, 6)):
        anon = f"anon-{k}"
        for _ in range(rng.randint(1, 4)):
            event({"anonymousId": anon}, 0.4)
        if rng.random() < 0.2:
            identify({"anonymousId": anon}, 100 + k)  # an anonymous identify carries traits too
        if rng.random() < 0.3:
            group({"anonymousId": anon})  # a visitor's group call: the customer's once identified
        if rng.random() < 0.65:
            owner = rng.randrange(len(users))
            identify({"userId": users[owner], "anonymousId": anon}, owner)
            if rng.random() < 0.3:  # identified again by someone else: must not merge
                other = (owner + 1) % len(users)
                identify({"userId": users[other], "anonymousId": anon}, other)
            if rng.random() < 0.25:  # aliased too: the earlier by event time wins the visitor
                alias(users[(owner + 1) % len(users)], anon)
            if rng.random() < 0.5:
                event({"userId": users[owner], "anonymousId": anon}, 0.2)
        elif rng.random() < 0.6:  # an alias alone links the visitor, as an identify would
            alias(rng.choice(users), anon)
    # An alias whose previousId is a userId already: two users, which stay apart.
    if rng.random() < 0.6:
        alias(users[0], users[1])
    # An alias whose previousId never sent a message of its own.
    if rng.random() < 0.5:
        alias(users[-1], f"pre-{index}")
    # A visitor linked by alias whose id later turns up as a userId (received days later, so in
    # a later slice): the link is undone, and its events are a visitor's again.
    if rng.random() < 0.6:
        turned = f"turned-{index}"
        for _ in range(rng.randint(1, 3)):
            event({"anonymousId": turned}, 0.3)
        alias(users[0], turned)
        forced_late[len(planned)] = timedelta(days=4)
        event({"userId": turned}, 0.0)

    # The events of the other marts: send outcomes, a journey instance entering steps (and
    # sometimes exiting), and updates by the preferences endpoint (source `preferences`).
    from_preferences: set[int] = set()
    for n, user in enumerate(users):
        who: dict[str, Any] = {"userId": user, "context": {}}
        for k in range(rng.randint(0, 2)):
            props: dict[str, Any] = {"sendId": f"send-{n}-{k}", "assetId": "welcome"}
            name = rng.choice(MODEL_EVENTS[:3])
            planned.append(("track", {**who, "event": name, "properties": props}, at()))
        if rng.random() < 0.6:
            start = t0 + _ms(rng, 0, window_s)
            steps = [("journey_started", "s1"), ("journey_step_entered", "s1")]
            steps += [("journey_step_entered", "s2"), ("journey_exited", "s2")][: rng.randint(1, 2)]
            for name, step in steps:
                props = {"journeyId": "onboarding", "instanceId": f"{user}-j", "stepId": step}
                if name == "journey_step_entered":
                    props |= {"visit": 1, "stepType": "wait"}
                elif name == "journey_exited":
                    props["reason"] = "completed"
                planned.append(("track", {**who, "event": name, "properties": props}, start))
                start += _ms(rng, 1, 3600)
        for _ in range(rng.randint(0, 2)):
            channels = rng.sample(["email", "sms", "push"], rng.randint(1, 2))
            props = {
                "channels": [{"channel": c, "subscribed": rng.random() < 0.5} for c in channels],
                "categories": [{"category": "news", "subscribed": rng.random() < 0.5}],
            }
            if rng.random() < 0.3:
                props["unsubscribeAll"] = rng.random() < 0.5
            from_preferences.add(len(planned))
            update = {**who, "event": "preferences_updated", "properties": props}
            planned.append(("track", update, at()))

    arrivals: list[Arrival] = []
    for seq, (kind, msg, t) in enumerate(planned):
        # messageIds repeat across accounts on purpose: dedup is per account.
        msg = {**msg, "messageId": f"m{seq:04d}"}
        late = rng.random() < 0.12
        received = t + (_ms(rng, 86400, 3 * 86400) if late else _ms(rng, 0.05, 5))
        if seq in forced_late:
            received = max(received, t0 + timedelta(seconds=window_s) + forced_late[seq])
        mode = rng.random()
        if mode < 0.1:
            pass  # no timestamp: the event time is the receipt time
        elif mode < 0.3:
            skew = rng.choice([timedelta(hours=-3), timedelta(hours=2), timedelta(seconds=37)])
            sent = received - _ms(rng, 0.001, 0.2)
            msg["timestamp"] = _iso(t + skew)
            msg["sentAt"] = _iso(sent + skew)
        else:
            msg["timestamp"] = _iso(t)
        channel = rng.choice(["server", "browser", "mobile"])
        source = "preferences" if seq in from_preferences else "http"
        arrivals.append(Arrival(kind, msg, received, channel, source))
    # Server batches: several messages stamped with one receipt time.
    for a in rng.sample(arrivals, len(arrivals) // 8):
        a.received = rng.choice(arrivals).received
    # SDK retries: the same body again, received later (sometimes in a later slice).
    for a in rng.sample(arrivals, len(arrivals) // 8):
        for _ in range(rng.randint(1, 2)):
            again = a.received + _ms(rng, 1, 2 * 86400)
            arrivals.append(Arrival(a.kind, a.msg, again, a.channel, a.source))
    tenant = Tenant(CLIENT, f"s{index:02d}", f"S{index:02d}")
    for a in arrivals:
        a.stored = stamp(
            a.kind,
            a.msg,
            tenant,
            channel=a.channel,
            source=a.source,
            received=a.received,
            request_ip=None,
        )
    return arrivals


def land(data_dir: Path, arrivals: list[Arrival], seq: int) -> None:
    """Write these stored messages as the roller writes landing files."""
    records = [json.dumps(a.stored).encode() for a in arrivals]
    paths = DataPaths(data_dir)
    for day, table in records_to_tables(records).items():
        target = paths.landing_partition(day) / f"gen-{seq:016d}.parquet"
        target.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(table, target, compression="zstd")


# ---------------------------------------------------------------- the oracle


def _parse(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def event_time(a: Arrival) -> datetime:
    """No timestamp means receipt; with sentAt, received - (sentAt - timestamp)."""
    if "timestamp" not in a.msg:
        return a.received
    ts = _parse(a.msg["timestamp"])
    if "sentAt" in a.msg:
        return a.received - (_parse(a.msg["sentAt"]) - ts)
    return ts


def customer_key(account: str, key: str) -> str:
    return hashlib.md5(f"{account}|{key}".encode()).hexdigest()


@dataclass
class Expected:
    events: dict[str, tuple[str, str | None, str]]  # eventId -> (customer id, userId, action)
    traits: dict[str, dict[str, Any]]  # customer id -> traits (2.5)
    first_last: dict[str, tuple[dict[str, str], dict[str, str]]]  # per action: eventIds
    duplicates: dict[tuple[str, str], int]  # (account, messageId) -> extra copies
    # (customer id, id type, id value) -> event times of the messages that show it
    identifiers: dict[tuple[str, str, str], list[datetime]]
    # (account, groupId) -> (traits, first seen, last seen, member customer ids)
    groups: dict[tuple[str, str], tuple[dict[str, Any], datetime, datetime, set[str]]]
    # customer id -> the groupId of its latest group call
    current_group: dict[str, str]


def oracle(arrivals: list[Arrival]) -> Expected:
    def order(a: Arrival) -> tuple[datetime, datetime, str]:
        return (event_time(a), a.received, a.msg["messageId"])

    copies: dict[tuple[str, str], list[Arrival]] = defaultdict(list)
    for a in arrivals:
        copies[(a.account, a.msg["messageId"])].append(a)
    kept = [min(c, key=lambda a: (a.received, a.stored["eventId"])) for c in copies.values()]
    duplicates = {k: len(c) - 1 for k, c in copies.items() if len(c) > 1}

    # An anonymousId belongs to the first userId it is seen with; an alias's previousId too, as
    # if identified, unless some message has it as its userId (two userIds never merge).
    users = {(a.account, a.msg["userId"]) for a in kept if "userId" in a.msg}
    owner: dict[tuple[str, str], tuple[tuple[datetime, datetime, str], str]] = {}
    for a in kept:
        linked = [a.msg.get("anonymousId")]
        if a.kind == "alias" and (a.account, a.msg["previousId"]) not in users:
            linked.append(a.msg["previousId"])
        for anon in linked:
            if "userId" not in a.msg or anon is None:
                continue
            k = (a.account, anon)
            if k not in owner or order(a) < owner[k][0]:
                owner[k] = (order(a), a.msg["userId"])

    by_customer: dict[str, list[Arrival]] = defaultdict(list)
    identifiers: dict[tuple[str, str, str], list[datetime]] = defaultdict(list)
    user_of: dict[str, str | None] = {}
    events: dict[str, tuple[str, str | None, str]] = {}
    for a in kept:
        user = a.msg.get("userId") or owner.get((a.account, a.msg["anonymousId"]), (None, None))[1]
        cid = customer_key(a.account, f"user:{user}" if user else f"anon:{a.msg['anonymousId']}")
        action = TRACK_ACTIONS[a.msg["event"]] if a.kind == "track" else a.kind
        events[a.stored["eventId"]] = (cid, user, action)
        by_customer[cid].append(a)
        user_of[cid] = user
        email = a.msg["traits"].get("email") if a.kind == "identify" else None
        for id_type, value in (
            ("userId", user),
            ("anonymousId", a.msg.get("anonymousId")),
            ("email", email if isinstance(email, str) else None),
        ):
            if value is not None:
                identifiers[(cid, id_type, value)].append(event_time(a))

    traits: dict[str, dict[str, Any]] = {}
    first_last: dict[str, tuple[dict[str, str], dict[str, str]]] = {}
    for cid, msgs in by_customer.items():
        msgs.sort(key=order)
        t: dict[str, Any] = {}
        for a in msgs:  # in event order, so the latest value of every key ends up in t
            if a.kind == "identify":
                t.update(a.msg["traits"])
        if t.get("name") is None and (t.get("firstName") or t.get("lastName")):
            t["name"] = " ".join(p for p in (t.get("firstName"), t.get("lastName")) if p)
        first_campaign = msgs[0].msg.get("context", {}).get("campaign")
        if "campaign" not in t and isinstance(first_campaign, dict):
            t["campaign"] = first_campaign
        traits[cid] = t
        first: dict[str, str] = {}
        last: dict[str, str] = {}
        for a in sorted(msgs, key=lambda a: (event_time(a), a.received, a.stored["eventId"])):
            action = events[a.stored["eventId"]][2]
            first.setdefault(action, a.stored["eventId"])
            last[action] = a.stored["eventId"]
        first_last[cid] = (first, last)

    # Groups: per top-level trait key the latest group call by event time wins (2.5's rule).
    groups: dict[tuple[str, str], tuple[dict[str, Any], datetime, datetime, set[str]]] = {}
    current: dict[str, tuple[tuple[datetime, datetime, str], str]] = {}
    for a in sorted((a for a in kept if a.kind == "group"), key=order):
        key = (a.account, str(a.msg["groupId"]))
        cid = events[a.stored["eventId"]][0]
        g_traits, first_seen, _, members = groups.get(key, ({}, event_time(a), None, set()))
        g_traits.update(a.msg.get("traits") or {})
        groups[key] = (g_traits, first_seen, event_time(a), members | {cid})
        current[cid] = (order(a), key[1])
    current_group = {cid: group for cid, (_, group) in current.items()}
    return Expected(events, traits, first_last, duplicates, identifiers, groups, current_group)


# ---------------------------------------------------------------- the marts

MARTS = {
    "events": ("record",),
    "customers": ("traits", "metadata"),
    "customer_profiles": ("traits", "marketing_preferences", "preference_state"),
    # The winners among the candidates passes append (customer_event_objects; compared raw
    # after a fold below).
    "customer_event_winners": ("event_object",),
    "customer_identifiers": (),
    "customer_preferences": ("marketing_preferences", "state"),
    "duplicates": (),
    "deliveries": (),
    "journey_steps": (),
    "journey_instances": (),
    # Empty here: a command makes the dispatcher land outcome events after the pass, which the
    # full build would load and the incremental lake not. The same strategy as deliveries.
    "commands": ("merge_data",),
    "groups": ("traits",),
    "group_members": (),
    # Each trait's value per period of event time (the read API's asOf answers).
    "trait_history": ("trait_value",),
}
# The tables above that are no marts: schema `state` (what passes keep for themselves), and the
# models of docs/incremental-models.md (schema `examples`, built with MALLARD_DBT_EXAMPLES).
EXAMPLES = {"customer_activity": (), "order_revenue": ()}
MARTS |= EXAMPLES
STATE_VIEWS = {"customer_event_winners": "state"} | {t: "examples" for t in EXAMPLES}
# The per-customer state passes fold into, compared too: a row a pass leaves behind there (of a
# customer rebuilt, or a key it no longer has) shows in no mart until a later pass folds it in.
# Without `pass_through`, which says which pass wrote a row.
STATE = {
    # Its winners as a set (list order is the aggregate's); email_changed_at says when a pass
    # saw the email change, which a full build has not seen.
    "int_customer_traits": "customer_id, traits, list_sort(latest) as latest, first_event_time,"
    " first_received_at, first_message_id, first_campaign",
}


def read_marts(data_dir: Path) -> dict[str, list[dict[str, Any]]]:
    conn = connect(DataPaths(data_dir), read_only=True)
    try:
        out = {}
        sources = {f"{STATE_VIEWS.get(t, 'marts')}.{t}": ("*", cols) for t, cols in MARTS.items()}
        sources |= {f"intermediate.{t}": (select, ()) for t, select in STATE.items()}
        for table, (select, json_cols) in sources.items():
            cur = conn.execute(f"select {select} from lake.{table}")
            cols = [d[0] for d in cur.description]
            rows = [dict(zip(cols, r, strict=True)) for r in cur.fetchall()]
            for r in rows:
                r.pop("pass_through", None)
            for r in rows:
                for c in json_cols:
                    r[c] = json.loads(r[c])
            out[table.split(".", 1)[1]] = rows
        return out
    finally:
        conn.close()


def query(data_dir: Path, sql: str) -> list[dict[str, Any]]:
    conn = connect(DataPaths(data_dir), read_only=True)
    try:
        cur = conn.execute(sql)
        cols = [d[0] for d in cur.description]
        return [dict(zip(cols, r, strict=True)) for r in cur.fetchall()]
    finally:
        conn.close()


def read_table(data_dir: Path, table: str) -> list[dict[str, Any]]:
    return query(data_dir, f"select * from lake.{table}")


def last_pass(data_dir: Path) -> dict[str, Any]:
    """The manifest row of the pass the freshness mart names as the last that finished."""
    (row,) = query(
        data_dir,
        "select manifest.* from lake.marts.freshness"
        " join lake.state.pass_manifest as manifest using (pass_id)",
    )
    return row


def canonical(rows: list[dict[str, Any]]) -> list[str]:
    return sorted(json.dumps(r, sort_keys=True, default=str) for r in rows)


# The customers mart is built in chunks of this many customers (as 125k at a time at scale), so
# both its chunked first build and chunked incremental passes are exercised.
CHUNKED = {"MALLARD_CUSTOMERS_PER_CHUNK": "25", "MALLARD_DBT_EXAMPLES": "true"}


# The incremental lake compacts a table once it has two files to rewrite or merge, so passes
# also fold into tables compaction rewrote (at scale, 8: MALLARD_COMPACT_AT_FILES).
COMPACT_EARLY = {"MALLARD_COMPACT_AT_FILES": "2", "MALLARD_COMPACT_SLICE_S": "0"}
NO_COMPACTION = {"MALLARD_COMPACT_AT_FILES": "0"}
# The tables passes append to, and the view that combines each by its fold rule (`meta.fold`).
FOLDED = {
    "customer_event_objects": "customer_event_winners",
    "customer_identifier_sightings": "customer_identifiers",
}


def pipeline(data_dir: Path, env: dict[str, str] | None = None, kind: str = "full") -> str:
    """One pass of `kind` (full or served), which must run as that kind."""
    out = pipeline_pass(data_dir, {**CHUNKED, **(env or {})}, timeout=900, kind=kind)
    assert "FAIL" not in out.stdout, out.stdout
    assert last_pass(data_dir)["kind"] == kind, out.stdout
    return out.stdout


def interrupted_pass(data_dir: Path, select: str) -> None:
    """Load what landed, then a pass that builds only `select`, as if its process died there: the
    next pass must take these messages again, still rebuild the customers they moved away from
    (the last finished pass's attribution, not this one's), and fold nothing in twice."""
    paths = DataPaths(data_dir)
    load_new_files(paths)
    window = current_window(paths)
    assert window.loaded_after is not None, "an incremental pass, not the first one"
    # What the orchestrator does before dbt: the window into the pass manifest. dbt itself runs
    # as an analyst would run it, with nothing but the project's environment.
    open_pass(paths, window)
    subprocess.run(
        [
            str(Path(sys.executable).parent / "dbt"),
            "run",
            "--select",
            select,
            *window.dbt_args(),
            "--project-dir",
            str(DBT_DIR),
            "--profiles-dir",
            str(DBT_DIR),
            "--target-path",
            str(data_dir / "dbt" / "interrupted"),
            "--log-path",
            str(data_dir / "dbt" / "interrupted"),
        ],
        check=True,
        capture_output=True,
        env={**os.environ, **dbt_env(paths), **CHUNKED},
        timeout=600,
    )


@dataclass
class Built:
    arrivals: list[Arrival]
    slices: list[list[Arrival]]
    after_slice: list[dict[str, list[dict[str, Any]]]]  # marts after each slice's pass
    compacted: list[str]  # the passes' lines of compaction after them
    full: dict[str, list[dict[str, Any]]]  # marts of one build over everything, fresh lake
    # rows of each table passes append to (FOLDED) after each pass; the tables after a last
    # compaction of the incremental lake (which folds them), and of the full build
    appended_after_slice: dict[str, list[int]]
    folded: dict[str, list[dict[str, Any]]]
    folded_full: dict[str, list[dict[str, Any]]]
    incremental: Path  # the incremental lake's data dir, which test_exactly_once passes again
    finished: list[int]  # the passes that finished on it, in order
    versions: list[int]  # its snapshot after each slice's pass (the asOf tests read them)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Built]:
    arrivals = [a for i in range(N_STREAMS) for a in generate_stream(i)]
    # Slices follow receipt order, as the collector lands them; late events land late.
    arrivals.sort(key=lambda a: (a.received, a.stored["eventId"]))
    size = -(-len(arrivals) // N_SLICES)
    slices = [arrivals[i : i + size] for i in range(0, len(arrivals), size)]

    inc = tmp_path_factory.mktemp("incremental")
    init_data_dir(inc)
    after, compacted, finished, versions = [], [], [], []
    appended: dict[str, list[int]] = {table: [] for table in FOLDED}
    for seq, part in enumerate(slices):
        if seq in INTERRUPTED:
            # Half the slice goes through a pass that dies; the rest lands before the next.
            half = len(part) // 2
            land(inc, part[:half], 100 + seq)
            interrupted_pass(inc, INTERRUPTED[seq])
            land(inc, part[half:], seq)
        else:
            land(inc, part, seq)
        if seq < len(slices) - 1:
            out = pipeline(inc, COMPACT_EARLY)
        else:
            # The last slice as the watcher takes files that keep landing: a served pass, then
            # a full pass, which builds the rest of the models. They compact nothing: their event
            # candidates stay beside the stored winners (folded by the compaction after the loop).
            out = pipeline(inc, NO_COMPACTION, kind="served")
            finished.append(last_pass(inc)["pass_id"])
            out += pipeline(inc, NO_COMPACTION, kind="full")
        finished.append(last_pass(inc)["pass_id"])
        compacted += [line for line in out.splitlines() if " compact: " in line]
        after.append(read_marts(inc))
        versions.append(query(inc, "select id from ducklake_current_snapshot('lake')")[0]["id"])
        for table in FOLDED:
            appended[table].append(len(read_table(inc, f"state.{table}")))

    compact_fragmented(DataPaths(inc), at=1, slice_s=0)
    folded = {table: read_table(inc, f"state.{table}") for table in FOLDED}

    full = tmp_path_factory.mktemp("full")
    init_data_dir(full)
    shutil.copy(DataPaths(inc).secret_file, DataPaths(full).secret_file)  # same subscription ids
    shutil.copytree(DataPaths(inc).landing_dir, DataPaths(full).landing_dir, dirs_exist_ok=True)
    pipeline(full)
    # The incremental lake's pass process stays up for test_exactly_once (the same settings).
    close_passes(full)
    yield Built(
        arrivals,
        slices,
        after,
        compacted,
        read_marts(full),
        appended,
        folded,
        {table: read_table(full, f"state.{table}") for table in FOLDED},
        inc,
        finished,
        versions,
    )
    close_passes()


# ---------------------------------------------------------------- tests


def test_the_streams_exercise_every_rule(built: Built) -> None:
    """Guards the generator: without these cases the comparisons below would prove little."""
    last = built.slices[-1]
    expected = oracle(built.arrivals)
    assert len(built.arrivals) >= 1000
    assert len({a.account for a in built.arrivals}) == N_STREAMS
    assert sum(expected.duplicates.values()) >= 50
    # Late events (received a day or more after their event time) in the last slice.
    assert sum(a.received - event_time(a) > timedelta(days=1) for a in last) >= 20
    assert sum("sentAt" in a.msg for a in built.arrivals) >= 100
    # Visitors identified later, and visitors identified by a second userId.
    pairs = {
        (a.account, a.msg["anonymousId"], a.msg["userId"])
        for a in built.arrivals
        if "userId" in a.msg and "anonymousId" in a.msg
    }
    visitors = {(acc, anon) for acc, anon, _ in pairs}
    assert len(visitors) >= 20 and len(pairs) - len(visitors) >= 5
    anonymous = [c for c in expected.events.values() if c[1] is None]
    assert anonymous, "some visitors never identify"
    traits = list(expected.traits.values())
    assert sum("campaign" in t for t in traits) >= 10
    assert sum("name" in t and "firstName" in t for t in traits) >= 10
    assert sum(isinstance(t.get("address"), dict) for t in traits) >= 10
    # Ties on event time between identifies of one customer.
    ties = defaultdict(int)
    for a in built.arrivals:
        if a.kind == "identify":
            ties[(a.account, a.msg.get("userId"), event_time(a))] += 1
    assert sum(n > 1 for n in ties.values()) >= 5
    # Late events of the last slice become the firstEvent of customers built before it.
    before = oracle([a for part in built.slices[:-1] for a in part])
    late_ids = {a.stored["eventId"] for a in last if a.received - event_time(a) > timedelta(days=1)}
    moved = [
        cid
        for cid, (first, _) in expected.first_last.items()
        if cid in before.first_last and late_ids & set(first.values())
    ]
    assert len(moved) >= 5
    # Aliases: visitors linked by an alias alone, aliases naming a userId (which link nothing),
    # and links a later slice undoes (the previousId turns up as a userId).
    aliases = [a for a in built.arrivals if a.kind == "alias"]
    users = {(a.account, a.msg["userId"]) for a in built.arrivals if "userId" in a.msg}
    assert sum((a.account, a.msg["previousId"]) in users for a in aliases) >= 5
    assert sum(a.msg["previousId"].startswith("anon-") for a in aliases) >= 10
    turned = {
        (a.account, a.msg["userId"]) for a in last if a.msg.get("userId", "").startswith("turned")
    }
    linked_before = {
        (acc, anon) for (acc, anon) in before_owner(built) if anon.startswith("turned")
    }
    assert len(turned & linked_before) >= 3, "links undone by a later slice"
    # Group calls: several per group, some from visitors, some arriving after a later call.
    calls = [a for a in built.arrivals if a.kind == "group"]
    assert len(expected.groups) >= 2 * N_STREAMS
    assert sum("userId" not in a.msg for a in calls) >= 5
    assert sum(isinstance(a.msg["groupId"], int) for a in calls) >= 5
    by_group: dict[tuple[str, str], list[Arrival]] = defaultdict(list)
    for a in calls:
        by_group[(a.account, str(a.msg["groupId"]))].append(a)
    out_of_order = sum(
        any(
            event_time(x) < event_time(y) and x.received > y.received
            for x in group_calls
            for y in group_calls
        )
        for group_calls in by_group.values()
    )
    assert out_of_order >= 5


def before_owner(built: Built) -> set[tuple[str, str]]:
    """The (account, anonymousId) pairs an alias linked before the last slice."""
    seen = [a for part in built.slices[:-1] for a in part]
    users = {(a.account, a.msg["userId"]) for a in seen if "userId" in a.msg}
    return {
        (a.account, a.msg["previousId"])
        for a in seen
        if a.kind == "alias" and (a.account, a.msg["previousId"]) not in users
    }


def test_passes_compacted_the_tables_they_fragmented(built: Built) -> None:
    """Guards the comparisons below: they cover passes over compacted tables."""
    assert any("compacted intermediate." in line for line in built.compacted), built.compacted


def test_building_after_each_slice_equals_one_full_rebuild(built: Built) -> None:
    incremental = built.after_slice[-1]
    for table in EXAMPLES:  # the comparison below proves little of an empty table
        assert len(built.full[table]) >= 50, table
    assert any(r["revenue"] is not None for r in built.full["order_revenue"])
    for table in ("deliveries", "journey_steps", "journey_instances"):
        assert len(built.full[table]) >= 20, table
    assert sum(r["status"] == "exited" for r in built.full["journey_instances"]) >= 5
    assert sum(r["state"] != [] for r in built.full["customer_preferences"]) >= 20
    for table in (*MARTS, *STATE):
        assert len(incremental[table]) == len(built.full[table]), f"{table} (seed {SEED})"
        assert canonical(incremental[table]) == canonical(built.full[table]), (
            f"{table} (seed {SEED})"
        )


@pytest.mark.parametrize("table", FOLDED)
def test_compaction_folds_appended_rows_to_the_full_builds(built: Built, table: str) -> None:
    """Passes append rows beside the stored ones (event candidates, identifier sightings);
    compaction folds them, and what is left is row for row what a full build writes (one row per
    key of the view over them)."""
    view = FOLDED[table]
    combined = [len(marts[view]) for marts in built.after_slice]
    rows = built.appended_after_slice[table]
    assert any(n > c for n, c in zip(rows, combined, strict=True)), (
        f"no pass appended beside a stored row: {rows} rows, {combined} in {view}"
    )
    assert canonical(built.folded[table]) == canonical(built.folded_full[table])


# asOf answers: random times per pass, each asked of a few random accounts.
AS_OF_TIMES = 3
AS_OF_ACCOUNTS = 8


@dataclass
class AsOf:
    """What the read API answers as of a time for one account: the traits object of every
    profile that stood then (by customer id), and the event records as they stood."""

    traits: dict[str, str]
    events: list[str]


def as_of(wh: Warehouse, version: int, account: str, when: datetime, ids: list[str]) -> AsOf:
    snap = wh.snapshot(version)
    traits = dict(wh.traits_as_of(snap, account, when, ids))
    events: list[str] = []
    while True:
        q = EventQuery(sort="asc", offset=len(events), size=100, as_of=when)
        page = wh.events(snap, account, account.upper(), q)
        events += page
        if len(page) < 100:
            return AsOf(traits, events)


def profile_ids(arrivals: list[Arrival], account: str) -> list[str]:
    """Every profile the account's messages can make: each userId's and each visitor's."""
    keys = {f"user:{a.msg['userId']}" for a in arrivals if "userId" in a.msg}
    keys |= {f"anon:{a.msg['anonymousId']}" for a in arrivals if "anonymousId" in a.msg}
    return sorted(customer_key(account, k) for k in keys)


def times_to_ask(rng: random.Random, arrivals: list[Arrival]) -> list[datetime]:
    """Event times of the messages (a time equal to one includes it), a millisecond either side,
    and times between."""
    times = sorted(event_time(a) for a in arrivals)
    picks = []
    for _ in range(AS_OF_TIMES):
        t = rng.choice(times)
        picks.append(t + rng.choice([timedelta(0), timedelta(milliseconds=1), -_ms(rng, 0, 3600)]))
    return picks


def check_as_of(got: AsOf, want: Expected, where: str) -> None:
    """The answer as of a time against the oracle over the messages with event time <= it."""
    records = [json.loads(r) for r in got.events]
    assert {r["eventId"]: (r["customerId"], r["userId"], r["eventAction"]) for r in records} == (
        want.events
    ), where
    users = {cid: user for cid, user, _ in want.events.values()}
    for r in records:
        email = want.traits[r["customerId"]].get("email")
        assert r["email"] == (email if isinstance(email, str) else None), (where, r)
        assert r["externalId"] == r["userId"] == r["rawData"]["userId"], (where, r)
    traits = {cid: json.loads(doc) for cid, doc in got.traits.items()}
    assert set(traits) == set(want.traits), where
    for cid, expected in want.traits.items():
        assert traits[cid]["id"] == cid and traits[cid]["externalId"] == users[cid], where
        # marketingPreferences: the preferences decide it, which asOf answers leave out.
        assert {k: v for k, v in traits[cid].items() if k not in SERVED_EXTRA_TRAITS} == {
            k: v for k, v in expected.items() if k not in SERVED_EXTRA_TRAITS
        }, (where, cid)


def test_as_of_answers_follow_the_rules_at_random_times(built: Built) -> None:
    """At random times T, after each pass, the read API's asOf answers (traits of every profile
    of an account, and its events) are what the oracle makes of the messages received so far
    whose event time is <= T: identity as it stood (a visitor not yet identified is its own
    profile), traits, filled name and campaign, each event's customer and email."""
    rng = random.Random(SEED)
    wh = Warehouse(DataPaths(built.incremental), use_index=False)
    accounts = sorted({a.account for a in built.arrivals})
    try:
        for k, version in enumerate(built.versions):
            seen = [a for part in built.slices[: k + 1] for a in part]
            for when in times_to_ask(rng, seen):
                for account in rng.sample(accounts, AS_OF_ACCOUNTS):
                    mine = [a for a in seen if a.account == account]
                    want = oracle([a for a in mine if event_time(a) <= when])
                    got = as_of(wh, version, account, when, profile_ids(mine, account))
                    check_as_of(got, want, f"pass {k}, {account} as of {when} (seed {SEED})")
    finally:
        wh.close()


def test_later_messages_do_not_change_an_as_of_answer(built: Built) -> None:
    """An answer as of T after a pass stays, byte for byte, after later passes have brought
    messages with event times after T (and changed the account's current traits); only a
    message whose event time is <= T, arriving late, may change it."""
    rng = random.Random(SEED + 1)
    wh = Warehouse(DataPaths(built.incremental), use_index=False)
    last = built.versions[-1]
    asked = changed_now = 0
    try:
        for k, version in enumerate(built.versions[:-1]):
            seen = [a for part in built.slices[: k + 1] for a in part]
            later = [a for part in built.slices[k + 1 :] for a in part]
            for account in sorted({a.account for a in seen}):
                mine = [a for a in seen if a.account == account]
                theirs = [a for a in later if a.account == account]
                ids = profile_ids(mine + theirs, account)
                # Times before every later message's event time: later messages are all after.
                bound = min((event_time(a) for a in theirs), default=None)
                times = [event_time(a) for a in mine if bound is None or event_time(a) < bound]
                if not times or bound is None:
                    continue
                when = rng.choice(times)
                then, now = (
                    as_of(wh, version, account, when, ids),
                    as_of(wh, last, account, when, ids),
                )
                assert then == now, f"{account} as of {when}, pass {k} and the last (seed {SEED})"
                asked += 1
                before = [
                    r for r in built.after_slice[k]["customers"] if r["account_id"] == account
                ]
                after = [
                    r for r in built.after_slice[-1]["customers"] if r["account_id"] == account
                ]
                changed_now += canonical(before) != canonical(after)
    finally:
        wh.close()
    assert asked >= 20 and changed_now >= 10, (asked, changed_now)


# Passes over messages the lake has taken already, one after another on the incremental lake:
# (kind, the freshness columns set back, the finished pass they are set back to, counted from
# the end of Built.finished: the last slice's served and full passes, the passes of the slices
# before). A full pass after only `full_pass_id` is set back builds the rest of the models (the
# served ones hold every message); with both set back it builds every model. The last slice's
# window is taken again by each, then the last two slices' window, which overlaps the last.
AGAIN = [
    ("full", ("full_pass_id",), -3),
    ("served", ("pass_id",), -3),
    ("full", ("pass_id", "full_pass_id"), -3),
    ("served", ("pass_id",), -4),
    ("full", ("pass_id", "full_pass_id"), -4),
]


def continue_after(data_dir: Path, columns: tuple[str, ...], pass_id: int) -> None:
    """The freshness row naming `pass_id` as the last pass that finished (`pass_id`) or the last
    full one (`full_pass_id`): what passes killed after their models and before the freshness
    row leave behind. The next pass of that kind takes every message after that pass's window,
    the killed passes' messages again."""
    conn = connect(DataPaths(data_dir))
    try:
        for column in columns:
            conn.execute(f"update lake.marts.freshness set {column} = ?", [pass_id])
    finally:
        conn.close()


def test_exactly_once(built: Built) -> None:
    """A message processed twice changes nothing. The rest of a full pass, a served pass and a
    whole full pass over the window the last pass took (as after a pass killed after its models
    and before its freshness row), then a served and a full pass over a window that overlaps it
    (two slices back, as two writers that read the same freshness row would take), each leave
    every mart and state table row for row as one full build of the same messages; the full
    passes run the marts' data tests (their unique keys among them), and compaction then folds
    the candidates these passes appended to the full build's rows."""
    inc = built.incremental
    through = last_pass(inc)["loaded_through"]
    windows = {p["pass_id"]: p for p in read_table(inc, "state.pass_manifest")}
    for kind, columns, index in AGAIN:
        after = windows[built.finished[index]]["loaded_through"]
        step = f"{kind} pass after {columns} over ({after}, {through}] (seed {SEED})"
        continue_after(inc, columns, built.finished[index])
        out = pipeline(inc, NO_COMPACTION, kind=kind)
        ran = last_pass(inc)
        assert (ran["loaded_after"], ran["loaded_through"]) == (after, through), step
        if kind != "served":  # every data test of the marts ran and passed
            assert re.search(r"\b([1-9]\d*)/\1 data tests", out), (step, out)
        marts = read_marts(inc)
        for table in (*MARTS, *STATE):
            assert canonical(marts[table]) == canonical(built.full[table]), f"{table}: {step}"
    compact_fragmented(DataPaths(inc), at=1, slice_s=0)
    for table in FOLDED:
        folded = read_table(inc, f"state.{table}")
        assert canonical(folded) == canonical(built.folded_full[table]), table


@pytest.mark.parametrize("pass_index", range(N_SLICES))
def test_every_pass_matches_the_oracle(built: Built, pass_index: int) -> None:
    """After each pass the marts hold what the rules say of everything received so far:
    late events of a later slice update traits, identity and firstEvent on the next run."""
    seen = [a for part in built.slices[: pass_index + 1] for a in part]
    expected = oracle(seen)
    marts = built.after_slice[pass_index]

    events = {
        r["event_id"]: (r["customer_id"], r["user_id"], r["event_action"]) for r in marts["events"]
    }
    assert events == expected.events

    customers = {r["customer_id"]: r for r in marts["customers"]}
    assert set(customers) == set(expected.traits)
    wrong = {}
    for cid, traits in expected.traits.items():
        got = {k: v for k, v in customers[cid]["traits"].items() if k not in SERVED_EXTRA_TRAITS}
        want = {k: v for k, v in traits.items() if k not in SERVED_EXTRA_TRAITS}
        if got != want:
            wrong[cid] = (got, want)
    assert not wrong, f"{len(wrong)} customers' traits differ, e.g. {next(iter(wrong.items()))}"

    for cid, (first, last) in expected.first_last.items():
        meta = customers[cid]["metadata"]
        assert {k: v["eventId"] for k, v in meta["firstEvent"].items()} == first, cid
        assert {k: v["eventId"] for k, v in meta["lastEvent"].items()} == last, cid
        assert customers[cid]["traits"]["id"] == cid
        # externalId is the caller's userId, and null (present) for anonymous visitors.
        assert customers[cid]["traits"]["externalId"] == customers[cid]["user_id"], cid

    dups = {(r["account_id"], r["message_id"]): r["duplicate_count"] for r in marts["duplicates"]}
    assert dups == expected.duplicates

    # Every userId, anonymousId and email a customer was seen with, first and last seen by event
    # time (to the millisecond the collector stamps times with).
    seen = {
        (r["customer_id"], r["id_type"], r["id_value"]): r for r in marts["customer_identifiers"]
    }
    assert set(seen) == set(expected.identifiers)
    for key, times in expected.identifiers.items():
        for got, want in (
            (seen[key]["first_seen"], min(times)),
            (seen[key]["last_seen"], max(times)),
        ):
            assert abs(got - want) <= timedelta(milliseconds=1), (key, got, want)

    # The guide's per-customer example: events and distinct actions per customer.
    per_customer: dict[str, list[str]] = defaultdict(list)
    for customer_id, _, action in expected.events.values():
        per_customer[customer_id].append(action)
    activity = {r["customer_id"]: (r["events"], r["actions"]) for r in marts["customer_activity"]}
    assert activity == {c: (len(a), len(set(a))) for c, a in per_customer.items()}

    # Groups: traits by the latest call per key, first and last seen, members; each customer's
    # groupId in its metadata is its latest call's.
    groups = {(r["account_id"], r["group_id"]): r for r in marts["groups"]}
    assert set(groups) == set(expected.groups)
    for key, (traits, first_seen, last_seen, members) in expected.groups.items():
        got = groups[key]
        assert got["traits"] == traits, (key, got["traits"], traits)
        assert abs(got["first_seen"] - first_seen) <= timedelta(milliseconds=1), key
        assert abs(got["last_seen"] - last_seen) <= timedelta(milliseconds=1), key
        assert got["member_count"] == len(members), key
    member_rows = {
        (r["account_id"], r["group_id"], r["customer_id"]) for r in marts["group_members"]
    }
    assert member_rows == {(acc, g, cid) for (acc, g), v in expected.groups.items() for cid in v[3]}
    current = {r["customer_id"]: r["group_id"] for r in marts["group_members"] if r["is_current"]}
    assert current == expected.current_group
    for cid, customer in customers.items():
        assert customer["metadata"].get("groupId") == expected.current_group.get(cid), cid


def test_the_guide_shows_the_example_models_as_they_are() -> None:
    """docs/incremental-models.md quotes the example models the tests above build: each quoted
    block is the file it names, so the guide cannot drift from what is tested."""
    guide = (DBT_DIR.parent / "docs" / "incremental-models.md").read_text()
    quoted = re.findall(r"<!-- example: (\S+) -->\n```sql\n(.*?)```", guide, re.DOTALL)
    assert {name for name, _ in quoted} == {f"models/examples/{t}.sql" for t in EXAMPLES}
    for name, sql in quoted:
        assert sql == (DBT_DIR / name).read_text(), name
