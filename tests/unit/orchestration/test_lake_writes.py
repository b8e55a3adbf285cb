"""Which statements dbt's threads run outside the one-writer lock (orchestration/lake_writes.py).
That the passes' transactions never overlap, while their statements do, is checked on real
passes in tests/integration/test_models_correctness.py."""

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
