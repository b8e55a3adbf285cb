"""mallard.audiences: files read, each evaluated alone, regulated customers left out."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest

from mallard.audiences import check, evaluate, read_audiences, strip_select
from mallard.regulations import identifier_hash

KEY = "k" * 64


@pytest.fixture
def con() -> duckdb.DuckDBPyConnection:
    c = duckdb.connect()
    c.execute("attach ':memory:' as lake")
    c.execute("create schema lake.marts")
    c.execute(
        "create table lake.marts.customer_profiles as select * from (values"
        " ('c1', 'acme', 'shop', 'u1', '{\"plan\": \"pro\"}'::json),"
        " ('c2', 'acme', 'shop', 'u2', '{\"plan\": \"free\"}'::json),"
        " ('c3', 'acme', 'shop', 'u3', '{\"plan\": \"pro\"}'::json),"
        " ('c4', 'rival', 'rival', 'u1', '{\"plan\": \"pro\"}'::json)"
        ") as t(customer_id, client_id, account_id, user_id, traits)"
    )
    # The other columns the first-pass stand-in for `customers` selects.
    c.execute(
        "alter table lake.marts.customer_profiles add column email_lower varchar;"
        "alter table lake.marts.customer_profiles add column subscription_id varchar;"
        "alter table lake.marts.customer_profiles add column created_time timestamptz;"
        "alter table lake.marts.customer_profiles add column created_event_id varchar;"
        "alter table lake.marts.customer_profiles add column last_activity_time timestamptz;"
    )
    c.execute(
        "create view lake.marts.customers as select customer_id, client_id, account_id,"
        " user_id, traits from lake.marts.customer_profiles"
    )
    return c


def write(d: Path, name: str, sql: str) -> None:
    d.mkdir(exist_ok=True)
    (d / f"{name}.sql").write_text(sql)


def rows(con: duckdb.DuckDBPyConnection) -> list[tuple[object, ...]]:
    return con.execute("select * from result order by all").fetchall()


def test_strip_select_drops_trailing_semicolons() -> None:
    assert strip_select("  select 1 ;; \n") == "select 1"


def test_names_and_empty_files_carry_errors(tmp_path: Path) -> None:
    write(tmp_path, "ok_name-1", "select 1 as customer_id")
    write(tmp_path, "bad name", "select 1 as customer_id")
    write(tmp_path, "empty", " ;\n")
    found = {a.name: a.error for a in read_audiences(tmp_path)}
    assert found["ok_name-1"] is None
    assert "name" in (found["bad name"] or "")
    assert "no select" in (found["empty"] or "")
    assert read_audiences(tmp_path / "missing") == []


def test_each_file_runs_alone(tmp_path: Path, con: duckdb.DuckDBPyConnection) -> None:
    write(
        tmp_path, "pro", "select customer_id from customers\nwhere traits->>'plan' = 'pro' -- end"
    )
    write(tmp_path, "unknown_column", "select customer_id from customers where nope = 1")
    write(tmp_path, "no_id", "select user_id from customers")
    write(tmp_path, "runtime", "select customer_id from customers where (traits->>'plan')::int = 1")
    evaluate(con, tmp_path, [], KEY, "result")
    status = {r[0]: r[3] for r in rows(con) if r[2] is None}
    assert status["pro"] is None
    assert "nope" in status["unknown_column"]
    assert "no customer_id column" in status["no_id"]
    assert "Conversion" in status["runtime"]
    members = [(r[0], r[2]) for r in rows(con) if r[2] is not None]
    assert members == [("pro", "c1"), ("pro", "c3"), ("pro", "c4")]
    # The connection's search path is put back.
    assert con.execute("select current_setting('search_path')").fetchone() == ("",)


def test_regulated_users_are_in_none(tmp_path: Path, con: duckdb.DuckDBPyConnection) -> None:
    write(tmp_path, "pro", "select customer_id from customers where traits->>'plan' = 'pro';")
    # u1 regulated in account shop only: the rival account's u1 (c4) stays.
    evaluate(con, tmp_path, [("shop", identifier_hash(KEY, "shop", "u1"))], KEY, "result")
    assert [r[2] for r in rows(con) if r[2] is not None] == ["c3", "c4"]


def test_a_stand_in_for_customers_on_a_first_pass(
    tmp_path: Path, con: duckdb.DuckDBPyConnection
) -> None:
    con.execute("drop view lake.marts.customers")
    write(
        tmp_path, "pro", "select customer_id, metadata from customers where traits->>'plan' = 'pro'"
    )
    evaluate(con, tmp_path, [], KEY, "result")
    assert [r[2] for r in rows(con) if r[2] is not None] == ["c1", "c3", "c4"]
    assert con.execute(
        "select count(*) from duckdb_views() where view_name = 'customers'"
    ).fetchone() == (0,)


def test_check_binds_without_reading(tmp_path: Path, con: duckdb.DuckDBPyConnection) -> None:
    write(tmp_path, "pro", "select customer_id from customers")
    write(tmp_path, "broken", "select customer_id from nowhere")
    lines = {r.name: (r.ok, r.line) for r in check(con, tmp_path)}
    assert lines["pro"] == (True, "ok   pro.sql")
    assert lines["broken"][0] is False and lines["broken"][1].startswith("FAIL broken.sql: ")
