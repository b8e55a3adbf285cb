"""One writer of the lake at a time among dbt's threads, so dbt can run models side by side.

DuckLake (1.5.5, build d8a1881e) keeps a SQLite read transaction on its catalog from a DuckDB
transaction's first read of the lake until its commit, and SQLite refuses that read
transaction's upgrade to a writer once another connection committed since, at once and without
the busy timeout ("database is locked"; duckdb/ducklake#1309, retried upstream since
ducklake#1420). Two dbt threads that write the lake at the same time therefore fail each other's
commits. Reads never do: a statement that only reads the lake commits nothing to the catalog.

So while dbt runs in this process (`orchestration/dbt_in_process.py`) with several threads:
- a model's transaction holds the writers' lock from its BEGIN to its COMMIT or rollback, so its
  first read of the catalog comes after the last writer's commit and no writer commits before it;
- a statement outside a transaction holds it while it runs, unless it only reads the lake (a
  query, a temp table or a table of dbt's in-memory database built from the lake, a variable);
- a data test's transaction (a query) holds nothing.
What runs side by side is the rest: the models' builds into temp tables (most of a pass's
statements), the data tests, and dbt's own work between statements.

Opt-in (MALLARD_DBT_THREADS, default 1): with two threads DuckLake 1.5.5 failed 3 of 12 first
builds of a fresh data dir ("Failed to commit DuckLake transaction. Failed to get path for schema
with id ... - schema not found in metadata catalog", a commit beside another connection's read),
and one CI run died of a SIGBUS there. ~40 +100k passes at 10M and 35 small ones did not fail.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

# Statements outside a transaction that write no lake table: queries, variables, and tables of
# the connection's temp schema or of dbt's in-memory database (built from the lake or not). And
# a data test's BEGIN (a model's takes the lock before its BEGIN runs): with the lock, each test
# waited for the model being written (0.9-1.4 s, seen in a +100k pass).
_LOCAL = re.compile(
    r"""\s*(?:/\*.*?\*/\s*)*(?:
        select\b | with\b | set\s+variable\b | describe\b | show\b
      | begin\b | commit\b | rollback\b
      | create\s+(?:or\s+replace\s+)?temp(?:orary)?\s+table\b
      | (?:create\s+(?:or\s+replace\s+)?table|insert\s+into|drop\s+table(?:\s+if\s+exists)?)
        \s+(?:temp|memory)\.
    )""",
    re.IGNORECASE | re.VERBOSE | re.DOTALL,
)


def writes_lake(sql: str) -> bool:
    """Whether a statement run outside a transaction may write the lake (unknown kinds do)."""
    return _LOCAL.match(sql) is None


class _Writer:
    """The lock, and how deep each thread holds it: one per dbt invocation, so a lock a failed
    invocation left held cannot stop the next pass of a long-lived process."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self._held = threading.local()

    def depth(self) -> int:
        return getattr(self._held, "depth", 0)

    def acquire(self) -> None:
        self.lock.acquire()
        self._held.depth = self.depth() + 1

    def release_all(self) -> None:
        """Give up what this thread holds (a transaction's lock, ended by commit or rollback)."""
        while self.depth():
            self._held.depth -= 1
            self.lock.release()


@contextmanager
def serialised_lake_writes() -> Iterator[None]:
    """Patch dbt-duckdb meanwhile so its threads write the lake one at a time (see above)."""
    from dbt.adapters.duckdb.connections import DuckDBConnectionManager
    from dbt.adapters.duckdb.environments.local import DuckDBCursorWrapper

    real_begin: Callable[..., Any] = DuckDBConnectionManager.add_begin_query
    real_commit: Callable[..., Any] = DuckDBConnectionManager.add_commit_query
    real_rollback: Callable[..., Any] = DuckDBConnectionManager._rollback_handle
    real_execute: Callable[..., Any] = DuckDBCursorWrapper.execute
    writer = _Writer()

    def add_begin_query(self: Any) -> Any:
        # A data test's transaction only reads: its node is a test.
        if not str(self.get_thread_connection().name).startswith("test."):
            writer.acquire()
        try:
            return real_begin(self)
        except BaseException:
            writer.release_all()
            raise

    def add_commit_query(self: Any) -> Any:
        try:
            return real_commit(self)
        finally:
            writer.release_all()

    def rollback_handle(cls: Any, connection: Any) -> Any:
        try:
            return real_rollback(connection)
        finally:
            writer.release_all()

    def execute(self: Any, sql: str, bindings: Any = None) -> Any:
        if writer.depth() or not writes_lake(sql):
            return real_execute(self, sql, bindings)
        with writer.lock:
            return real_execute(self, sql, bindings)

    patches = [
        (DuckDBConnectionManager, "add_begin_query", add_begin_query),
        (DuckDBConnectionManager, "add_commit_query", add_commit_query),
        (DuckDBConnectionManager, "_rollback_handle", classmethod(rollback_handle)),
        (DuckDBCursorWrapper, "execute", execute),
    ]
    # What each class defines itself (not what it inherits), to put back as it was.
    saved = [(cls, name, vars(cls).get(name)) for cls, name, _ in patches]
    for cls, name, new in patches:
        setattr(cls, name, new)
    try:
        yield
    finally:
        for cls, name, old in saved:
            if old is None:
                delattr(cls, name)
            else:
                setattr(cls, name, old)
