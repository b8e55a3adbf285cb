"""Audiences: what evaluating audience files adds to a pass, on the benchmark lake.

    python -m bench.audiences [--full] [--events N] [--customers N] [--pairs P]

Quick: the 1M-event, 100k-customer lake; full: the 10M-event, 1M-customer lake of
bench/pipeline.py (either built when missing, not timed). It
works on a copy (Parquet hard-linked, bench/regulations.py's copy_data_dir), so the lake stays as
the other scenarios expect. One untimed pass takes the models as they are now; then P pairs of
passes, each pass after 10,000 new events: one without audience files, one with three
(docs/audiences.md): a trait filter over `customers`, an event filter over `events`, an email
domain over `customer_profiles`. Reported: each pass's wall time, and the seconds of the audience
models within the pass with audiences (dbt's run_results: int_audience_matches, audience_members,
audiences), with the members they found.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from dataclasses import replace

from bench.lake import WORK, ensure_lake, sizes
from bench.regulations import copy_data_dir, relocate_catalog
from bench.stats import row, write_result
from mallard.harness import REPO, mallard
from mallard.paths import DataPaths

NEW_EVENTS = 10_000
AUDIENCES = {
    "pro_plan": "select customer_id from customers where traits ->> 'plan' = 'pro'",
    "buyers": "select customer_id from events where event_action = 'order_completed'",
    "example_com": (
        "select customer_id from customer_profiles where email_lower like '%@example.com'"
    ),
}
MODELS = ("int_audience_matches", "audience_members", "audiences")


def model_seconds(paths: DataPaths) -> dict[str, float]:
    """Seconds of the audience models in the last dbt invocation (run_results.json)."""
    doc = json.loads((paths.dbt_target / "run_results.json").read_text())
    out = {}
    for r in doc["results"]:
        name = r["unique_id"].split(".")[-1]
        if r["unique_id"].startswith("model.") and name in MODELS:
            out[name] = float(r["execution_time"])
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.audiences")
    ap.add_argument("--full", action="store_true", help="the 10M-event, 1M-customer lake")
    ap.add_argument("--events", type=int)
    ap.add_argument("--customers", type=int)
    ap.add_argument("--pairs", type=int, default=1)
    args = ap.parse_args(argv)
    events, customers = sizes(args.full, args.events, args.customers)
    source = ensure_lake(events, customers)
    copy = WORK / f"audiences-{events}-{customers}"
    copied = copy_data_dir(source.data_dir, copy)
    relocate_catalog(DataPaths(source.data_dir), DataPaths(copy))
    print(f"copied the lake in {copied.seconds:.1f} s", flush=True)
    lake = replace(source, data_dir=copy.resolve())
    config = WORK / "audiences-config"
    shutil.rmtree(config, ignore_errors=True)
    shutil.copytree(REPO / "config", config)
    env = {"MALLARD_CONFIG_DIR": str(config)}

    def timed_pass(label: str) -> float:
        lake.land_more(NEW_EVENTS)
        t0 = time.perf_counter()
        mallard("pipeline", "run", data_dir=lake.data_dir, env=env, timeout=7200)
        wall = time.perf_counter() - t0
        print(f"{label:<32} {wall:8.1f} s", flush=True)
        return wall

    timed_pass("untimed: models as they are now")
    without, with_, inside = [], [], []
    for i in range(args.pairs):
        shutil.rmtree(config / "audiences", ignore_errors=True)
        without.append(timed_pass(f"pass {i + 1} without audiences"))
        (config / "audiences").mkdir()
        for name, sql in AUDIENCES.items():
            (config / "audiences" / f"{name}.sql").write_text(sql + "\n")
        with_.append(timed_pass(f"pass {i + 1} with {len(AUDIENCES)} audiences"))
        secs = model_seconds(DataPaths(lake.data_dir))
        inside.append(sum(secs.values()))
        print("  audience models: " + ", ".join(f"{k} {v:.1f} s" for k, v in secs.items()))
    out = mallard(
        "sql",
        "-c",
        "select audience, status, members from audiences order by audience",
        "--format",
        "json",
        data_dir=lake.data_dir,
    )
    found = json.loads(out.stdout)
    print(found)
    assert all(a["status"] == "ok" and a["members"] > 0 for a in found), found
    size = f"{customers:,} customers"
    rows = [
        row(f"pass without audiences ({size})", round(min(without), 1), "s"),
        row(f"pass with {len(AUDIENCES)} audiences ({size})", round(min(with_), 1), "s"),
        row("audience models within that pass", round(min(inside), 1), "s"),
        row("audience members", sum(a["members"] for a in found), "rows"),
    ]
    write_result("audiences", rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
