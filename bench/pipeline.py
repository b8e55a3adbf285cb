"""Pipeline: full rebuild and incremental pass of `mallard pipeline run`, against one
hand-written DuckDB script doing the same derivations over the same Parquet, in the same run.

    python -m bench.pipeline [--full] [--events N] [--customers N] [--seed S]
    python -m bench.pipeline --full --increment-only
    python -m bench.pipeline --full --steady 12

Quick: 1M events (100k customers); full: 10M events (1M customers). Steps: a fresh `mallard
init` data dir; one pipeline run on the empty lake (dbt parses its manifest, as on any installed
system); the traffic landed through the collector's own roller (bench/lake.py); the full
rebuild, timed; the baseline (bench/baseline.sql), timed, and its outputs checked equal to the
marts; 100k new events landed and the incremental pass timed, then another 100k and the next
pass (the first runs with the page cache the baseline's memory emptied), then a third 100k timed
in a process that ran a pass before (as `mallard pipeline run --watch` runs passes, without the
process start and most of dbt's start-up that each `mallard pipeline run` pays). The lake is
left for the read API and freshness scenarios. --increment-only: on the lake a previous run
left (built when missing), only 100k new events and the pass, timed alike, with dbt's slowest
nodes; prints, writes no result (for A/B runs of the models without rebuilding the lake).
--steady N: on that lake, N passes of 100k in one long-lived process, with the compaction that
follows fragmentation; prints each pass and the median and mean, writes no result.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from bench.baseline import compare, run_baseline
from bench.lake import Lake, ensure_lake, fresh_lake, generate, sizes
from bench.stats import row, write_result
from mallard.harness import REPO

INCREMENT = 100_000


def step_seconds(data_dir: Path, back: int = 0) -> dict[str, float]:
    """Seconds per step (load, dbt) of the latest pipeline run (`back` runs before it), from
    the Dagster instance."""
    import dagster as dg

    with dg.DagsterInstance.from_config(str(data_dir / "dagster")) as instance:
        runs = instance.get_runs(filters=dg.RunsFilter(job_name="pipeline"), limit=back + 1)
        if len(runs) <= back:
            return {}
        out: dict[str, float] = {}
        for s in instance.get_run_step_stats(runs[back].run_id):
            if s.start_time is None or s.end_time is None:
                continue
            name = "load" if s.step_key.startswith("raw") else "dbt"
            out[name] = out.get(name, 0.0) + s.end_time - s.start_time
        return out


def timed_run(
    run: Callable[[], float], data_dir: Path, label: str
) -> tuple[float, dict[str, float]]:
    return report_run(run(), data_dir, label)


def report_run(
    wall: float, data_dir: Path, label: str, back: int = 0
) -> tuple[float, dict[str, float]]:
    """Print a timed pass with its steps (from the Dagster instance); returns both."""
    steps = step_seconds(data_dir, back)
    parts = ", ".join(f"{k} {v:.1f} s" for k, v in steps.items())
    print(f"{label:<28} {wall:8.1f} s   ({parts})", flush=True)
    return wall, steps


# Passes as the pipeline watcher (`mallard pipeline run --watch`, which `make run` starts) runs
# them: in a process that ran a pass before, so Dagster, dbt and the project are imported and
# parsed already. (Not the watcher itself: it would start a pass when the first of the files
# `land_more` writes lands.) One pass per line on
# stdin; each prints its seconds (compaction after it included) and the compaction's seconds.
_LONG_LIVED = """
import re, sys, time
from pathlib import Path
from orchestration.pipeline import run_pipeline
data_dir = Path(sys.argv[1])
run_pipeline(data_dir)
print("ready", flush=True)
for _ in sys.stdin:
    t0 = time.perf_counter()
    steps = run_pipeline(data_dir)
    secs = time.perf_counter() - t0
    compact = [re.search(r"in ([0-9.]+) s$", s.summary) for s in steps if s.name == "compact"]
    compact_s = sum(float(m[1]) for m in compact if m)
    print("pass", secs, all(s.ok for s in steps), compact_s, flush=True)
