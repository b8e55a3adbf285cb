"""The incremental window of a pipeline pass, written as data: a row of `lake.state.pass_manifest`.

A pass takes the messages loaded after the window end of the last pass that finished up to the
newest load committed when it begins. The orchestrator computes that window (`current_window`, a
pure read of the lake) and opens the pass by appending it to the manifest (`open_pass`) before dbt
runs; dbt's scope models read the newest row (`int_pass_window`, and through it
`int_pass_messages` and `int_customers_changed`). The freshness mart, built last, records the
pass it finished (`pass_id`): a failed pass leaves the row of the pass before, so the next pass
takes the failed pass's messages again; the models are idempotent for messages seen twice. A
served pass (`PassKind`) builds only what the read API serves; the row keeps the last full pass
too (`full_pass_id`), after which the next full pass starts.

A plain `dbt build` (no orchestrator) repeats the newest pass's window, or takes everything on a
lake without one: correct either way. The window is data, not `--vars`: dbt re-parses the whole
project when its vars change, while the models read the manifest only when they run.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from pathlib import Path
from typing import Any

import duckdb
import yaml

from mallard import landing
from mallard.paths import DataPaths
from orchestration.context import DBT_DIR
from orchestration.warehouse import lake_connection


class PassKind(StrEnum):
    """The two kinds of pass, each with its invariant (docs/warehouse.md):

    - served: loads the new landing files and builds the models the read API serves
      (`SERVED_SELECT`) over every message loaded after the last pass of either kind, with no
      tests; after it, those models hold every loaded message.
    - full: after it, every model holds every message loaded when it began, tested, health
      checked, and the dispatch follows. It continues after the last full pass. When served
      passes ran since then, it first brings the served models up to date (a served part, when
      they lack anything) and then builds the rest (`REST_EXCLUDE`, `REST_SCOPE`) over every
      message since the last full pass, leaving the served models as they are; otherwise it
      builds every model at once.
    """

    FULL = "full"
    SERVED = "served"

    @property
    def completes(self) -> bool:
        """Whether the pass leaves every model current (the next full pass starts after it)."""
        return self is PassKind.FULL


# dbt's selection of a served pass: the marts the read API answers from (tag `served`), what they
# are built from, and the freshness mart that records the pass (its own upstream is every mart).
SERVED_SELECT = "+tag:served freshness"
# The rest of a full pass after served passes: every model but those of a served pass, and again
# the scope models tagged `pass_scope` (the customers a window changes), which the rest reads for
# its longer window.
REST_EXCLUDE = "+tag:served"
REST_SCOPE = "tag:pass_scope"
# The Dagster run tag that says which kind a pass is (the UI shows it on the run).
PASS_KIND_TAG = "mallard/pass"


@dataclass(frozen=True)
class Window:
    loaded_after: datetime | None  # None: no finished pass yet, take everything
    loaded_through: datetime | None  # None: nothing loaded yet
    kind: PassKind = PassKind.FULL
    # The last pass of either kind ended at `loaded_through`: the served models hold every
    # loaded message.
    served_current: bool = False
    # Served passes ran since the last full pass (it ended before the last pass of either kind).
    served_since_full: bool = False

    def dbt_args(self) -> list[str]:
        """With no finished pass to continue from, every model is built whole (--full-refresh):
        the first pass, or the first after an upgrade whose incremental tables are not known."""
        return [] if self.loaded_after is not None else ["--full-refresh"]


def _scalar(conn: duckdb.DuckDBPyConnection, sql: str, params: list[Any]) -> Any:
    try:
        row = conn.execute(sql, params).fetchone()
    except (duckdb.CatalogException, duckdb.BinderException):  # not built (by this version) yet
        return None
    return row[0] if row else None


def models_epoch() -> int:
    """The version of the models' stored state (var `mallard__models_epoch` of the dbt project)."""
    project = yaml.safe_load((DBT_DIR / "dbt_project.yml").read_text())
    return int(project["vars"]["mallard__models_epoch"])


