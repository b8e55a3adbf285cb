"""Who a regulation's subject is in the lake, and which rows of which table are theirs.

One definition serves Delete, Access and the proof after a Delete: the rows an Access zip
exports are the rows a Delete of the same subject removes.

A subject is an account's userIds. The models tie to them (read from the models, not worked out
again here): customer ids (marts.customer_profiles), anonymousIds (int_identity_map: an
anonymousId belongs to the first userId it was identified with), emails and subscription ids
(customer_profiles), and the messageIds of their messages.

A table's rows belong to the subject by the first of these columns it has:
1. `customer_id`: one of the subject's customer ids;
2. `user_id` (with `account_id`): one of the userIds, or, with `anonymous_id`, no userId and one
   of the subject's anonymousIds (their anonymous messages);
3. `message_id` (with `account_id`): one of the subject's messageIds.
A table with none of them holds no subject rows by this rule; the proof after a Delete searches
every text column of every table anyway, so a model that keeps identifiers under other names
fails the Delete rather than keeping them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import duckdb

# Schemas of the lake that hold no rows of a subject (the pass manifest).
SCHEMAS_WITHOUT_SUBJECTS: tuple[str, ...] = ()


@dataclass
class Subject:
    account_id: str
    user_ids: list[str]
    customer_ids: list[str] = field(default_factory=list)
    anonymous_ids: list[str] = field(default_factory=list)
    emails: list[str] = field(default_factory=list)
    subscription_ids: list[str] = field(default_factory=list)
    message_ids: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, object]:
        return {
            "accountId": self.account_id,
            "userIds": self.user_ids,
            "customerIds": self.customer_ids,
            "anonymousIds": self.anonymous_ids,
            "emails": self.emails,
            "subscriptionIds": self.subscription_ids,
            "messageIds": self.message_ids,
        }

    @classmethod
    def from_json(cls, data: dict[str, list[str]]) -> Subject:
        return cls(
            str(data["accountId"]),
            list(data["userIds"]),
            list(data["customerIds"]),
            list(data["anonymousIds"]),
            list(data["emails"]),
            list(data["subscriptionIds"]),
            list(data["messageIds"]),
        )

    def merge(self, other: Subject) -> Subject:
        """Both sets of identifiers (a run that resolves again after part of a Delete keeps
        what the first resolution found, whose rows may be gone from the lake by now)."""

        def both(a: list[str], b: list[str]) -> list[str]:
            return list(dict.fromkeys([*a, *b]))

        return Subject(
            self.account_id,
            both(self.user_ids, other.user_ids),
            both(self.customer_ids, other.customer_ids),
            both(self.anonymous_ids, other.anonymous_ids),
            both(self.emails, other.emails),
            both(self.subscription_ids, other.subscription_ids),
            both(self.message_ids, other.message_ids),
        )

    def strings(self) -> list[str]:
        """Every identifier a search for leftovers looks for (customer ids too)."""
        return list(
            dict.fromkeys(
                [
                    *self.user_ids,
                    *self.anonymous_ids,
                    *self.emails,
                    *self.subscription_ids,
                    *self.customer_ids,
                ]
            )
        )


def _exists(conn: duckdb.DuckDBPyConnection, schema: str, table: str) -> bool:
    row = conn.execute(
        "select count(*) from information_schema.tables where table_catalog = 'lake'"
        " and table_schema = ? and table_name = ?",
        [schema, table],
    ).fetchone()
    return bool(row and row[0])


def resolve(conn: duckdb.DuckDBPyConnection, account_id: str, user_ids: list[str]) -> Subject:
    """The subject's identifiers as the lake's models have them now."""
    subject = Subject(account_id, list(user_ids))
    params = {"account": account_id, "users": list(user_ids)}
    if _exists(conn, "marts", "customer_profiles"):
        rows = conn.execute(
            """
            select customer_id, email_lower, subscription_id, anonymous_id,
                traits ->> 'email' as email
            from lake.marts.customer_profiles
            where account_id = $account and user_id in (select unnest($users))
            """,
            params,
        ).fetchall()
        subject.customer_ids = sorted({r[0] for r in rows if r[0]})
        subject.emails = sorted({e for r in rows for e in (r[1], r[4]) if e})
        subject.subscription_ids = sorted({r[2] for r in rows if r[2]})
        subject.anonymous_ids = sorted({r[3] for r in rows if r[3]})
    if _exists(conn, "intermediate", "int_identity_map"):
        anon = conn.execute(
            """
            select distinct anonymous_id from lake.intermediate.int_identity_map
            where account_id = $account and user_id in (select unnest($users))
            """,
            params,
        ).fetchall()
        subject.anonymous_ids = sorted({*subject.anonymous_ids, *(r[0] for r in anon)})
    if _exists(conn, "raw", "messages"):
        where = _user_rule(has_anonymous=True)
        rows = conn.execute(
            f"select distinct message_id from lake.raw.messages where {where}",
            _params(subject, where),
        ).fetchall()
        subject.message_ids = sorted(r[0] for r in rows if r[0])
    return subject


def _user_rule(has_anonymous: bool) -> str:
    anon = (
        " or (user_id is null and anonymous_id in (select unnest($anonymous_ids)))"
        if has_anonymous
        else ""
    )
    return f"account_id = $account and (user_id in (select unnest($user_ids)){anon})"


def _params(subject: Subject, where: str) -> dict[str, object]:
    """The parameters `where` names (DuckDB refuses others)."""
    values = {
        "account": subject.account_id,
        "user_ids": subject.user_ids,
        "anonymous_ids": subject.anonymous_ids,
    }
    return {k: v for k, v in values.items() if f"${k}" in where}


@dataclass(frozen=True)
class Selection:
    """The subject's rows of one table: `where` with `params` (DuckDB named parameters)."""

    schema: str
    table: str
    where: str
    params: dict[str, object]

    @property
    def name(self) -> str:
        return f"{self.schema}.{self.table}"

    @property
    def relation(self) -> str:
        return f'lake."{self.schema}"."{self.table}"'


