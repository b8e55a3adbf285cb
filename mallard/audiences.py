"""Audiences as code: `config/audiences/<name>.sql` files, each a select of customer ids over the
marts, read and evaluated one by one so that a broken file fails alone and names itself.

The dbt model `int_audience_matches` (dbt_project/models/intermediate/int_audience_matches.py)
calls `evaluate` on every pass; `mallard audiences check` calls `check`. docs/audiences.md has
the file format and the membership rules.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mallard.regulations import identifier_hash_sql

# A name is a path segment of the audiences API and a JSON string in audiencesStatic.
NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_-]{0,99}$")
# What an audience's select reads unqualified, as in `mallard sql` (mallard/sql_shell.py).
SEARCH_PATH = "lake.marts,lake.main"
# The environment variable the orchestrator sets for dbt (orchestration/environment.py).
DIR_ENV = "MALLARD_AUDIENCES_DIR"
# The columns of int_audience_matches, in order.
COLUMNS = ("audience", "file", "customer_id", "error")


class AudienceError(Exception):
    """An audience file that does not load or does not run."""


@dataclass(frozen=True)
class AudienceFile:
    name: str
    path: Path
    sql: str  # the select, without a trailing semicolon
    error: str | None = None  # why the file is unusable before it runs


def audiences_dir(config_dir: Path) -> Path:
    return config_dir / "audiences"


def read_audiences(directory: Path) -> list[AudienceFile]:
    """Every `*.sql` file of the directory, by name; a file that cannot be used carries its
    error instead of failing the others."""
    if not directory.is_dir():
        return []
    out = []
    for path in sorted(directory.glob("*.sql")):
        if not path.is_file() or path.name.startswith("."):
            continue
        name = path.stem
        try:
            sql = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            out.append(AudienceFile(name, path, "", f"cannot read the file: {e}"))
            continue
        sql = strip_select(sql)
        error = None
        if not NAME.match(name):
            error = "the name (file name without .sql) must be letters, digits, _ or -, at most 100"
        elif not sql:
            error = "the file holds no select"
        out.append(AudienceFile(name, path, sql, error))
    return out


def strip_select(sql: str) -> str:
    """The select without surrounding blanks and trailing semicolons. A `--` comment on the last
    line would swallow the closing parenthesis of the subquery it is wrapped in: hence the
    newline before it (member_query)."""
    sql = sql.strip()
    while sql.endswith(";"):
        sql = sql[:-1].rstrip()
    return sql


def member_query(sql: str) -> str:
    """The distinct customer ids an audience's select returns."""
    return (
        f"select distinct customer_id::varchar as customer_id from (\n{sql}\n)"
        " where customer_id is not null"
    )


def first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def bind(con: Any, audience: AudienceFile) -> None:
    """Raise AudienceError unless the select binds and has a customer_id column (no data read)."""
    if audience.error:
        raise AudienceError(audience.error)
    try:
        columns = [r[0] for r in con.execute(f"describe (\n{audience.sql}\n)").fetchall()]
    except Exception as e:
        raise AudienceError(first_line(e)) from e
    if "customer_id" not in columns:
        raise AudienceError(f"selects no customer_id column (it selects {', '.join(columns)})")


def _set_search_path(con: Any, path: str) -> str:
    before = con.execute("select current_setting('search_path')").fetchone()[0]
    con.execute(f"set search_path = '{path}'")
    return str(before)


def _customers_standin(con: Any) -> bool:
    """On a data dir's first pass the `customers` view does not exist yet when the audiences run
    (it reads audience_members, built after them): a temp view of customer_profiles stands in
    for it, with the same columns and a null metadata. Temp views resolve before the search
    path. Whether it was made."""
    exists = con.execute(
        "select count(*) from duckdb_views() where database_name = 'lake'"
        " and schema_name = 'marts' and view_name = 'customers'"
    ).fetchone()[0]
    if exists:
        return False
    con.execute(
        "create temp view customers as select customer_id, client_id, account_id, user_id,"
        " email_lower, subscription_id, traits, cast(null as json) as metadata, created_time,"
        " created_event_id, last_activity_time from lake.marts.customer_profiles"
    )
    return True