# The window end of a pass the freshness mart recorded, if that pass left state of this version
# of the models: `pass_id`, the last pass that finished (either kind), or `full_pass_id`, the last
# full one (the same pass after a full pass; a served pass carries it over).
_FINISHED_THROUGH = """
    select manifest.loaded_through
    from lake.marts.freshness as freshness
    join lake.state.pass_manifest as manifest on manifest.pass_id = freshness.{column}
    where manifest.models_epoch = ?
"""


def _finished_through(conn: duckdb.DuckDBPyConnection, kind: PassKind) -> Any:
    """A served pass continues after the last pass of either kind: the served models took every
    message before it. A full pass continues after the last full one, so the models a served
    pass left out take the served passes' messages too (every model is idempotent for a
    message seen again)."""
    if kind.completes:
        try:
            row = conn.execute(
                _FINISHED_THROUGH.format(column="full_pass_id"), [models_epoch()]
            ).fetchone()
            return row[0] if row else None
        except duckdb.CatalogException:  # no freshness mart yet
            return None
        except duckdb.BinderException:  # a freshness row from before served passes: all full
            pass
    return _scalar(conn, _FINISHED_THROUGH.format(column="pass_id"), [models_epoch()])


def current_window(paths: DataPaths, kind: PassKind = PassKind.FULL) -> Window:
    """A pass continues after the last finished one (of its kind: `_finished_through`) only if
    that pass left state of this version of the models; otherwise (first pass, or after an
    upgrade) it builds whole, and is full whatever was asked."""
    conn = lake_connection(paths)
    try:
        after = _finished_through(conn, kind)
        if after is None:
            kind = PassKind.FULL
            after = _finished_through(conn, kind)
        through = _scalar(conn, "select max(loaded_at) from lake.raw.messages", [])
        last = _finished_through(conn, PassKind.SERVED)
        full = after if kind is PassKind.FULL else _finished_through(conn, PassKind.FULL)
    finally:
        conn.close()
    return Window(
        after,
        through,
        kind,
        served_current=last is not None and last == through,
        served_since_full=full is not None and last is not None and last != full,
    )


def full_pass_holds(
    paths: DataPaths,
    received_before: datetime | None = None,
    through: datetime | None = None,
) -> bool:
    """Whether the last finished full pass took every message received at or before
    `received_before` that has landed (none waits in a landing file not loaded yet) and every
    message loaded at or before `through`. What a regulation waits for (a pass by whoever
    holds the writer's turn) rather than running a pass of its own: one full pass holds every
    regulation filed before the messages it took, so regulations filed together wait for one."""
    from orchestration.load import unloaded_files

    conn = lake_connection(paths)
    try:
        finished = _finished_through(conn, PassKind.FULL)
        if finished is None:
            return False
        need = [through] if through is not None else []
        if received_before is not None:
            if waiting := unloaded_files(paths):
                earliest = conn.execute(
                    "select min(received_at) from read_parquet(?)",
                    [[landing.url(paths, f) for f in waiting]],
                ).fetchone()[0]  # type: ignore[index]
                if earliest is not None and earliest <= received_before:
                    return False
            loaded = conn.execute(
                "select max(loaded_at) from lake.raw.messages where received_at <= ?",
                [received_before],
            ).fetchone()[0]  # type: ignore[index]
            if loaded is not None:
                need.append(loaded)
    except duckdb.CatalogException:  # nothing loaded or built yet
        return False
    finally:
        conn.close()
    return not need or finished >= max(need)


def newest_load(paths: DataPaths) -> datetime | None:
    """The newest `loaded_at` of the stored messages (a Delete's restated messages are marked
    loaded when it restates them)."""
    conn = lake_connection(paths)
    try:
        return _scalar(conn, "select max(loaded_at) from lake.raw.messages", [])  # type: ignore[no-any-return]
    finally:
        conn.close()