def selection(subject: Subject, schema: str, table: str, columns: set[str]) -> Selection | None:
    """The subject's rows of a table with these columns, by the rule in the module docstring;
    None for a table the rule finds no subject column in."""
    if "customer_id" in columns:
        return Selection(
            schema,
            table,
            "customer_id in (select unnest($customer_ids))",
            {"customer_ids": subject.customer_ids},
        )
    if {"user_id", "account_id"} <= columns:
        where = _user_rule("anonymous_id" in columns)
        return Selection(schema, table, where, _params(subject, where))
    if {"message_id", "account_id"} <= columns:
        return Selection(
            schema,
            table,
            "account_id = $account and message_id in (select unnest($message_ids))",
            {"account": subject.account_id, "message_ids": subject.message_ids},
        )
    return None


def lake_tables(conn: duckdb.DuckDBPyConnection) -> dict[tuple[str, str], dict[str, str]]:
    """Every base table of the lake (views hold no rows of their own): its columns and types."""
    rows = conn.execute(
        """
        select c.table_schema, c.table_name, c.column_name, c.data_type
        from information_schema.columns as c
        join information_schema.tables as t using (table_catalog, table_schema, table_name)
        where c.table_catalog = 'lake' and t.table_type = 'BASE TABLE'
        order by c.table_schema, c.table_name, c.ordinal_position
        """
    ).fetchall()
    out: dict[tuple[str, str], dict[str, str]] = {}
    for schema, table, column, dtype in rows:
        if schema not in SCHEMAS_WITHOUT_SUBJECTS:
            out.setdefault((schema, table), {})[column] = dtype
    return out


def selections(conn: duckdb.DuckDBPyConnection, subject: Subject) -> list[Selection]:
    """The subject's rows in every base table of the lake that has them by the rule."""
    out = []
    for (schema, table), columns in lake_tables(conn).items():
        sel = selection(subject, schema, table, set(columns))
        if sel is not None:
            out.append(sel)
    return out


def count(conn: duckdb.DuckDBPyConnection, sel: Selection) -> int:
    row = conn.execute(
        f"select count(*) from {sel.relation} where {sel.where}", sel.params
    ).fetchone()
    return int(row[0]) if row else 0
