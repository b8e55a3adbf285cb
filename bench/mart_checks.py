"""Mart checks: what the marts' health checks (orchestration/defs/checks.py) add to a pass, next
to the pass itself, in the same run.

    python -m bench.mart_checks [--full] [--events N] [--customers N] [--passes K]

On the benchmark lake (bench/lake.py; built when missing), K times: 10,000 new events landed and
one `mallard pipeline run`, timed; the Dagster instance gives each run's step times (load, dbt,
the checks' step `marts_health`). Then the checks' reads alone (`marts_health()`), K times in
this process. Prints; writes no result (not one of the runner's scenarios: it lands more
traffic in the shared lake, as bench.pipeline --increment-only does).
"""

from __future__ import annotations

import argparse
import statistics
import time

from bench.lake import ensure_lake, sizes
from bench.stats import row
from mallard.paths import DataPaths

INCREMENT = 10_000


def step_times(data_dir: DataPaths) -> dict[str, float]:
    """Seconds per step of the latest pipeline run."""
    import dagster as dg

    with dg.DagsterInstance.from_config(str(data_dir.dagster_home)) as instance:
        (run,) = instance.get_runs(filters=dg.RunsFilter(job_name="pipeline"), limit=1)
        return {
            s.step_key: s.end_time - s.start_time
            for s in instance.get_run_step_stats(run.run_id)
            if s.start_time is not None and s.end_time is not None
        }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.mart_checks")
    p.add_argument("--full", action="store_true")
    p.add_argument("--events", type=int)
    p.add_argument("--customers", type=int)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--passes", type=int, default=3)
    args = p.parse_args(argv)
    from orchestration.mart_checks import marts_health

    events, customers = sizes(args.full, args.events, args.customers)
    lake = ensure_lake(events, customers, args.seed)
    paths = DataPaths(lake.data_dir)
    passes: list[float] = []
    checks: list[float] = []
    dbt: list[float] = []
    for _ in range(args.passes):
        lake.land_more(INCREMENT)
        passes.append(lake.pipeline_run())
        steps = step_times(paths)
        checks.append(steps["marts_health"])
        dbt.append(steps["dbt_models"])
        print(f"pass {passes[-1]:.2f} s: dbt {dbt[-1]:.2f} s, checks {checks[-1]:.3f} s")
    reads = []
    for _ in range(args.passes):
        t0 = time.perf_counter()
        marts_health(paths)
        reads.append(time.perf_counter() - t0)
    health = marts_health(paths)
    assert health is not None and health.events_match, health
    rows = [
        row("lake events", events + lake.extra_events, "events"),
        row(f"pass of {INCREMENT:,} events (median)", statistics.median(passes), "s"),
        row("dbt step of the pass (median)", statistics.median(dbt), "s"),
        row("checks step of the pass (median)", statistics.median(checks), "s"),
        row("checks' reads alone (median)", statistics.median(reads), "s"),
        row(
            "checks step / pass",
            round(statistics.median(checks) / statistics.median(passes), 4),
            "ratio",
        ),
    ]
    for r in rows:
        print(f"{r['metric']}: {r['value']} {r['unit']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
