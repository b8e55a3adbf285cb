"""Folding the tables passes append candidates to: each table's rule (a DuckDB table macro the dbt
project defines) combines a key's rows into what the view over the table shows; compaction keeps
only that. The folds are declared in the dbt project (`meta.fold`), read from dbt's manifest."""

from __future__ import annotations

import json
from dataclasses import dataclass

import duckdb

from mallard.paths import DataPaths


@dataclass(frozen=True)
class Fold:
    """A table that passes append rows to, and the rule (a DuckDB table macro in its schema,
    defined once in dbt_project/macros/folds.sql) that combines its rows per `key`. With
    `candidate` (the column telling a key's rows apart), the rule picks one row per key:
    compaction deletes the others. Without, the rule merges a key's rows into one: compaction
    replaces them with it. `unread`: columns the rule does not read, left out of the rows it
    is given."""

    rule: str
    key: tuple[str, ...]
    candidate: str | None = None
    unread: tuple[str, ...] = ()


def declared_folds(paths: DataPaths) -> dict[tuple[str, str], Fold]:
    """The folds the dbt project declares (`meta.fold` of a model), by (schema, table), read from
    the manifest dbt wrote; none before dbt has parsed the project."""
    try:
        manifest = json.loads((paths.dbt_target / "manifest.json").read_text())
    except FileNotFoundError:
        return {}
    folds = {}
    for node in manifest.get("nodes", {}).values():
        fold = ((node.get("config") or {}).get("meta") or {}).get("fold")
        if node.get("resource_type") == "model" and fold:
            folds[(node["schema"], node["alias"])] = Fold(
                fold["rule"],
                tuple(fold["key"]),
                fold.get("candidate"),
                tuple(fold.get("unread", ())),
            )
    return folds


def _delete_matching(source: str, match: str) -> str:
    return f"delete from {source} as t where exists (select 1 from fold_out as o where {match})"


def fold_candidates(conn: duckdb.DuckDBPyConnection, schema: str, table: str, fold: Fold) -> int:
    """Fold the table by its rule; how many rows it deleted. Only the keys with more than one row
    are combined (found by a hash of the key: a collision only combines a key more), by the rule
    over their rows alone: a filter on the view does not reach below its window or grouping.
    None before the rule exists (a lake of an earlier version, before the pass that builds the
    views). At 10M messages, ranking every event object key took 9.5 s; finding the keys with
    more than one and ranking theirs, ~3 s after a +100k pass."""
    found = conn.execute(
        "select 1 from duckdb_functions() where database_name = 'lake'"
        " and schema_name = ? and function_name = ? and function_type = 'table_macro'",
        [schema, fold.rule],
    ).fetchone()
    if not found:
        return 0
    source = f"lake.{schema}.{table}"
    combined = f"select * from lake.{schema}.{fold.rule}('fold_rows')"
    key_hash = f"hash({', '.join(fold.key)})"
    conn.execute(
        f"create or replace temp table fold_keys as select {key_hash} as key_hash"
        f" from {source} group by key_hash having count(*) > 1"
    )
    try:
        keys = conn.execute("select count(*) from fold_keys").fetchone()
        if not keys or not keys[0]:
            return 0
        unread = f" exclude ({', '.join(fold.unread)})" if fold.unread else ""
        conn.execute(
            f"create or replace temp table fold_rows as select *{unread} from {source}"
            f" where {key_hash} in (select key_hash from fold_keys)"
        )
        if fold.candidate is not None:
            cols = ", ".join((*fold.key, fold.candidate))
            conn.execute(
                f"create or replace temp table fold_out as select {cols} from fold_rows"
                f" except select {cols} from ({combined})"
            )
            match = " and ".join(f"o.{c} = t.{c}" for c in (*fold.key, fold.candidate))
            row = conn.execute(_delete_matching(source, match)).fetchone()
            return int(row[0]) if row else 0
        conn.execute(f"create or replace temp table fold_out as {combined}")
        match = " and ".join(f"o.{c} = t.{c}" for c in fold.key)
        conn.execute("begin")
        try:
            row = conn.execute(_delete_matching(source, match)).fetchone()
            conn.execute(f"insert into {source} by name select * from fold_out")
            conn.execute("commit")
        except BaseException:
            conn.execute("rollback")
            raise
        deleted = int(row[0]) if row else 0
        inserted = conn.execute("select count(*) from fold_out").fetchone()
        return deleted - (int(inserted[0]) if inserted else 0)
    finally:
        for temp in ("fold_keys", "fold_rows", "fold_out"):
            conn.execute(f"drop table if exists {temp}")
