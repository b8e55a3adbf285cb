"""The pipeline baseline: bench/baseline.sql run by plain DuckDB over the landing Parquet, and
the check that its outputs equal the marts.

    python -m bench.baseline DATA_DIR OUT.duckdb    # run the script; prints its seconds

It runs as its own process (like `mallard pipeline run` does), with DuckDB's defaults.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import duckdb

from mallard.harness import REPO
from mallard.paths import DataPaths
from mallard.warehouse import connect

SQL = Path(__file__).with_name("baseline.sql")

# Order-free fingerprints of a served table. JSON objects built by json_group_object have no
# fixed key order, so traits and metadata are compared key by key (and firstEvent/lastEvent one
# level deeper), each value as its JSON text.
_FINGERPRINT = {
    "events": """
        select count(*), sum(hash(event_id, customer_id, user_id, email, email_lower,
            event_action, event_time, received_time, client_id, account_id, brand_id, source,
            record::varchar))
        from {t}
    """,
    "customers": """
        select count(*), sum(hash(customer_id, client_id, account_id, user_id, email_lower,
            subscription_id, created_time, last_activity_time))
        from {t}
    """,
    "customers.traits": """
        select count(*), sum(hash(customer_id, k, (traits -> ('$."' || k || '"'))::varchar))
        from (select customer_id, traits, unnest(json_keys(traits)) as k from {t})
    """,
    "customers.metadata": """
        with kv as (
            select customer_id, k, metadata -> ('$."' || k || '"') as v
            from (select customer_id, metadata, unnest(json_keys(metadata)) as k from {t})
        )
        select count(*), sum(hash(customer_id, k, a, v::varchar)) from (
            select customer_id, k, '' as a, v from kv where k not in ('firstEvent', 'lastEvent')
            union all
            select customer_id, k, a, v -> ('$."' || a || '"')
            from (select *, unnest(json_keys(v)) as a from kv
                  where k in ('firstEvent', 'lastEvent'))
        )
    """,
}


def script(paths: DataPaths) -> str:
    from mallard.secret import ensure_secret
    from orchestration.environment import hmac_pads

    ipad, opad = hmac_pads(ensure_secret(paths))
    root = str(paths.landing_dir) + "/"
    return (
        SQL.read_text()
        .replace("__LANDING_GLOB__", root + "date=*/*.parquet")
        .replace("__LANDING_ROOT__", root)
        .replace("__IPAD__", ipad)
        .replace("__OPAD__", opad)
    )


def run_baseline(data_dir: Path, out: Path, timeout: float = 7200) -> float:
    """Run the baseline in its own process; returns its wall time in seconds."""
    out.unlink(missing_ok=True)
    t0 = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "bench.baseline", str(data_dir), str(out)],
        cwd=REPO,
        check=True,
        timeout=timeout,
    )
    return time.perf_counter() - t0


def compare(data_dir: Path, out: Path) -> dict[str, tuple[tuple[int, int], tuple[int, int]]]:
    """Per fingerprint: (marts, baseline) as (rows, checksum). Equal pairs mean equal outputs."""
    conn = connect(DataPaths(data_dir), read_only=True)
    try:
        conn.execute("set enable_progress_bar = false")
        conn.execute(f"attach '{out}' as base (read_only)")
        result = {}
        for name, sql in _FINGERPRINT.items():
            table = name.split(".")[0]
            got = []
            for ref in (f"lake.marts.{table}", f"base.main.{table}"):
                row = conn.execute(sql.format(t=ref)).fetchone()
                got.append((int(row[0]), int(row[1] or 0)) if row else (0, 0))
            result[name] = (got[0], got[1])
        return result
    finally:
        conn.close()


# As the customers model (incremental_by_customer), and set by the same variable.
CUSTOMERS_PER_CHUNK = int(os.environ.get("MALLARD_CUSTOMERS_PER_CHUNK", "125000"))


def main(argv: list[str]) -> int:
    data_dir, out = Path(argv[0]).resolve(), Path(argv[1]).resolve()
    sql, rest = script(DataPaths(data_dir)).split("-- @customers", 1)
    customers_sql = "-- @customers" + rest
    conn = duckdb.connect(str(out))
    try:
        conn.execute("set enable_progress_bar = false")
        conn.execute(sql)
        row = conn.execute("select count(distinct customer_id) from identified").fetchone()
        chunks = max(1, -(-int(row[0] if row else 0) // CUSTOMERS_PER_CHUNK))
        for i in range(chunks):
            where = f"where hash(customer_id) % {chunks} = {i}"
            conn.execute(f"create or replace temp view identified_chunk as from identified {where}")
            conn.execute(f"create or replace temp view traits_chunk as from traits {where}")
            if i == 0:  # the table's shape from the first chunk's statement
                conn.execute(
                    customers_sql.replace("insert into customers", "create table customers as", 1)
                )
            else:
                conn.execute(customers_sql)
    finally:
        conn.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
