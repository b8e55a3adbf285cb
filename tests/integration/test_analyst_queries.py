"""The queries of docs/analysts.md, each run by `mallard sql` against a lake of known content.

One module-scoped server on a copy of config/ (plus two audience files), a loopback SMTP sink,
and a lake built through the real path: four weeks of identifies, pages and a product funnel
posted with explicit timestamps, a few anonymous visitors, marketing preferences set by identify
traits, send_email commands, four customers from `mallard import customers`; a first pass loads
them, builds the marts, evaluates the audiences and dispatches the sends, a second loads the
delivery outcomes (and so ends some audience stays). Every SQL block marked
`<!-- query: NAME -->` in the doc is extracted and run as written; each answer is checked against
what this module sent, worked out here in Python.
"""

from __future__ import annotations

import json
import re
import shutil
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from typing import Any

import pytest
from aiosmtpd.controller import Controller

from mallard.harness import REPO, mallard
from tests.conftest import Server, free_port, init_data_dir, wait_landed

pytestmark = pytest.mark.integration

DOC = REPO / "docs" / "analysts.md"
QUERY = re.compile(r"<!-- query: (\w+) -->\n```sql\n(.*?)```", re.DOTALL)

MONDAY = datetime(2026, 1, 5, tzinfo=UTC)  # week 0; every event falls on a Tuesday
USERS, VISITORS = 24, 3
PLANS = ("free", "pro", "team")
IMPORTED = [(f"an-imp{k}", f"imp{k}@example.com") for k in range(4)]  # plan pro, via crm.csv
IMPORT_FILE = "crm.csv"
# An identify's `channels` array replaces the channels whole (docs/warehouse.md, Preferences):
# every interface channel it leaves out is set unsubscribed.
INTERFACE_CHANNELS = ("email", "sms", "whatsapp", "facebook", "push")
# Two audiences: one that keeps its members, one that loses those a pass later found emailed (the
# first pass evaluates it before it dispatches; the second loads the email_sent outcomes).
AUDIENCES = {
    "pro_customers": "select customer_id from customers where traits ->> '$.plan' = 'pro'",
    "not_yet_emailed": "select customer_id from customer_profiles where user_id is not null"
    " and customer_id not in (select customer_id from events where event_action = 'email_sent')",
}


def user(i: int) -> str:
    return f"an-u{i:02d}"


def at(week: int, i: int, hours: float) -> datetime:
    return MONDAY + timedelta(weeks=week, days=1, hours=i % 12 + hours)


def iso(t: datetime) -> str:
    return t.isoformat().replace("+00:00", "Z")


def prefs_of(i: int) -> dict[str, Any] | None:
    """The marketingPreferences trait of user i: four kinds of customer, by i % 4."""
    yes, no = True, False
    return [
        {
            "channels": [
                {"channel": "email", "subscribed": yes},
                {"channel": "sms", "subscribed": no},
                {"channel": "push", "subscribed": yes},
            ]
        },
        {
            "channels": [{"channel": "email", "subscribed": yes}],
            "categories": [{"category": "weekly_news", "subscribed": no}],
        },
        None,
        {"channels": [{"channel": "email", "subscribed": yes}], "unsubscribeAll": yes},
    ][i % 4]


@dataclass
class Sent:
    """What the module sends, and the facts the expectations are worked out from. A customer is
    keyed `u:<userId>` or `v:<anonymousId>` (a visitor who never identified)."""

    messages: list[dict[str, Any]] = field(default_factory=list)
    events: list[tuple[str, str]] = field(default_factory=list)  # (action, customer): every event
    activity: list[tuple[str, datetime]] = field(default_factory=list)  # customer-made events
    orders: list[tuple[datetime, float]] = field(default_factory=list)
    funnel: dict[str, dict[str, list[datetime]]] = field(default_factory=lambda: defaultdict(dict))
    plans: dict[str, str] = field(default_factory=dict)  # identified customer -> plan
    prefs: dict[str, dict[str, Any]] = field(default_factory=dict)
    sends: list[tuple[str, str, str]] = field(default_factory=list)  # (asset, customer, outcome)

    def add(self, kind: str, body: dict[str, Any], customer: str, action: str) -> None:
        self.messages.append({"type": kind, **body})
        self.events.append((action, customer))

    def act(self, kind: str, body: dict[str, Any], customer: str, action: str, t: datetime) -> None:
        self.add(kind, {**body, "timestamp": iso(t)}, customer, action)
        self.activity.append((customer, t))
        if action in ("product_viewed", "product_added", "order_completed"):
            firsts = self.funnel[customer].setdefault(action, [])
            firsts.append(t)