def evaluate(
    con: Any, directory: Path, regulated: list[tuple[str, str]], key: str, result: str
) -> None:
    """Fill the temp table `result` (COLUMNS) from every audience file of the directory: one row
    per audience with a null customer_id, its file and its error (null when it ran), and one row
    per (audience, customer id its select returns), less the regulated customers: `regulated`
    holds (account_id, keyed hash of the userId) of suppressed and deleted users. Each file runs
    in a statement of its own: one that fails leaves its members out and its error in, and the
    others run. Only the ids are kept: a pass writes this whole table, while the members'
    tenancy columns are looked up for the customers who enter (audience_members)."""
    con.execute(
        f"create or replace temp table {result}"
        " (audience varchar, file varchar, customer_id varchar, error varchar)"
    )
    regulated_customers(con, regulated, key)
    before = _set_search_path(con, SEARCH_PATH)
    standin = _customers_standin(con)
    try:
        for audience in read_audiences(directory):
            error = None
            try:
                bind(con, audience)
                con.execute(
                    f"insert into {result} (audience, customer_id)"
                    " select ?, customer_id from (" + member_query(audience.sql) + ")"
                    " where customer_id not in (from mallard_regulated_customers)",
                    [audience.name],
                )
            except AudienceError as e:
                error = str(e)
            except Exception as e:  # a runtime error of the select (a cast, a division)
                error = first_line(e)
            con.execute(
                f"insert into {result} (audience, file, error) values (?, ?, ?)",
                [audience.name, audience.path.name, error],
            )
    finally:
        con.execute(f"set search_path = '{before}'")
        if standin:
            con.execute("drop view customers")
        con.execute("drop table mallard_regulated_customers")


def regulated_customers(con: Any, regulated: list[tuple[str, str]], key: str) -> None:
    """The temp table `mallard_regulated_customers` (customer_id): the customers whose userId
    `regulated` lists (account_id, keyed hash). The hash is computed only in the accounts with a
    regulated user: a lake without any pays nothing for it."""
    con.execute("create or replace temp table mallard_regulated_customers (customer_id varchar)")
    if not regulated:
        return
    con.execute(
        "create or replace temp table mallard_regulated (account_id varchar, id_hash varchar)"
    )
    con.executemany("insert into mallard_regulated values (?, ?)", regulated)
    con.execute(
        f"""
        insert into mallard_regulated_customers
        select profiles.customer_id
        from lake.marts.customer_profiles as profiles
        semi join mallard_regulated as regulated
            on profiles.account_id = regulated.account_id
            and {identifier_hash_sql("profiles.account_id", "profiles.user_id")} = regulated.id_hash
        where profiles.account_id in (select account_id from mallard_regulated)
            and profiles.user_id is not null
        """,
        {"key": key},
    )
    con.execute("drop table mallard_regulated")


def regulated_users(data_dir: Path) -> tuple[list[tuple[str, str]], str]:
    """(account_id, userId hash) of every suppressed user and every deleted one (tombstones), and
    the key of the hashes."""
    from mallard.paths import DataPaths
    from mallard.regulations import SUPPRESS, USER, existing_store, hash_key

    paths = DataPaths(data_dir)
    store = existing_store(paths)
    if store is None:
        return [], hash_key(paths)
    try:
        rows = {
            (account, h)
            for account, lists in store.lists().items()
            for h in lists.get(SUPPRESS, frozenset())
        }
        rows |= {(a, h) for a, kind, h, _ in store.tombstones() if kind == USER}
        return sorted(rows), store.key
    finally:
        store.close()


def build(con: Any, result: str) -> None:
    """What the dbt model runs: the audience files of `$MALLARD_AUDIENCES_DIR` evaluated into the
    temp table `result`, with the regulations of `$MALLARD_DATA_DIR`."""
    directory = Path(os.environ.get(DIR_ENV) or "/nonexistent")
    regulated, key = regulated_users(Path(os.environ["MALLARD_DATA_DIR"]))
    evaluate(con, directory, regulated, key, result)


@dataclass(frozen=True)
class CheckResult:
    name: str
    ok: bool
    line: str


def check(con: Any | None, directory: Path) -> list[CheckResult]:
    """Each file read and, with a connection to the lake, bound against the marts (no data read)."""
    out = []
    for audience in read_audiences(directory):
        try:
            if con is None:
                if audience.error:
                    raise AudienceError(audience.error)
            else:
                before = _set_search_path(con, SEARCH_PATH)
                try:
                    bind(con, audience)
                finally:
                    con.execute(f"set search_path = '{before}'")
        except AudienceError as e:
            out.append(CheckResult(audience.name, False, f"FAIL {audience.path.name}: {e}"))
            continue
        out.append(CheckResult(audience.name, True, f"ok   {audience.path.name}"))
    return out
