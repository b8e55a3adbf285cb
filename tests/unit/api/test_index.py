"""The in-memory read index answers exactly what SQL on the lake answers (SQL is the oracle).

The lake is a real DuckLake with marts of the shape dbt builds, written with small row groups
so records come from many row groups, and with ties in event time, several accounts, brands,
actions and a shared email. A second lake is then changed by incremental passes as the dbt
models make them (delete the rows of the customers that changed, insert their new rows): its
marts have several data files, some with DuckLake delete files.
"""

from __future__ import annotations

import os
import random
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from api.index import CustomerIndex, EventIndex, Index
from api.params import event_query
from api.service import Snapshot, Warehouse
from mallard.paths import DataPaths
from mallard.warehouse import connect

ACTIONS = ["page", "logged_in", "order_completed", "identify"]


def customers_sql(ids: str, run: int = 1) -> str:
    """The customer_profiles rows of the customer numbers `ids` (SQL of one column i), as of a
    run."""
    return f"""
        select md5('c' || i) as customer_id, 'acme' as client_id,
            case when i % 10 = 0 then 'other' else 'shop' end as account_id,
            case when i % 17 = 0 then null else 'u-' || i end as user_id,
            lower(email) as email_lower, null as subscription_id,
            json_object('email', email, 'n', i, 'run', {run}) as traits,
            json_object('n', i, 'run', {run}) as metadata,
            now() as created_time, now() as last_activity_time
        from (select i, case when i % 7 = 0 then 'Shared@Example.com' when i % 7 = 1
                  then 'shared@EXAMPLE.com' else 'e' || i || '@x.com' end as email
              from ({ids}))
        order by account_id, user_id, customer_id
        """


def events_sql(pairs: str, run: int = 1) -> str:
    """The events rows of the (event number i, customer number c) `pairs`, as of a run."""
    return f"""
        with e as (
            select i, c,
                timestamptz '2026-03-01 00:00:00+00' + to_seconds((i * 37) % 20000) as event_time
            from ({pairs})
        )
        select md5('e' || i) as event_id, md5('c' || c) as customer_id, 'u-' || c as user_id,
            null as email, null as email_lower,
            (['page', 'logged_in', 'order_completed', 'identify'])[1 + (i * 7 + i // 10) % 4]
            as event_action,
            event_time, event_time as received_time, 'acme' as client_id,
            case when c % 10 = 0 then 'other' else 'shop' end as account_id,
            case when (i // 10) % 5 = 0 then 'OUTLET' else 'SHOP' end as brand_id,
            'server' as source,
            json_object('eventId', md5('e' || i), 'i', i, 'run', {run}) as record
        from e
        order by account_id, event_time, event_id
        """


def build_lake(root: Path, customers: int = 300, events: int = 4000) -> DataPaths:
    paths = DataPaths(root)
    conn = connect(paths)
    conn.execute("create schema if not exists lake.marts")
    conn.execute("call lake.set_option('parquet_row_group_size', 256, schema => 'marts')")
    conn.execute(
        "create table lake.marts.customer_profiles as "
        + customers_sql(f"select i from range({customers}) t(i)")
    )
    # The real view splices firstEvent/lastEvent into metadata (dbt_project/models/marts).
    conn.execute(
        "create view lake.marts.customers as"
        " select customer_id, account_id, user_id, metadata from lake.marts.customer_profiles"
    )
    conn.execute(
        "create table lake.marts.events as "
        + events_sql(f"select i, i % {customers} as c from range({events}) t(i)")
    )
    conn.execute(
        "create table lake.marts.freshness as select now() as built_at, now() as data_through"
    )
    conn.close()
    return paths


@pytest.fixture(scope="module")
def lake(tmp_path_factory: pytest.TempPathFactory) -> DataPaths:
    return build_lake(tmp_path_factory.mktemp("index"))


@pytest.fixture(scope="module", params=[False, True], ids=["pages_here", "pages_process"])
def fast(request: pytest.FixtureRequest, lake: DataPaths) -> Iterator[Warehouse]:
    """The index, with event pages from this process or from a pages process (api/pages.py)."""
    wh = Warehouse(lake, pages_process=request.param)
    yield wh
    wh.close()


@pytest.fixture(scope="module")
def sql(lake: DataPaths) -> Warehouse:
    return Warehouse(lake, use_index=False)


def test_index_is_built_and_used(fast: Warehouse, sql: Warehouse) -> None:
    assert fast.index(fast.snapshot()) is not None
    assert sql.index(sql.snapshot()) is None


