"""The in-memory read index answers exactly what SQL on the lake answers (SQL is the oracle).

The lake is a real DuckLake with marts of the shape dbt builds, written with small row groups
so records come from many row groups, and with ties in event time, several accounts, brands,
actions and a shared email.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from api.params import event_query
from api.service import Warehouse
from mallard.paths import DataPaths
from mallard.warehouse import connect

ACTIONS = ["page", "logged_in", "order_completed", "identify"]


def build_lake(root: Path, customers: int = 300, events: int = 4000) -> DataPaths:
    paths = DataPaths(root)
    conn = connect(paths)
    conn.execute("create schema if not exists lake.marts")
    conn.execute("call lake.set_option('parquet_row_group_size', 256, schema => 'marts')")
    conn.execute(
        f"""
        create table lake.marts.customers as
        select md5('c' || i) as customer_id, 'acme' as client_id,
            case when i % 10 = 0 then 'other' else 'shop' end as account_id,
            case when i % 17 = 0 then null else 'u-' || i end as user_id,
            lower(email) as email_lower, null as subscription_id,
            json_object('email', email, 'n', i) as traits, json_object('n', i) as metadata,
            now() as created_time, now() as last_activity_time
        from (select i, case when i % 7 = 0 then 'Shared@Example.com' when i % 7 = 1
                  then 'shared@EXAMPLE.com' else 'e' || i || '@x.com' end as email
              from range({customers}) t(i))
        order by account_id, user_id, customer_id
        """
    )
    conn.execute(
        f"""
        create table lake.marts.events as
        with e as (
            select i, i % {customers} as c,
                timestamptz '2026-03-01 00:00:00+00' + to_seconds((i * 37) % 20000) as event_time
            from range({events}) t(i)
        )
        select md5('e' || i) as event_id, md5('c' || c) as customer_id, 'u-' || c as user_id,
            null as email, null as email_lower,
            (['page', 'logged_in', 'order_completed', 'identify'])[1 + (i * 7) % 4] as event_action,
            event_time, event_time as received_time, 'acme' as client_id,
            case when c % 10 = 0 then 'other' else 'shop' end as account_id,
            case when i % 5 = 0 then 'OUTLET' else 'SHOP' end as brand_id, 'server' as source,
            json_object('eventId', md5('e' || i), 'i', i) as record
        from e
        order by account_id, event_time, event_id
        """
    )
    conn.execute(
        "create table lake.marts.freshness as select now() as built_at, now() as data_through"
    )
    conn.close()
    return paths


@pytest.fixture(scope="module")
def lake(tmp_path_factory: pytest.TempPathFactory) -> DataPaths:
    return build_lake(tmp_path_factory.mktemp("index"))


@pytest.fixture(scope="module")
def fast(lake: DataPaths) -> Warehouse:
    return Warehouse(lake)


@pytest.fixture(scope="module")
def sql(lake: DataPaths) -> Warehouse:
    return Warehouse(lake, use_index=False)


def test_index_is_built_and_used(fast: Warehouse, sql: Warehouse) -> None:
    assert fast.index(fast.snapshot()) is not None
    assert sql.index(sql.snapshot()) is None


QUERIES = [
    {},
    {"size": 1},
    {"sort": "asc"},
    {"include": "page"},
    {"include": "nothing"},
    {"exclude": "page,identify"},
    {"exclude": "page", "sort": "asc", "offset": 37, "size": 13},
    {"start": "2026-03-01T01:00:00Z"},
    {"end": "2026-03-01T02:00:00Z", "sort": "asc"},
    {"start": "2026-03-01T01:00:00Z", "end": "2026-03-01T02:00:00Z", "include": "logged_in"},
    {"start": "2026-03-01T01:00:00Z", "exclude": "logged_in", "offset": 90},
    {"offset": 2500, "size": 100},
    {"offset": 9900, "size": 100},
]


@pytest.mark.parametrize(
    "account,brand", [("shop", "SHOP"), ("shop", "OUTLET"), ("other", "SHOP"), ("nope", "SHOP")]
)
@pytest.mark.parametrize(
    "params", QUERIES, ids=lambda p: ",".join(f"{k}={v}" for k, v in p.items()) or "default"
)
def test_event_pages_match_sql(
    fast: Warehouse, sql: Warehouse, account: str, brand: str, params: dict[str, Any]
) -> None:
    q = event_query(**params)
    snap = fast.snapshot()
    assert fast.events(snap, account, brand, q) == sql.events(snap, account, brand, q)


def test_profile_lookups_and_events_match_sql(fast: Warehouse, sql: Warehouse) -> None:
    snap = fast.snapshot()
    rnd = random.Random(7)
    probes = [("userId", f"u-{rnd.randrange(320)}") for _ in range(40)]
    probes += [("email", "SHARED@example.com"), ("email", "e12@X.COM"), ("email", "no@x.com")]
    probes += [
        ("id", r[0]) for r in sql._query("select customer_id from lake.marts.customers limit 20")
    ]
    probes += [("id", "nope"), ("userId", "")]
    for account in ("shop", "other"):
        for id_type, value in probes:
            for column in ("traits", "metadata", "id"):
                got = fast.customers_by(snap, account, id_type, value, column)
                want = sql.customers_by(snap, account, id_type, value, column)
                if column == "id":
                    got, want = [c for c, _ in got], [c for c, _ in want]
                assert got == want, (account, id_type, value)
            ids = [c for c, _ in sql.customers_by(snap, account, id_type, value, "id")]
            for params in (
                {},
                {"include": "page", "sort": "asc"},
                {"exclude": "page", "size": 3},
                {"start": "2026-03-01T03:00:00Z", "offset": 2},
            ):
                q = event_query(**params)
                for brand in ("SHOP", "OUTLET"):
                    assert fast.events(snap, account, brand, q, ids) == sql.events(
                        snap, account, brand, q, ids
                    ), (account, id_type, value, params)


def test_profile_list_pages_match_sql(fast: Warehouse, sql: Warehouse) -> None:
    snap = fast.snapshot()
    for account in ("shop", "other", "nope"):
        ids = [c for c, _ in sql.customer_page(snap, account, None, 0, 10_000)]
        for after in (None, "", ids[5] if ids else "x", ids[-1] if ids else "y", "0", "g"):
            for offset, size in ((0, 100), (3, 7), (250, 100)):
                assert fast.customer_page(snap, account, after, offset, size) == sql.customer_page(
                    snap, account, after, offset, size
                ), (account, after, offset, size)


def test_big_builds_keep_answering_from_the_previous_index(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import threading
    import time

    from api import service

    paths = build_lake(tmp_path, customers=50, events=500)
    monkeypatch.setattr(service, "INLINE_BUILD_BYTES", 0)  # every build in the background
    gate = threading.Event()
    real_build = Warehouse._build

    def gated(self: Warehouse, key: Any) -> Any:
        gate.wait(30)
        return real_build(self, key)

    monkeypatch.setattr(Warehouse, "_build", gated)
    wh = Warehouse(paths)
    first = wh.snapshot()
    assert wh.index(first) is None  # nothing built yet: SQL on the current snapshot
    q = event_query(size=100)
    before = wh.events(first, "shop", "SHOP", q)
    gate.set()
    deadline = time.monotonic() + 30
    while wh.index(first) is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert wh.index(first) is not None
    gate.clear()

    conn = connect(paths)
    conn.execute(
        "create or replace table lake.marts.events as select * from lake.marts.events"
        " union all select md5('new'), md5('c1'), 'u-1', null, null, 'page',"
        " timestamptz '2027-01-01 00:00:00+00', now(), 'acme', 'shop', 'SHOP', 'server',"
        " json_object('eventId', md5('new'))"
        " order by account_id, event_time, event_id"
    )
    conn.close()
    # While the new build waits, answers come from the previous snapshot, whole.
    during = wh.snapshot()
    assert during.version == first.version
    assert wh.events(during, "shop", "SHOP", q) == before
    gate.set()
    deadline = time.monotonic() + 30
    while wh.snapshot().version == first.version and time.monotonic() < deadline:
        time.sleep(0.01)
    after = wh.snapshot()
    assert after.version > first.version
    newest = wh.events(after, "shop", "SHOP", event_query(size=1))
    assert '"eventId"' in newest[0] and newest != before[:1]
