"""Which statements dbt's threads run outside the one-writer lock (orchestration/lake_writes.py).

NOT TESTED IN CI: a pass with MALLARD_DBT_THREADS=2 itself. DuckLake 1.5.5 fails about one first
build in four with two threads ("Failed to get path for schema ... - schema not found in metadata
catalog", and once a SIGBUS), so the setting is opt-in (default 1) and a test of it would be
flaky. By hand, on 2026-11-25: the transactions of the passes of
tests/integration/test_models_correctness.py never overlapped while their statements did, and
its incremental and full builds were equal, with two threads.
"""

from __future__ import annotations

import pytest

from orchestration.lake_writes import writes_lake

COMMENT = '/* {"app": "dbt", "node_id": "model.mallard.events"} */\n'


@pytest.mark.parametrize(
    "sql",
    [
        "select count(*) from lake.marts.events",
        COMMENT + "  with x as (select 1) select * from x",
        "set variable mallard_changed_bits = (select 1)",
        'create temporary table "events__dbt_tmp2026" as (select * from lake.marts.events)',
        'create or replace temp table temp.main."customer_profiles__merge" as select 1',
        'create or replace table memory.main."customer_event_objects__pending" as select 1',
        'insert into temp.main."customer_profiles__merge" by name select 1',
        'drop table if exists memory.main."customer_event_objects__pending"',
        "describe lake.marts.events",
        # A data test's transaction (a model's takes the lock before its BEGIN runs).
        "BEGIN",
        "COMMIT",
    ],
)
def test_reads_and_local_tables_take_no_lock(sql: str) -> None:
    assert not writes_lake(sql)


@pytest.mark.parametrize(
    "sql",
    [
        "delete from lake.marts.events where true",
        COMMENT + 'insert into "lake"."marts"."events" select 1',
        'create table "lake"."marts"."regulation_state__dbt_tmp" as (select 1)',
        "create or replace table lake.marts.x as select 1",
        'drop table if exists "lake"."marts"."regulation_state__dbt_backup"',
        'alter table "lake"."marts"."x" rename to "y"',
        "create view lake.marts.customers as select 1",
        "call ducklake_merge_adjacent_files('lake')",
        # A temp table's name in a lake statement is not what it writes.
        "insert into lake.marts.events select * from temp.main.x",
        # Unknown kinds count as writes.
        "pragma something",
    ],
)
def test_lake_writes_and_unknown_statements_take_the_lock(sql: str) -> None:
    assert writes_lake(sql)