def test_a_lake_of_another_ducklake_format_is_answered_from_sql(
    lake: DataPaths, sql: Warehouse, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The index reads DuckLake's files as api/index/ducklake_format.py knows them: a catalog of
    another format than the one it pins is not indexed, and answers come from SQL."""
    from api.index import ducklake_format

    monkeypatch.setattr(ducklake_format, "CATALOG_FORMAT", "0.0")
    wh = Warehouse(lake)
    snap = wh.snapshot()
    assert wh.index(snap) is None
    q = event_query(size=100)
    assert wh.events(snap, "shop", "SHOP", q) == sql.events(snap, "shop", "SHOP", q)
    wh.close()


ACCOUNT_BRANDS = [
    ("shop", "SHOP"),
    ("shop", "OUTLET"),
    ("other", "SHOP"),
    ("other", "OUTLET"),
    ("nope", "SHOP"),
]


QUERIES: list[dict[str, Any]] = [
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


@pytest.mark.parametrize("account,brand", ACCOUNT_BRANDS)
@pytest.mark.parametrize(
    "params", QUERIES, ids=lambda p: ",".join(f"{k}={v}" for k, v in p.items()) or "default"
)
def test_event_pages_match_sql(
    fast: Warehouse, sql: Warehouse, account: str, brand: str, params: dict[str, Any]
) -> None:
    q = event_query(**params)
    snap = fast.snapshot()
    assert fast.events(snap, account, brand, q) == sql.events(snap, account, brand, q)


def test_event_page_cases_compare_real_pages(sql: Warehouse) -> None:
    """The cases above compare pages, not empty lists: every account and brand with events has
    events of every action and answers most queries (not an unknown action, nor an offset past
    its events); only the unknown account answers none."""
    snap = sql.snapshot()
    for account, brand in ACCOUNT_BRANDS:
        found = [sql.events(snap, account, brand, event_query(**p)) for p in QUERIES]
        answered = sum(1 for page in found if page)
        if account == "nope":
            assert answered == 0
        else:
            assert answered >= 9, (account, brand, answered)
            for action in ACTIONS:
                assert sql.events(snap, account, brand, event_query(include=action)), action


def profile_probes(sql: Warehouse, snap: Snapshot, user_ids: int, ids: int) -> list[Any]:
    rnd = random.Random(7)
    probes = [("userId", f"u-{rnd.randrange(360)}") for _ in range(user_ids)]
    probes += [("email", "SHARED@example.com"), ("email", "e12@X.COM"), ("email", "no@x.com")]
    probes += [
        ("id", r[0])
        for r in sql._query(
            f"select customer_id from lake.marts.customer_profiles AT (VERSION => {snap.version})"
            f" order by customer_id limit {ids}"
        )
    ]
    return [*probes, ("id", "nope"), ("userId", "")]


def test_profile_lookups_and_events_match_sql(fast: Warehouse, sql: Warehouse) -> None:
    snap = fast.snapshot()
    check_profiles(fast, sql, snap, profile_probes(sql, snap, 40, 20))


def check_profiles(fast: Warehouse, sql: Warehouse, snap: Snapshot, probes: list[Any]) -> None:
    """Profiles by every kind of id, in every column, and the events of those customers."""
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
    check_customer_pages(fast, sql, fast.snapshot())


def check_customer_pages(fast: Warehouse, sql: Warehouse, snap: Snapshot) -> None:
    for account in ("shop", "other", "nope"):
        ids = [c for c, _ in sql.customer_page(snap, account, None, 0, 10_000)]
        for after in (
            None,
            "",
            ids[len(ids) // 2] if ids else "x",
            ids[-1] if ids else "y",
            "0",
            "g",
        ):
            for offset, size in ((0, 100), (3, 7), (250, 100)):
                assert fast.customer_page(snap, account, after, offset, size) == sql.customer_page(
                    snap, account, after, offset, size
                ), (account, after, offset, size)


def test_big_builds_keep_answering_from_the_previous_index(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import threading
    import time

    from api.service import serving

    paths = build_lake(tmp_path, customers=50, events=500)
    monkeypatch.setattr(serving, "INLINE_BUILD_BYTES", 0)  # every build in the background
    gate = threading.Event()
    real_build = Warehouse._build

    def gated(self: Warehouse, key: Any, version: int) -> Any:
        gate.wait(30)
        return real_build(self, key, version)

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


# --- marts changed by incremental passes: several data files, delete files ---------------------


def event_customer(i: str) -> str:
    """The customer number of event number i: the first 4000 events are those of build_lake,
    later ones belong to the 40 customers (300 to 339) the incremental passes add."""
    return f"case when {i} < 4000 then {i} % 300 else 300 + {i} % 40 end"


def incremental_pass(paths: DataPaths, run: int, changed: str) -> int:
    """One incremental run of the marts, as the dbt models make it: in one transaction, delete
    the rows of the customers that changed (`changed`, a condition on customer number {c}; the
    added customers always change, since each pass brings them new events) and insert their
    rows as of this run. Returns the snapshot it committed."""

    def changes(c: str) -> str:
        return f"({changed.format(c=c)} or {c} >= 300)"

    ids = f"select i from range(340) t(i) where {changes('i')}"
    pairs = (
        f"select i, c from (select i, {event_customer('i')} as c"
        f" from range({4000 + 300 * (run - 1)}) t(i)) where {changes('c')}"
    )
    conn = connect(paths)
    try:
        conn.execute("begin")
        for table in ("customer_profiles", "events"):
            conn.execute(
                f"delete from lake.marts.{table}"
                f" where customer_id in (select md5('c' || i) from ({ids}))"
            )
        conn.execute("insert into lake.marts.customer_profiles " + customers_sql(ids, run))
        conn.execute("insert into lake.marts.events " + events_sql(pairs, run))
        conn.execute("commit")
        return int(conn.execute("select id from lake.current_snapshot()").fetchall()[0][0])
    finally:
        conn.close()


@dataclass
class Incremental:
    paths: DataPaths
    versions: list[int]  # the snapshots of build_lake's run and of two incremental passes
    indexed: list[Index | None]  # the index of each, taken right after its run


@pytest.fixture(scope="module")
def incremental(tmp_path_factory: pytest.TempPathFactory) -> Incremental:
    paths = build_lake(tmp_path_factory.mktemp("incremental"))
    conn = connect(paths)
    # As the marts are configured: no rows or deletes inlined in the catalog.
    conn.execute("call lake.set_option('data_inlining_row_limit', 0, schema => 'marts')")
    versions = [int(conn.execute("select id from lake.current_snapshot()").fetchall()[0][0])]
    conn.close()
    live = Warehouse(paths)  # as the API sees the runs: each snapshot while it is the newest
    indexed = [live.index(versions[0])]
    for run, changed in ((2, "{c} % 3 = 0"), (3, "{c} % 4 = 1")):
        versions.append(incremental_pass(paths, run, changed))
        indexed.append(live.index(versions[-1]))
    return Incremental(paths, versions, indexed)


def list_files(wh: Warehouse, table: str, version: int) -> list[tuple[Any, ...]]:
    return wh._query(
        "select data_file, delete_file from ducklake_list_files('lake', ?, schema => 'marts',"
        f" snapshot_version => {version})",
        [table],
    )


def test_incremental_passes_are_indexed_with_their_delete_files(incremental: Incremental) -> None:
    wh = Warehouse(incremental.paths)
    for v in incremental.versions[1:]:
        for table in ("customer_profiles", "events"):
            files = list_files(wh, table, v)
            assert len(files) > 1 and any(d for _, d in files), (table, v)
    assert all(idx is not None for idx in incremental.indexed)
    # The third run deleted rows of build_lake's data file again: a new delete file replaced
    # the second run's, and with it the index.
    keys = [idx.key for idx in incremental.indexed if idx is not None]
    ((_, events1), (customers2, events2), (customers3, events3)) = keys
    assert customers2 != customers3
    (base,) = events1.paths
    delete2, delete3 = (e.deletes[e.paths.index(base)] for e in (events2, events3))
    assert delete2 and delete3 and delete2 != delete3
    # The new delete file now stands for the second run too, with the third run's deletes in
    # it: read as of the second run, it yields the second run's index again.
    later = wh._files_of(incremental.versions[1])
    assert later is not None and later[1].deletes[later[1].paths.index(base)] == delete3
    assert later[1].upto == incremental.versions[1] and events3.upto is None
    idx = wh.index(incremental.versions[1])
    assert idx is not None
    assert idx.events.file_rows == events2.rows and idx.customers.file_rows == customers2.rows


def assert_same_events(got: EventIndex, full: EventIndex) -> None:
    """An index updated from an earlier one holds what a build from the files holds."""
    assert got.groups == full.groups and got.n == full.n
    for name in ("t", "file", "row"):
        np.testing.assert_array_equal(getattr(got, name), getattr(full, name), err_msg=name)

    def actions(e: EventIndex) -> list[str | None]:
        return [e.action_names[c] if c >= 0 else None for c in e.action.tolist()]

    assert actions(got) == actions(full)
    for e in (got, full):
        assert np.all(np.diff(e.by_customer.hashes.astype(np.float64)) >= 0)

    def pairs(e: EventIndex) -> set[tuple[int, int]]:
        return set(zip(e.by_customer.hashes.tolist(), e.by_customer.rows.tolist(), strict=True))

    assert pairs(got) == pairs(full)
    assert got.by_action.keys() == full.by_action.keys()
    for key, rows in full.by_action.items():
        np.testing.assert_array_equal(got.by_action[key], rows)


def assert_same_customers(got: CustomerIndex, full: CustomerIndex) -> None:
    assert got.accounts == full.accounts and got.rows == full.rows
    for name in ("file", "row"):
        np.testing.assert_array_equal(getattr(got, name), getattr(full, name), err_msg=name)
    assert got.account.equals(full.account) and got.traits.equals(full.traits)
    for col in ("user_id", "customer_id", "email_lower"):
        assert got.cols[col].equals(full.cols[col]), col
    for id_type in ("userId", "email", "id"):
        a, b = got.by[id_type], full.by[id_type]
        assert a.accounts == b.accounts and a.values.equals(b.values), id_type
        # Rows of one key may come in another order (answers sort them by customer id).
        assert sorted(zip(a.values.to_pylist(), a.rows.tolist(), strict=True)) == sorted(
            zip(b.values.to_pylist(), b.rows.tolist(), strict=True)
        ), id_type


def test_incremental_passes_update_the_index(incremental: Incremental) -> None:
    """The API indexes each pass from the index of the pass before (the fixture's indexes)."""
    for idx in incremental.indexed[1:]:
        assert idx is not None and idx.events.updated and idx.customers.updated
        full = Index(*idx.key)
        assert not full.events.updated and not full.customers.updated
        assert_same_events(idx.events, full.events)
        assert_same_customers(idx.customers, full.customers)


def test_an_update_merges_same_times_new_actions_and_new_accounts(tmp_path: Path) -> None:
    """New events at the time of existing ones fall in place by event id (read from the files);
    an action name never seen before renumbers the actions."""
    paths = build_lake(tmp_path, customers=50, events=500)
    conn = connect(paths)
    conn.execute("call lake.set_option('data_inlining_row_limit', 0, schema => 'marts')")
    live, sql = Warehouse(paths), Warehouse(paths, use_index=False)
    assert live.index(live.snapshot()) is not None
    conn.execute("begin")
    conn.execute("delete from lake.marts.events where hash(event_id) % 9 = 0")
    conn.execute(
        "insert into lake.marts.events select * replace (md5('t' || event_id) as event_id,"
        " case when hash(event_id) % 2 = 0 then 'aaa_first' else event_action end"
        " as event_action, json_object('eventId', md5('t' || event_id), 'tie', true) as record)"
        " from lake.marts.events where hash(event_id) % 5 = 0"
    )
    # Customers of a new account, and changed ones (one now shares an email with others).
    conn.execute(
        "insert into lake.marts.customer_profiles select * replace ('aaa' as account_id,"
        " md5('n' || customer_id) as customer_id) from lake.marts.customer_profiles"
        " where user_id < 'u-3'"
    )
    conn.execute(
        "update lake.marts.customer_profiles set email_lower = 'shared@example.com',"
        " traits = json_object('changed', customer_id) where user_id in ('u-4', 'u-12')"
    )
    conn.execute("commit")
    conn.close()
    snap = live.snapshot()
    idx = live.index(snap)
    assert idx is not None and idx.events.updated and idx.customers.updated
    assert "aaa_first" in idx.events.action_names and "aaa" in idx.customers.accounts
    full = Index(*idx.key)
    assert_same_events(idx.events, full.events)
    assert_same_customers(idx.customers, full.customers)
    check_profiles(live, sql, snap, profile_probes(sql, snap, 40, 20))
    check_customer_pages(live, sql, snap)
    for after, offset, size in ((None, 0, 100), (None, 3, 4), ("8", 0, 5)):
        assert live.customer_page(snap, "aaa", after, offset, size) == sql.customer_page(
            snap, "aaa", after, offset, size
        )
    for id_type, value in (("userId", "u-1"), ("userId", "u-25"), ("email", "E10@x.com")):
        got = live.customers_by(snap, "aaa", id_type, value, "traits")
        assert got and got == sql.customers_by(snap, "aaa", id_type, value, "traits")
    for account, brand in ACCOUNT_BRANDS:
        for params in [*QUERIES, {"include": "aaa_first"}, {"exclude": "aaa_first,page"}]:
            q = event_query(**params)
            assert live.events(snap, account, brand, q) == sql.events(snap, account, brand, q)


@pytest.fixture(
    scope="module",
    params=[(1, False), (2, False), (2, True)],
    ids=["second_run", "third_run", "third_run_pages_process"],
)
def incremental_snap(
    request: pytest.FixtureRequest, incremental: Incremental
) -> Iterator[tuple[Warehouse, Warehouse, Snapshot]]:
    """A snapshot of an incremental run, read after all runs (as a scroll pinned to it is)."""
    run, pages = request.param
    fast = Warehouse(incremental.paths, pages_process=pages)
    sql = Warehouse(incremental.paths, use_index=False)
    snap = fast.snapshot(incremental.versions[run])
    assert fast.index(snap) is not None
    yield fast, sql, snap
    fast.close()


def test_incremental_event_pages_match_sql(
    incremental_snap: tuple[Warehouse, Warehouse, Snapshot],
) -> None:
    fast, sql, snap = incremental_snap
    for account, brand in ACCOUNT_BRANDS:
        for params in QUERIES:
            q = event_query(**params)
            assert fast.events(snap, account, brand, q) == sql.events(snap, account, brand, q), (
                account,
                brand,
                params,
            )


def test_incremental_profiles_match_sql(
    incremental_snap: tuple[Warehouse, Warehouse, Snapshot],
) -> None:
    fast, sql, snap = incremental_snap
    check_profiles(fast, sql, snap, profile_probes(sql, snap, 6, 3))
    check_customer_pages(fast, sql, snap)


def test_deleted_rows_never_appear(incremental: Incremental) -> None:
    fast = Warehouse(incremental.paths)
    first, last = incremental.versions[0], incremental.versions[-1]
    snap = fast.snapshot(last)
    assert fast.index(snap) is not None

    def gone(table: str, column: str) -> set[str]:
        return {
            r[0]
            for r in fast._query(
                f"select {column} from lake.marts.{table} AT (VERSION => {first}) except"
                f" select {column} from lake.marts.{table} AT (VERSION => {last})"
            )
        }

    gone_records, gone_traits = gone("events", "record"), gone("customer_profiles", "traits")
    gone_metadata = gone("customers", "metadata")
    assert len(gone_records) > 1000 and len(gone_traits) > 100
    seen: list[str] = []
    for account, brand in ACCOUNT_BRANDS:
        for sort in ("asc", "desc"):
            page = 0
            while batch := fast.events(
                snap, account, brand, event_query(sort=sort, offset=100 * page, size=100)
            ):
                seen += batch
                page += 1
    assert seen and not gone_records & set(seen)
    customers = fast._query(
        "select account_id, customer_id, user_id"
        f" from lake.marts.customer_profiles AT (VERSION => {first})"
    )
    for account, customer_id, user_id in customers:
        for id_type, value in (("id", customer_id), ("userId", user_id)):
            if value is None:
                continue
            for _, doc in fast.customers_by(snap, account, id_type, value, "traits"):
                assert doc not in gone_traits
            for _, doc in fast.customers_by(snap, account, id_type, value, "metadata"):
                assert doc not in gone_metadata
    for account in ("shop", "other"):
        for _, doc in fast.customer_page(snap, account, None, 0, 10_000):
            assert doc not in gone_traits


def test_changes_inlined_in_the_catalog_turn_the_index_off(tmp_path: Path) -> None:
    """Small deletes and inserts stay in the catalog (DuckLake's default), where no list of files
    shows them: an index of the files would answer with deleted rows and without new ones."""
    paths = build_lake(tmp_path, customers=50, events=500)
    conn = connect(paths)
    conn.execute("begin")
    # As many rows deleted as inserted: the table's count does not change.
    conn.execute(
        "delete from lake.marts.events where event_id in (md5('e1'), md5('e2'), md5('e3'))"
    )
    conn.execute(
        "insert into lake.marts.events "
        + events_sql("select i, i % 50 as c from range(1, 4) t(i)", run=2)
    )
    conn.execute("commit")
    conn.close()
    fast, sql = Warehouse(paths), Warehouse(paths, use_index=False)
    snap = fast.snapshot()
    assert fast.index(snap) is None
    for account, brand in ACCOUNT_BRANDS:
        q = event_query(size=100, sort="asc")
        assert fast.events(snap, account, brand, q) == sql.events(snap, account, brand, q)


def test_flushed_inlined_changes_are_indexed_as_of_each_snapshot(tmp_path: Path) -> None:
    """Flushing changes inlined in the catalog writes files with the rows (and deletes) of several
    snapshots, which then stand for all of them: read as of each one."""
    paths = build_lake(tmp_path, customers=50, events=500)
    conn = connect(paths)
    first = int(conn.execute("select id from lake.current_snapshot()").fetchall()[0][0])
    for k in range(1, 4):
        conn.execute(f"delete from lake.marts.events where event_id = md5('e{k}')")
        conn.execute(
            "insert into lake.marts.events "
            + events_sql(f"select i, i % 50 as c from range({1000 * k}, {1000 * k + 2}) t(i)", k)
        )
    conn.execute("call ducklake_flush_inlined_data('lake')")
    conn.close()
    fast, sql = Warehouse(paths), Warehouse(paths, use_index=False)
    for v in range(first, fast.snapshot().version + 1):
        snap = fast.snapshot(v)
        assert fast.index(snap) is not None, v
        for account, brand in ACCOUNT_BRANDS:
            q = event_query(size=100)
            assert fast.events(snap, account, brand, q) == sql.events(snap, account, brand, q), v
    found = fast._files_of(first + 1)
    assert found is not None and found[1].upto == first + 1


@pytest.mark.parametrize("changes", [0, 3, 40_000], ids=["none", "few", "many_short_runs"])
def test_merged_strings_keep_old_runs_and_insert_new_ones(changes: int) -> None:
    """Few changes copy the old runs whole, many use one take: both give the same strings."""
    import pyarrow as pa

    from api.index.sorted_arrays import take_merged

    rnd = np.random.default_rng(changes)
    old = pa.array([f"old-{i}" for i in range(100_000)])
    stay = np.sort(rnd.choice(len(old), len(old) - changes, replace=False))
    new = pa.array([f"new-{i}" for i in range(changes)])
    ins = np.sort(rnd.integers(0, len(stay) + 1, changes))
    want = np.insert(np.array(old.to_pylist(), object)[stay], ins, new.to_pylist()).tolist()
    assert take_merged(old, stay, new, ins).to_pylist() == want


def test_memory_only_answers_from_the_index_or_would_block(
    lake: DataPaths, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A traits lookup runs on the event loop only when it needs no I/O; else WouldBlock sends
    it to a worker thread."""
    from api.service import WouldBlock, serving

    monkeypatch.setattr(serving, "SNAPSHOT_MAX_AGE_S", 600.0)  # no catalog re-check in the test
    wh, sql = Warehouse(lake), Warehouse(lake, use_index=False)
    with wh.memory_only(), pytest.raises(WouldBlock):
        wh.snapshot()  # the current snapshot is not known yet
    snap = wh.snapshot()
    assert wh.index(snap) is not None
    with wh.memory_only():
        assert wh.snapshot() == snap
        got = wh.customers_by(snap, "shop", "userId", "u-1", "traits")
    assert got and got == sql.customers_by(snap, "shop", "userId", "u-1", "traits")
    sql.snapshot()
    with sql.memory_only(), pytest.raises(WouldBlock):
        sql.customers_by(snap, "shop", "userId", "u-1", "traits")  # no index: SQL on the lake
    with wh.memory_only(), pytest.raises(WouldBlock):
        wh.snapshot(snap.version - 1)  # a scroll's older snapshot: its freshness is read


def test_snapshot_recheck_answers_from_memory_and_reads_in_the_background(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past SNAPSHOT_MAX_AGE_S with the catalog's files unchanged, a request still answers from
    memory (no WouldBlock: no worker thread, no catalog query in the request), while the
    snapshot is read again in the background: a commit the files' stats missed is seen soon."""
    import time

    from api.service import serving

    paths = build_lake(tmp_path, customers=20, events=200)
    monkeypatch.setattr(serving, "SNAPSHOT_MAX_AGE_S", 0.0)
    wh = Warehouse(paths)
    monkeypatch.setattr(wh, "_catalog_signature", lambda: ("stats that miss every change",))
    before = wh.snapshot().version
    conn = connect(paths)
    conn.execute("delete from lake.marts.events where event_id = md5('e1')")
    conn.close()
    seen = []
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with wh.memory_only():
            seen.append(wh._current_version())
        if seen[-1] > before:
            break
        time.sleep(0.01)
    wh.close()
    assert seen[0] == before
    assert seen[-1] == before + 1


def test_a_commit_to_a_big_lake_is_read_in_the_background_not_in_the_request(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once answers come from an index built in the background, a changed catalog (a pass
    commits, or writes its WAL, many times) is read on the re-check thread: the request answers
    from memory with the snapshot it serves, and the commit is seen soon after. A small lake's
    change is still read in the request (read-your-writes right after a pass)."""
    import time

    from api.service import WouldBlock, serving

    paths = build_lake(tmp_path, customers=20, events=200)
    monkeypatch.setattr(serving, "SNAPSHOT_MAX_AGE_S", 600.0)  # no age re-check in the test
    small = Warehouse(paths)
    snap = small.snapshot()
    assert small.index(snap) is not None  # built in the request: small
    monkeypatch.setattr(serving, "INLINE_BUILD_BYTES", 0)  # from now on, a big lake
    big = Warehouse(paths)
    first = big.snapshot()
    deadline = time.monotonic() + 30
    while big.index(big.snapshot()) is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert big.index(first) is not None
    conn = connect(paths)
    conn.execute("delete from lake.marts.events where event_id = md5('e1')")
    conn.close()
    seen = []
    while time.monotonic() < deadline:
        with big.memory_only():  # WouldBlock here: a catalog query in the request
            seen.append(big._current_version())
        if seen[-1] > first.version:
            break
        time.sleep(0.01)
    assert seen[0] == first.version
    assert seen[-1] == first.version + 1
    monkeypatch.setattr(serving, "INLINE_BUILD_BYTES", 1 << 40)  # small again
    conn = connect(paths)
    conn.execute("delete from lake.marts.events where event_id = md5('e2')")
    conn.close()
    with small.memory_only(), pytest.raises(WouldBlock):
        small._current_version()  # changed catalog, small lake: read in the request
    assert small._current_version() == first.version + 2
    big.close()
    small.close()


def test_row_group_cache_keeps_the_most_recently_read_within_its_budget() -> None:
    import pyarrow as pa

    from api.index.cache import GroupCache

    chunks = {n: pa.chunked_array([pa.array([n * 100] * 10)]) for n in "abc"}
    cache = GroupCache(budget=2 * chunks["a"].nbytes)
    decoded: list[str] = []

    def get(rg: int, name: str) -> pa.ChunkedArray:
        def read() -> pa.ChunkedArray:
            decoded.append(name)
            return chunks[name]

        return cache.get(("file.parquet", rg, "record"), read)

    assert get(0, "a") is chunks["a"]
    get(1, "b")
    assert get(0, "a") is chunks["a"]  # a hit, and now the most recent
    get(2, "c")  # over budget: b, the least recently read, goes
    get(0, "a")
    get(1, "b")
    assert decoded == ["a", "b", "c", "b"]
    assert cache.bytes <= cache.budget
    big = GroupCache(budget=1)
    big.get(("f", 0, "c"), lambda: chunks["a"])
    assert big.bytes == 0  # bigger than the whole budget: returned, not kept


def test_records_are_decoded_once_and_read_from_the_row_group_cache(
    lake: DataPaths, monkeypatch: pytest.MonkeyPatch
) -> None:
    from api.index import cache

    here = Warehouse(lake)  # the events index in this process, where the patch below applies
    idx = here.index(here.snapshot())
    assert idx is not None
    positions = idx.events.page("shop", "SHOP", event_query(size=100), None)
    first = idx.events.records(positions)
    decodes: list[Any] = []
    real = cache.Rows._decode

    def counting(self: Any, f: int, rg: int, column: str) -> Any:
        decodes.append((f, rg, column))
        return real(self, f, rg, column)

    monkeypatch.setattr(cache.Rows, "_decode", counting)
    monkeypatch.setattr(cache, "row_groups", cache.GroupCache(1 << 30))
    assert idx.events.records(positions) == first  # cold cache: decoded
    cold = len(decodes)
    assert cold >= 1
    assert idx.events.records(positions) == first  # warm: the same records, nothing decoded
    assert len(decodes) == cold


def test_a_big_lake_reads_a_new_snapshots_freshness_in_the_background(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A commit that leaves the marts' files as they are (most of a pass's) gets a new snapshot
    whose index is the one serving: its freshness is read by the builder before it is served,
    never in a request (WouldBlock here), and then it is served."""
    import time

    from api.service import serving

    paths = build_lake(tmp_path, customers=20, events=200)
    monkeypatch.setattr(serving, "INLINE_BUILD_BYTES", 0)  # a big lake
    monkeypatch.setattr(serving, "SNAPSHOT_MAX_AGE_S", 600.0)
    wh = Warehouse(paths)
    deadline = time.monotonic() + 30
    while wh.index(wh.snapshot()) is None and time.monotonic() < deadline:
        time.sleep(0.01)
    first = wh.snapshot()
    assert wh.index(first) is not None
    conn = connect(paths)
    conn.execute("create table lake.main.other_commit as select 1 as x")
    conn.close()
    seen = [first]
    while seen[-1].version == first.version and time.monotonic() < deadline:
        time.sleep(0.01)
        with wh.memory_only():
            seen.append(wh.snapshot())
    wh.close()
    assert seen[-1].version == first.version + 1
    assert seen[-1].built_at == first.built_at  # the marts' freshness, read at the new version


def test_commits_that_leave_the_served_marts_are_not_listed_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A snapshot whose commits since the last listed one changed no served mart (an
    intermediate model's, most of a pass's) takes that one's files and freshness from DuckLake's
    list of snapshot changes; one that changed a mart, or a mart's table replaced, is listed."""
    paths = build_lake(tmp_path, customers=20, events=200)
    wh = Warehouse(paths)
    listed: list[int] = []
    table_files = Warehouse._table_files

    def counting(self: Warehouse, table: str, version: int) -> Any:
        listed.append(version)
        return table_files(self, table, version)

    monkeypatch.setattr(Warehouse, "_table_files", counting)
    first = wh.snapshot()
    key = wh._files_of(first.version)
    assert key is not None and listed == [first.version, first.version]

    def commit(sql: str) -> int:
        conn = connect(paths)
        conn.execute(sql)
        conn.close()
        return wh._read_version(None)

    conn = connect(paths)
    conn.execute("create schema if not exists lake.intermediate")
    conn.close()  # a schema change: listed again, to be safe
    schema = wh._read_version(None)
    assert wh._files_of(schema) == key and listed[-1] == schema
    wh.snapshot(schema)
    # Two commits to an intermediate table: both answered from the list of changes.
    created = commit("create table lake.intermediate.t as select 1 as x")
    inserted = commit("insert into lake.intermediate.t values (2)")
    listed.clear()
    assert wh._files_of(inserted) == key and listed == []
    assert wh.snapshot(inserted).built_at == first.built_at
    assert wh._files_of(created) == key and listed == []
    # A commit to events: listed, and its files differ.
    changed = commit("delete from lake.marts.events where hash(event_id) % 7 = 0")
    moved = wh._files_of(changed)
    assert listed == [changed, changed] and moved is not None and moved[1] != key[1]
    wh.snapshot(changed)
    # freshness replaced, as dbt's table materialization does it: listed again.
    listed.clear()
    replaced = commit(
        "create or replace table lake.marts.freshness as"
        " select now() as built_at, now() as data_through"
    )
    assert wh._files_of(replaced) == moved and listed == [replaced, replaced]
    assert wh.snapshot(replaced).built_at != first.built_at
    wh.close()


def test_a_pages_process_updates_its_events_index_pass_by_pass(tmp_path: Path) -> None:
    """As the API follows a pipeline's passes: the pages process updates its events index from
    the previous pass's (not a build from all the files) and its pages are SQL's."""
    paths = build_lake(tmp_path)
    conn = connect(paths)
    conn.execute("call lake.set_option('data_inlining_row_limit', 0, schema => 'marts')")
    conn.close()
    live, sql = Warehouse(paths, pages_process=True), Warehouse(paths, use_index=False)
    try:
        first = live.index(live.snapshot())
        assert first is not None and first.events is None and not first.events_updated
        for run, changed in ((2, "{c} % 3 = 0"), (3, "{c} % 4 = 1")):
            version = incremental_pass(paths, run, changed)
            idx = live.index(version)
            assert idx is not None and idx.events is None  # its events are over there
            assert idx.events_updated and idx.customers.updated
            snap = live.snapshot(version)
            for account, brand in ACCOUNT_BRANDS:
                for params in QUERIES:
                    q = event_query(**params)
                    assert live.events(snap, account, brand, q) == sql.events(
                        snap, account, brand, q
                    ), (run, account, brand, params)
    finally:
        live.close()


def test_event_pages_outlive_their_process(tmp_path: Path) -> None:
    """The pages process killed: the next page is still right (from SQL), the index is built
    again in a new pages process, and pages come from it."""
    paths = build_lake(tmp_path)
    live, sql = Warehouse(paths, pages_process=True), Warehouse(paths, use_index=False)
    try:
        snap = live.snapshot()
        q = event_query(size=50, exclude="page")
        want = sql.events(snap, "shop", "SHOP", q)
        assert want and live.events(snap, "shop", "SHOP", q) == want
        assert live.pages is not None
        pid = live.pages.pid
        assert pid is not None and pid != os.getpid()
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while live.pages.pid is not None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert live.events(snap, "shop", "SHOP", q) == want  # from SQL: the index is gone
        idx = live.index(snap)  # built again (a small lake: in the request)
        assert idx is not None and idx.events is None
        new_pid = live.pages.pid
        assert new_pid is not None and new_pid != pid
        assert live.events(snap, "shop", "SHOP", q) == want
        assert idx.event_records("shop", "SHOP", q, None) == want  # from the new process
        assert live.index_status()["pagesProcess"] == new_pid
    finally:
        live.close()
    assert live.pages.pid is None  # close() stopped it