def open_pass(paths: DataPaths, window: Window) -> int:
    """Append the pass's window to the manifest, where the models read it; its pass id. Under
    the writer's turn: one pass opens at a time."""
    conn = lake_connection(paths)
    try:
        conn.execute("begin")
        row = conn.execute("select coalesce(max(pass_id), 0) + 1 from lake.state.pass_manifest")
        pass_id = int(row.fetchone()[0])  # type: ignore[index]
        conn.execute(
            "insert into lake.state.pass_manifest"
            " (pass_id, models_epoch, loaded_after, loaded_through, opened_at, kind)"
            " values (?, ?, ?, ?, now(), ?)",
            [pass_id, models_epoch(), window.loaded_after, window.loaded_through, window.kind],
        )
        conn.execute("commit")
    except BaseException:
        conn.execute("rollback")
        raise
    finally:
        conn.close()
    return pass_id


# What a pass tests and builds. The first pass after the dbt project changed (its parsed manifest
# differs from the one the tests last passed on) runs every test: the unit tests (they check the
# SQL, not the data) and the data tests of every model. Other passes run the data tests of the
# marts, what the API and analysts read: the grain tests there catch a wrong incremental step too
# (a stale customer's events fail unique event_id). Measured at 10M messages, the unit tests cost
# ~9 s of a pass and the intermediate models' data tests ~6 s. Data tests tagged `definition`
# check what a model's SQL can write rather than the data (accepted_values of literals), so they
# run only with every test too (0.3 s of a +100k pass at 10M).
# Views hold no data, only their SQL, which changes only with the project: a pass that runs every
# test built them (it passed, or it is run again), so incremental passes after it leave them as
# they are (5 views, ~0.5 s of a pass at 10M). A view's SQL must therefore not depend on the
# window or anything else a pass sets.
FULL_TESTS_PASSED = "full_tests_passed"
# One --exclude value, the selectors space-separated: dagster-dbt takes its first value only.
LIGHT_TESTS = (
    "path:models/intermediate,resource_type:test path:models/staging,resource_type:test"
    " tag:definition,resource_type:test"
)
UNCHANGED_VIEWS = "config.materialized:view"


# What a resource of the manifest is made of; dbt also writes what a run compiled (the compiled
# SQL holds the window's timestamps, and the macros it called join `depends_on`) and who ran it,
# which change every pass.
_DEFINITION = ("raw_code", "macro_sql", "config", "test_metadata", "given", "expect")


def _definition(node: dict[str, Any]) -> list[Any]:
    return [*(node.get(k) for k in _DEFINITION), (node.get("depends_on") or {}).get("nodes")]


def _manifest_digest(target: Path) -> str:
    """The digest of the project's definitions, not of the file: every dbt run writes
    manifest.json again with its compiled SQL and invocation, so a digest of the bytes made every
    other pass run every test (10 s at 10M)."""
    manifest = json.loads((target / "manifest.json").read_text())
    parts = [
        [uid, _definition(node)]
        for section in ("nodes", "unit_tests", "macros", "sources")
        for uid, node in sorted(manifest.get(section, {}).items())
    ]
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


def full_tests_due(target: Path) -> bool:
    marker = target / FULL_TESTS_PASSED
    try:
        return marker.read_text() != _manifest_digest(target)
    except FileNotFoundError:
        return True


def record_full_tests_passed(target: Path) -> None:
    (target / FULL_TESTS_PASSED).write_text(_manifest_digest(target))


def dbt_build_args(window: Window, full_tests: bool) -> list[str]:
    """The `dbt build` command line of a pass."""
    if full_tests:
        return ["build", *window.dbt_args()]
    # A whole build (no finished pass to continue from) builds the views too.
    exclude = LIGHT_TESTS if window.loaded_after is None else f"{LIGHT_TESTS} {UNCHANGED_VIEWS}"
    return [
        "build",
        *window.dbt_args(),
        "--exclude-resource-type",
        "unit_test",
        "--exclude",
        exclude,
    ]
