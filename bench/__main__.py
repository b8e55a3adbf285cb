"""Run every benchmark scenario, collect their JSON, and write the markdown report.

Each scenario is a module `bench.<name>` with `main(argv) -> int` that prints its table and
writes `bench/results/<name>.json` (`{"scenario", "rows": [{"metric", "value", "unit",
"goal", "ok"}], "machine"}`). A scenario that fails is reported as failed; the others still run.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import sys
import time
from pathlib import Path

RESULTS = Path(__file__).parent / "results"
SCENARIOS = ("ingest", "pipeline", "read_api")


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


def report(results: dict[str, dict | None]) -> str:
    lines = [
        f"# Mallard benchmarks\n\nMachine: {machine()}  \n"
        f"Date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}\n",
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
            lines.append(f"| {name} | {row['metric']} | {val} {unit} | {goal} | {met} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    p = argparse.ArgumentParser(prog="python -m bench")
    size = p.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", default=True)
    size.add_argument("--full", action="store_true")
    p.add_argument("--only", nargs="*", choices=SCENARIOS)
    args = p.parse_args()
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
        rc = mod.main(["--full"] if args.full else [])
        out = RESULTS / f"{name}.json"
        results[name] = json.loads(out.read_text()) if rc == 0 and out.exists() else None
        failed += results[name] is None
    text = report(results)
    (RESULTS / "report.md").write_text(text)
    print("\n" + text)
    print(f"report: {RESULTS / 'report.md'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
