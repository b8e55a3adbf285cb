"""Run every benchmark scenario, collect their JSON, and write the markdown report.

Each scenario is a module `bench.<name>` with `main(argv) -> int` that prints its table and
writes `bench/results/<name>.json`: `{"scenario", "rows": [bench.stats.row(...)],
"latency_samples_ms": {label: [ms, ...]}}` (samples optional, kept to a few thousand). A scenario
that fails is reported as failed; the others still run. Plots: one bar chart of every
throughput row (unit ending in "/s") and one latency CDF per scenario with samples.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import sys
import time
import traceback
from pathlib import Path

from bench.stats import RESULTS

SCENARIOS = (
    "ingest",
    "pipeline",
    "read_api",
    "freshness",
    "regulations",
    "delivery",
    "journeys",
    "importer",
    "audiences",
    "distributed",
)
# Scenarios over the benchmark lake (bench/lake.py): they take its size; pipeline builds it.
# regulations and audiences work on a copy of it (a Delete rewrites files; audiences add models).
LAKE_SCENARIOS = ("pipeline", "read_api", "freshness", "regulations", "audiences")


def machine() -> str:
    cpu = "unknown cpu"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return f"{os.cpu_count()} cores, {mem:.0f} GiB, {cpu}, {platform.system()} {platform.release()}"


def report(
    results: dict[str, dict | None], how: str = "", took: dict[str, float] | None = None
) -> str:
    took = took or {}
    spent = ", ".join(f"{k} {v / 60:.1f} min" for k, v in took.items())
    lines = [
        f"# Mallard benchmarks\n\nMachine: {machine()}  \n"
        f"Date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}  \n"
        + (f"Command: `{how}`  \n" if how else "")
        + (f"Time taken: {sum(took.values()) / 60:.1f} min ({spent})\n" if took else ""),
        "| scenario | metric | value | goal | met |",
        "|---|---|---|---|---|",
    ]
    for name, res in results.items():
        if res is None:
            lines.append(f"| {name} | (failed or not available) | | | |")
            continue
        for row in res.get("rows", []):
            ok = row.get("ok")
            met = "" if ok is None else ("yes" if ok else "**no**")
            val = row["value"]
            val = (
                f"{val:,.2f}"
                if isinstance(val, float)
                else f"{val:,}"
                if isinstance(val, int)
                else val
            )
            unit, goal = row.get("unit", ""), row.get("goal", "")
            lines.append(
                f"| {name} | {row['metric']} | {f'{val} {unit}'.strip()} | {goal} | {met} |"
            )
    return "\n".join(lines) + "\n"


def plot(results: dict[str, dict | None], throughput: bool = True) -> list[str]:
    """Write PNG plots next to the report (the throughput bars only if `throughput`); returns
    their file names."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    made = []
    bars = [
        (f"{name}: {r['metric']}", float(r["value"]), r["unit"])
        for name, res in results.items()
        if res
        for r in res.get("rows", [])
        if throughput and str(r.get("unit", "")).endswith("/s")
    ]
    if bars:
        fig, ax = plt.subplots(figsize=(8, 0.5 * len(bars) + 1.5))
        ax.barh([b[0] for b in bars], [b[1] for b in bars], color="#3b7dd8")
        for i, (_, v, unit) in enumerate(bars):
            ax.text(v, i, f" {v:,.0f} {unit}", va="center", fontsize=8)
        ax.set_xlabel("throughput")
        ax.set_title("Throughput")
        fig.tight_layout()
        fig.savefig(RESULTS / "throughput.png", dpi=110)
        plt.close(fig)
        made.append("throughput.png")
    for name, res in results.items():
        samples = (res or {}).get("latency_samples_ms") or {}
        if not samples:
            continue
        fig, ax = plt.subplots(figsize=(7, 4))
        for label, xs in samples.items():
            xs = sorted(xs)
            if xs:
                ax.plot(xs, [(i + 1) / len(xs) for i in range(len(xs))], label=label)
        ax.set_xscale("log")
        ax.set_xlabel("latency (ms, log scale)")
        ax.set_ylabel("fraction of requests")
        ax.set_title(f"{name}: latency CDF")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(RESULTS / f"{name}_latency.png", dpi=110)
        plt.close(fig)
        made.append(f"{name}_latency.png")
    return made


def main() -> int:
    p = argparse.ArgumentParser(prog="python -m bench")
    size = p.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", default=True)
    size.add_argument("--full", action="store_true")
    p.add_argument("--only", nargs="*", choices=SCENARIOS)
    p.add_argument("--events", type=int, help="lake size override (default 1M; full 10M)")
    p.add_argument("--customers", type=int, help="default: events / 10")
    p.add_argument(
        "--mode", choices=("watch", "loop", "sensor"), help="freshness: what runs the pipeline"
    )
    args = p.parse_args()
    lake_args = ["--full"] if args.full else []
    lake_args += ["--events", str(args.events)] if args.events else []
    lake_args += ["--customers", str(args.customers)] if args.customers else []
    took: dict[str, float] = {}
    RESULTS.mkdir(parents=True, exist_ok=True)
    results: dict[str, dict | None] = {}
    failed = 0
    for name in args.only or SCENARIOS:
        print(f"\n=== {name} ===", flush=True)
        try:
            mod = importlib.import_module(f"bench.{name}")
        except ModuleNotFoundError as e:
            print(f"scenario {name} not available: {e}")
            results[name] = None
            failed += 1
            continue
        argv = lake_args if name in LAKE_SCENARIOS else (["--full"] if args.full else [])
        if name == "freshness" and args.mode:
            argv = [*argv, "--mode", args.mode]
        out = RESULTS / f"{name}.json"
        out.unlink(missing_ok=True)
        t0 = time.perf_counter()
        try:
            rc = mod.main(argv)
        except Exception:  # one broken scenario must not lose the others' figures
            traceback.print_exc()
            rc = 1
        took[name] = time.perf_counter() - t0
        results[name] = json.loads(out.read_text()) if rc == 0 and out.exists() else None
        failed += results[name] is None
    text = report(results, "python -m bench " + " ".join(sys.argv[1:]), took)
    # A run of some scenarios leaves the whole-run report and its throughput chart as they are
    # (they hold every scenario's figures) and writes its own report beside them.
    whole = not args.only
    text += "".join(f"\n![{png}]({png})\n" for png in plot(results, throughput=whole))
    out = RESULTS / ("report.md" if whole else "report-only.md")
    out.write_text(text)
    print("\n" + text)
    print(f"report: {out}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