"""


def long_lived_passes(
    lake: Lake, increment: int, passes: int = 1
) -> list[tuple[int, float, float]]:
    """Before each of `passes` passes, land `increment` events while a process that already ran
    a pass waits, then time its next pass. Returns (rows landed, seconds, of which compaction)
    per pass."""
    out = []
    with subprocess.Popen(
        [sys.executable, "-c", _LONG_LIVED, str(lake.data_dir)],
        cwd=REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    ) as proc:
        assert proc.stdin is not None and proc.stdout is not None
        for line in proc.stdout:
            if line.strip() == "ready":
                break
        else:
            raise AssertionError(f"the long-lived pass process exited ({proc.wait()})")
        for _ in range(passes):
            rows = lake.land_more(increment)
            proc.stdin.write("\n")
            proc.stdin.flush()
            result = next((line.split() for line in proc.stdout if line.startswith("pass ")), [])
            if not result or result[2] != "True":
                raise AssertionError(f"a long-lived pass failed ({proc.poll()}): {result}")
            out.append((rows, float(result[1]), float(result[3])))
        proc.stdin.close()
        if proc.wait() != 0:
            raise AssertionError(f"the long-lived pass process exited with {proc.returncode}")
    return out


def watcher_passes(
    lake: Lake, increment: int, passes: int
) -> list[tuple[int, float, dict[str, float]]]:
    """Passes timed as the pipeline watcher runs them, compaction apart: (rows landed, seconds,
    per step) of each."""
    timings = long_lived_passes(lake, increment, passes)
    out = []
    for i, (rows, secs, compact) in enumerate(timings):
        label = f"watcher pass {i + 1} (+{rows:,})"
        if compact:
            label += f", compaction {compact:.1f} s after"
        out.append((rows, *report_run(secs - compact, lake.data_dir, label, passes - 1 - i)))
    return out


def steady(events: int, customers: int, seed: int, increment: int, passes: int) -> int:
    """`passes` passes in one long-lived process on the lake a run left, each after `increment`
    new events, with the compaction that follows fragmentation: what passes cost in operation,
    not only the first ones after a build. Prints; writes no result."""
    lake = ensure_lake(events, customers, seed)
    timings = long_lived_passes(lake, increment, passes)
    for i, (rows, secs, compact) in enumerate(timings, 1):
        extra = f" (compaction after it {compact:.1f} s)" if compact else ""
        print(f"pass {i:3d} (+{rows:,}) {secs:8.1f} s{extra}", flush=True)
    without = sorted(secs - compact for _, secs, compact in timings)
    total = sum(secs for _, secs, _ in timings)
    print(
        f"{passes} passes: median {without[len(without) // 2]:.1f} s, max {without[-1]:.1f} s"
        f" without compaction; {total / passes:.1f} s a pass with it"
        f" ({sum(c for *_, c in timings):.1f} s of compaction in all)"
    )
    return 0


def same_pass(
    events: int, customers: int, seed: int, increment: int, runs: int, vary: str | None = None
) -> int:
    """Land `increment` events once, then time `runs` passes over them, each from the same lake
    state: the catalog is restored before each (data files are immutable, so a restored catalog
    is the whole state; the landing files are unloaded in it again). Compaction is held off.
    What a change to the models buys, without the drift of a lake that moves on with every pass
    and the host's variance between runs. Leaves the lake as the last pass left it, the files of
    the other passes deleted. `vary` ("NAME=A,B"): the passes take turns with NAME=A, NAME=B, so
    a setting is compared on the same state, interleaved. Prints; writes no result."""
    import sqlite3
    import statistics
    from contextlib import closing

    from mallard.harness import mallard
    from mallard.warehouse import connect

    lake = ensure_lake(events, customers, seed)
    rows = lake.land_more(increment)
    catalog = lake.paths.lake_catalog
    saved = lake.data_dir / "same-pass-catalog.sqlite"

    def copy(src: Path, dst: Path) -> None:
        # SQLite's backup: consistent with a catalog in WAL mode, unlike a file copy.
        with closing(sqlite3.connect(src)) as a, closing(sqlite3.connect(dst)) as b:
            a.backup(b)

    copy(catalog, saved)
    name, _, values = (vary or "").partition("=")
    variants = [{name: v} for v in values.split(",")] if vary else [{}]
    walls: dict[str, list[float]] = {}
    try:
        for i in range(1, runs + 1):
            copy(saved, catalog)
            variant = variants[(i - 1) % len(variants)]
            label = " ".join(f"{k}={v}" for k, v in variant.items())
            t0 = time.perf_counter()
            mallard(
                "pipeline",
                "run",
                data_dir=lake.data_dir,
                timeout=7200,
                env={"MALLARD_COMPACT_AT_FILES": str(10**9), **variant},
            )
            wall = time.perf_counter() - t0
            walls.setdefault(label, []).append(wall)
            steps = step_seconds(lake.data_dir)
            results = json.loads((lake.paths.dbt_target / "run_results.json").read_text())
            split: dict[str, float] = {}
            for r in results["results"]:
                kind = r["unique_id"].split(".")[0]
                split[kind] = split.get(kind, 0.0) + r["execution_time"]
            print(
                f"pass {i} (+{rows:,}) {wall:8.1f} s   (load {steps.get('load', 0.0):.1f} s,"
                f" dbt {steps.get('dbt', 0.0):.1f} s: models {split.get('model', 0.0):.1f} s,"
                f" tests {split.get('test', 0.0):.1f} s, unit tests"
                f" {split.get('unit_test', 0.0):.1f} s) {label}",
                flush=True,
            )
    finally:
        saved.unlink(missing_ok=True)
        conn = connect(lake.paths)
        try:
            conn.execute("call ducklake_delete_orphaned_files('lake', cleanup_all => true)")
        finally:
            conn.close()
    for label, times in walls.items():
        print(
            f"{len(times)} passes over the same +{rows:,}{' with ' + label if label else ''}:"
            f" median {statistics.median(times):.1f} s"
        )
    return 0


def increment_only(events: int, customers: int, seed: int, increment: int) -> int:
    lake = ensure_lake(events, customers, seed)
    rows = lake.land_more(increment)
    timed_run(lake.pipeline_run, lake.data_dir, f"incremental (+{rows:,})")
    results = json.loads((lake.paths.dbt_target / "run_results.json").read_text())
    print(f"dbt: {results['elapsed_time']:.1f} s over {len(results['results'])} nodes; slowest:")
    for r in sorted(results["results"], key=lambda r: -r["execution_time"])[:10]:
        print(f"  {r['execution_time']:6.2f} s  {r['unique_id']}")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.pipeline")
    p.add_argument("--full", action="store_true")
    p.add_argument("--events", type=int, help="events in the lake (default 1M, full 10M)")
    p.add_argument("--customers", type=int, help="customers (default events / 10)")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--increment-only", action="store_true")
    p.add_argument(
        "--steady", type=int, metavar="N", help="N long-lived passes on the lake a run left"
    )
    p.add_argument(
        "--same-pass",
        type=int,
        metavar="N",
        help="N passes over the same new events from the same lake state (A/B of a change)",
    )
    p.add_argument(
        "--vary",
        metavar="NAME=A,B",
        help="with --same-pass: the passes take turns with the environment variable NAME=A, NAME=B",
    )
    args = p.parse_args(argv)
    events, customers = sizes(args.full, args.events, args.customers)
    increment = min(INCREMENT, max(1, events // 10))
    if args.increment_only:
        return increment_only(events, customers, args.seed, increment)
    if args.steady:
        return steady(events, customers, args.seed, increment, args.steady)
    if args.same_pass:
        return same_pass(events, customers, args.seed, increment, args.same_pass, args.vary)

    lake = fresh_lake(events, customers, args.seed)
    print(f"lake: {lake.data_dir} ({events:,} events, {customers:,} customers)", flush=True)
    warm = lake.pipeline_run()
    print(f"{'warm-up on the empty lake':<28} {warm:8.1f} s   (dbt parse, empty models)")
    rows_landed, files, gen_s = generate(lake.data_dir, lake.traffic, "gen")
    print(
        f"{'landed (collector roller)':<28} {gen_s:8.1f} s   "
        f"({rows_landed:,} stored messages in {files} files)",
        flush=True,
    )

    out = lake.data_dir / "baseline.duckdb"
    # The baseline before the rebuild: its DuckDB (~15 GiB) empties the OS page cache, and in
    # operation passes follow a build or a pass, not such a job (run between the rebuild and the
    # passes, it made the first pass ~30% slower).
    base_s = run_baseline(lake.data_dir, out)
    print(f"{'baseline (one DuckDB script)':<28} {base_s:8.1f} s", flush=True)
    full_s, full_steps = timed_run(lake.pipeline_run, lake.data_dir, "full rebuild")
    checks = compare(lake.data_dir, out)
    same = all(marts == base for marts, base in checks.values())
    for name, (marts, base) in checks.items():
        print(
            f"  {name:<20} marts {marts[0]:>10,} rows   baseline {base[0]:>10,} rows   "
            f"{'equal' if marts == base else 'DIFFERENT'}"
        )
    out.unlink(missing_ok=True)
    lake.built = True
    lake.save()

    # Passes as `make run` runs them, in the pipeline watcher: the first after the rebuild, and
    # the next day's traffic. Then one as a new `mallard pipeline run` process (by hand, or a run
    # the Dagster UI launches), which also pays for starting Python, Dagster and dbt.
    (inc_rows, inc_s, inc_steps), (again_rows, again_s, again_steps) = watcher_passes(
        lake, increment, 2
    )
    new_rows = lake.land_more(increment)
    new_s, new_steps = timed_run(lake.pipeline_run, lake.data_dir, f"new process (+{new_rows:,})")

    ratio = full_s / base_s if base_s else 0.0
    dbt_ratio = full_steps.get("dbt", 0.0) / base_s if base_s else 0.0
    n_events, n_customers = checks["events"][0][0], checks["customers"][0][0]
    rows = [
        row("lake size: stored messages", rows_landed, "messages"),
        row("lake size: events (deduplicated)", n_events, "events"),
        row("lake size: customers", n_customers, "customers"),
        row("landing files generated (collector roller)", round(rows_landed / gen_s), "msgs/s"),
        row("full rebuild (mallard pipeline run)", round(full_s, 1), "s"),
        row("  of which load", round(full_steps.get("load", 0.0), 1), "s"),
        row("  of which dbt build (models + tests)", round(full_steps.get("dbt", 0.0), 1), "s"),
        row("baseline: one hand-written DuckDB script", round(base_s, 1), "s"),
        row("baseline outputs equal the marts", "yes" if same else "no", "", "yes", same),
        row("full rebuild / baseline", round(ratio, 2), "ratio", "<= 2.0", ratio <= 2.0),
        row("dbt build step / baseline", round(dbt_ratio, 2), "ratio"),
        row(
            f"incremental pass (+{inc_rows:,} events) in the pipeline watcher, as `make run`"
            " runs passes",
            round(inc_s, 1),
            "s",
            "<= 15",
            inc_s <= 15,
        ),
        row("  of which load", round(inc_steps.get("load", 0.0), 1), "s"),
        row("  of which dbt build (models + tests)", round(inc_steps.get("dbt", 0.0), 1), "s"),
        row(
            f"next incremental pass (+{again_rows:,} events) in the watcher",
            round(again_s, 1),
            "s",
            "<= 15",
            again_s <= 15,
        ),
        row("  of which dbt build (models + tests)", round(again_steps.get("dbt", 0.0), 1), "s"),
        row(
            f"incremental pass (+{new_rows:,} events) as a new `mallard pipeline run` process"
            " (process start included)",
            round(new_s, 1),
            "s",
        ),
        row("  of which dbt build (models + tests)", round(new_steps.get("dbt", 0.0), 1), "s"),
    ]
    write_result("pipeline", rows)
    return 0  # a difference is reported as a failed goal, with the other figures


if __name__ == "__main__":
    sys.exit(main())