def generate() -> Sent:
    s = Sent()
    for i in range(USERS):
        u, key = user(i), f"u:{user(i)}"
        cohort = i % 3
        anon = f"an-a{i}" if i % 5 == 0 else None
        if anon:  # browsed before identifying: the page is the customer's
            s.act("page", {"anonymousId": anon, "name": "Home"}, key, "page", at(cohort, i, 0))
        traits: dict[str, Any] = {
            "email": f"{u}@example.com",
            "firstName": f"F{i}",
            "plan": PLANS[(i // 3) % 3],
        }
        if (prefs := prefs_of(i)) is not None:
            traits["marketingPreferences"] = prefs
            s.prefs[key] = prefs
        s.plans[key] = traits["plan"]
        ident = {"userId": u, "traits": traits, "timestamp": iso(at(cohort, i, 0.5))}
        s.add("identify", ident | ({"anonymousId": anon} if anon else {}), key, "identify")
        weeks = {cohort} | ({cohort + 1} if i % 2 == 0 else set())
        weeks |= {cohort + 2} if i % 4 == 0 else set()
        for w in sorted(weeks):
            s.act("page", {"userId": u, "name": "Catalog"}, key, "page", at(w, i, 2))
        track = {"userId": u}
        if i == 6:  # added before viewing: not a funnel step
            s.act("track", track | {"event": "Product Added"}, key, "product_added", at(0, i, 0.25))
        if i % 4 in (0, 1, 2):
            t = at(cohort, i, 1)
            s.act("track", track | {"event": "Product Viewed"}, key, "product_viewed", t)
        if i % 4 in (0, 1):
            t = at(cohort, i, 1.25)
            s.act("track", track | {"event": "Product Added"}, key, "product_added", t)
        if i % 4 == 0 or i == 7:  # 7 orders without the funnel before it
            t, revenue = at(cohort, i, 1.5), 10.25 + i
            body = track | {"event": "Order Completed", "properties": {"revenue": revenue}}
            s.act("track", body, key, "order_completed", t)
            s.orders.append((t, revenue))
    for k in range(VISITORS):
        v = f"an-v{k}"
        for w in (1, 2) if k == 0 else (1,):
            s.act("page", {"anonymousId": v, "name": "Home"}, f"v:{v}", "page", at(w, k, 0))
    # Commands, at receipt time. welcome is transactional; newsletter is marketing in category
    # weekly_news: sent only with email opted in, weekly_news not opted out, no unsubscribe-all.
    for i in (0, 6, 12, 18):
        s.add("track", {"userId": user(i), "event": "send_email", "assetId": "welcome"},
              f"u:{user(i)}", "send_email")  # fmt: skip
        s.sends.append(("welcome", f"u:{user(i)}", "sent"))
    s.add("track", {"anonymousId": "an-v0", "event": "send_email", "assetId": "welcome"},
          "v:an-v0", "send_email")  # fmt: skip
    s.sends.append(("welcome", "v:an-v0", "failed"))  # customer_not_identified
    for i in range(8):
        key = f"u:{user(i)}"
        s.add("track", {"userId": user(i), "event": "send_email", "assetId": "newsletter"},
              key, "send_email")  # fmt: skip
        s.sends.append(
            ("newsletter", key, "sent" if allows_newsletter(s.prefs.get(key)) else "skipped")
        )
    for _, customer, outcome in s.sends:
        s.events.append((f"email_{outcome}", customer))
    for u, _ in IMPORTED:
        s.events.append(("identify", f"u:{u}"))
        s.plans[f"u:{u}"] = "pro"
    return s


def allows_newsletter(prefs: dict[str, Any] | None) -> bool:
    p = prefs or {}
    email = any(c["channel"] == "email" and c["subscribed"] for c in p.get("channels", []))
    out = any(
        c["category"] == "weekly_news" and not c["subscribed"] for c in p.get("categories", [])
    )
    return email and not out and not p.get("unsubscribeAll", False)


def week_of(t: datetime) -> str:
    return (t.date() - timedelta(days=t.weekday())).isoformat()


SENT = generate()


# --- the lake ---------------------------------------------------------------------------------


class Sink:
    def __init__(self) -> None:
        self.count = 0

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:  # noqa: N802
        self.count += 1
        return "250 OK"


@dataclass
class Lake:
    server: Server
    sink: Sink
    queries: dict[str, str]


def sql(server: Server, query: str) -> list[dict[str, Any]]:
    out = mallard("sql", "-c", query, "--format", "json", data_dir=server.data_dir, timeout=120)
    return list(json.loads(out.stdout)) if out.stdout.strip() else []


@pytest.fixture(scope="module")
def lake(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lake]:
    root = tmp_path_factory.mktemp("analysts")
    config = root / "config"
    shutil.copytree(REPO / "config", config)
    (config / "audiences").mkdir(exist_ok=True)
    for name, select in AUDIENCES.items():
        (config / "audiences" / f"{name}.sql").write_text(select + "\n")
    handler, port = Sink(), free_port()
    controller = Controller(handler, hostname="127.0.0.1", port=port)
    controller.start()
    d = root / "data"
    env = {
        "MALLARD_ROLL_INTERVAL_S": "0.2",
        "MALLARD_CONFIG_DIR": str(config),
        "MALLARD_SMTP_URL": f"smtp://127.0.0.1:{port}",
    }
    srv = Server(d, free_port(), init_data_dir(d), env=env)
    srv.start()
    try:
        ids: list[str] = []
        for n in range(0, len(SENT.messages), 100):
            r = srv.post("batch", {"batch": SENT.messages[n : n + 100]})
            assert r.status_code == 200, r.text
            ids += r.json()["eventIds"]
        wait_landed(d, ids)
        csv = root / IMPORT_FILE
        csv.write_text("userId,email,plan\n" + "".join(f"{u},{e},pro\n" for u, e in IMPORTED))
        c = srv.creds
        mallard("import", "customers", str(csv), "--client", c["clientId"],
                "--account", c["accountId"], data_dir=d, env=env)  # fmt: skip
        srv.pipeline()  # loads, builds, dispatches the sends
        srv.pipeline()  # loads their outcomes
        yield Lake(srv, handler, dict(QUERY.findall(DOC.read_text())))
    finally:
        srv.stop()
        controller.stop()


def run(lake: Lake, name: str) -> list[dict[str, Any]]:
    return sql(lake.server, lake.queries[name])


# --- the queries ------------------------------------------------------------------------------


def test_the_doc_has_ten_queries(lake: Lake) -> None:
    assert len(lake.queries) == 10, sorted(lake.queries)
    assert lake.sink.count == sum(1 for _, _, outcome in SENT.sends if outcome == "sent")


def test_top_events(lake: Lake) -> None:
    counts = Counter(action for action, _ in SENT.events)
    customers: dict[str, set[str]] = defaultdict(set)
    for action, customer in SENT.events:
        customers[action].add(customer)
    want = [
        {"event_action": a, "events": n, "customers": len(customers[a])}
        for a, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    ][:10]
    assert run(lake, "top_events") == want


def active_weeks() -> dict[str, set[str]]:
    weeks: dict[str, set[str]] = defaultdict(set)
    for customer, t in SENT.activity:
        weeks[week_of(t)].add(customer)
    return weeks


def test_weekly_active_customers(lake: Lake) -> None:
    want = [
        {
            "week": w,
            "active_customers": len(cs),
            "identified": sum(1 for c in cs if c.startswith("u:")),
        }
        for w, cs in sorted(active_weeks().items())
    ]
    assert run(lake, "weekly_active_customers") == want


def test_funnel(lake: Lake) -> None:
    viewed = added = ordered = 0
    for steps in SENT.funnel.values():
        if not (views := steps.get("product_viewed")):
            continue
        viewed += 1
        adds = [t for t in steps.get("product_added", []) if t >= min(views)]
        if not adds:
            continue
        added += 1
        ordered += any(t >= min(adds) for t in steps.get("order_completed", []))
    got = run(lake, "funnel")
    assert [(r["step"], r["action"], r["customers"]) for r in got] == [
        (1, "product_viewed", viewed),
        (2, "product_added", added),
        (3, "order_completed", ordered),
    ]
    assert (viewed, added, ordered) == (18, 12, 6)  # the generated cases, i == 6 and 7 left out
    assert [r["pct_of_first"] for r in got] == [
        100.0,
        round(100 * added / viewed, 1),
        round(100 * ordered / viewed, 1),
    ]


def test_retention_by_week(lake: Lake) -> None:
    weeks: dict[str, set[str]] = defaultdict(set)
    for customer, t in SENT.activity:
        weeks[customer].add(week_of(t))
    cells: Counter[tuple[str, int]] = Counter()
    for ws in weeks.values():
        cohort = min(ws)
        for w in ws:
            cells[(cohort, (date.fromisoformat(w) - date.fromisoformat(cohort)).days // 7)] += 1
    want = [
        {"cohort_week": c, "week_number": n, "customers": k} for (c, n), k in sorted(cells.items())
    ]
    assert run(lake, "retention_by_week") == want


def test_revenue_by_week(lake: Lake) -> None:
    by_week: dict[str, list[float]] = defaultdict(list)
    for t, revenue in SENT.orders:
        by_week[week_of(t)].append(revenue)
    got = run(lake, "revenue_by_week")
    assert [(r["week"], r["orders"], float(r["revenue"])) for r in got] == [
        (w, len(rs), sum(rs)) for w, rs in sorted(by_week.items())
    ]


def test_customers_by_plan(lake: Lake) -> None:
    counts = Counter(SENT.plans.values())
    want = [{"plan": p, "customers": n, "with_email": n} for p, n in sorted(counts.items())]
    assert run(lake, "customers_by_plan") == want


def test_customers_by_origin(lake: Lake) -> None:
    served = {c for _, c in SENT.events} - {f"u:{u}" for u, _ in IMPORTED}
    assert run(lake, "customers_by_origin") == [
        {
            "created_by": "import",
            "import_file": IMPORT_FILE,
            "customers": len(IMPORTED),
            "identified": len(IMPORTED),
        },
        {
            "created_by": "server",
            "import_file": None,
            "customers": len(served),
            "identified": sum(1 for c in served if c.startswith("u:")),
        },
    ]


def test_preference_opt_in_rates(lake: Lake) -> None:
    identified = list(SENT.plans)  # every identified customer, imported ones included
    keys = set()
    for p in SENT.prefs.values():
        if "channels" in p:
            keys |= {("channel", c) for c in INTERFACE_CHANNELS}
        keys |= {("category", c["category"]) for c in p.get("categories", [])}

    def opted_in(customer: str, kind: str, name: str) -> bool:
        p = SENT.prefs.get(customer, {})
        if p.get("unsubscribeAll"):
            return False
        items = p.get("channels" if kind == "channel" else "categories", [])
        said = [c["subscribed"] for c in items if c[kind] == name]
        if said:
            return bool(said[0])
        # Unlisted in a channels array: unsubscribed; never chosen: the kind's default.
        return kind == "category"

    want = []
    for kind, name in sorted(keys):
        n = sum(opted_in(c, kind, name) for c in identified)
        want.append(
            {
                "kind": kind,
                "name": name,
                "opted_in": n,
                "customers": len(identified),
                "opt_in_pct": round(100 * n / len(identified), 1),
            }
        )
    got = run(lake, "preference_opt_in_rates")
    assert got == want
    rates = {(r["kind"], r["name"]): r["opted_in"] for r in got}
    assert rates[("channel", "email")] == 12 and rates[("category", "weekly_news")] == 16


def test_deliveries_by_asset(lake: Lake) -> None:
    want = []
    for asset in sorted({a for a, _, _ in SENT.sends}):
        outcomes = Counter(o for a, _, o in SENT.sends if a == asset)
        want.append(
            {
                "asset_id": asset,
                "send_type": "email",
                "sends": sum(outcomes.values()),
                "sent": outcomes["sent"],
                "skipped": outcomes["skipped"],
                "failed": outcomes["failed"],
                "bounced": 0,
                "opened": 0,
                "clicked": 0,
            }
        )
    assert run(lake, "deliveries_by_asset") == want


def test_audience_sizes(lake: Lake) -> None:
    pro = sum(1 for p in SENT.plans.values() if p == "pro")
    emailed = {c for _, c, outcome in SENT.sends if outcome == "sent"}
    identified = len(SENT.plans)
    assert run(lake, "audience_sizes") == [
        {
            "audience": "not_yet_emailed",
            "members": identified - len(emailed),
            "ever_members": identified,
            "stays_ended": len(emailed),
        },
        {"audience": "pro_customers", "members": pro, "ever_members": pro, "stays_ended": 0},
    ]
