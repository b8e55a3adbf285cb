"""Import: `mallard import customers` of a 1,000,000-row CSV into a fresh data dir.

    python -m bench.importer [--rows N] [--timeout S]

Setup (not timed): a seeded CSV generated with polars (`userId`, `email`, `firstName`,
`lastName`, `plan`, `country`, `age`; bench/.work/importer/customers.csv), a fresh `mallard
init` data dir with `mallard serve` running on a free loopback port, as beside a live server.

Timed, each as a subprocess of the real CLI whose wall time runs from its spawn to its exit (the
command returns once every stored row is fsynced and landed, so its exit is the last ack):
- validate alone: the same file with one bad row appended as the last line; every row is
  checked, the command exits 1 naming that line, and nothing is stored.
- the import: rows per second to durable, the importer's own figure (`--json`: from its start,
  after Python's imports), the process's CPU time (user + sys: other load on the cores stretches
  the wall time much more than it) and peak RSS (wait4 on its PID).
- baseline, in the same run: polars reads the CSV and writes it as one Parquet file, fsynced
  (the floor of a read and a durable write of the same rows on this host at this moment).

Checked: the summary's stored count, the rows of the import's landing files and their distinct
messageIds all equal the CSV's rows; no segment is left in the import's log. Every process it
starts is stopped by its PID; the run fails after --timeout seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import polars as pl

from bench.lake import WORK
from bench.stats import row, write_result
from mallard.harness import REPO, Server, free_port, init_data_dir
from mallard.offline import TELEMETRY_OFF

ROWS = 1_000_000
GOAL = 50_000  # rows/s to durable, on 2 cores
PLANS = ("free", "pro", "team")
COUNTRIES = ("DE", "FR", "GB", "NL", "US")


def customers_csv(path: Path, n: int) -> None:
    """n customers, one a line; row i is user `imp-<i>` (deterministic: no randomness needed)."""
    i = pl.int_range(0, n, eager=True)
    pl.DataFrame(
        {
            "userId": "imp-" + i.cast(pl.String),
            "email": "user" + i.cast(pl.String) + "@example.com",
            "firstName": "First" + (i % 97).cast(pl.String),
            "lastName": "Last" + (i % 89).cast(pl.String),
            "plan": pl.Series(PLANS).gather(i % len(PLANS)),
            "country": pl.Series(COUNTRIES).gather(i % len(COUNTRIES)),
            "age": 18 + i % 60,
        }
    ).write_csv(path)


def cli(args: list[str], data_dir: Path, deadline: float) -> tuple[int, float, Any, str, str]:
    """`mallard <args>`: (returncode, wall s, rusage, stdout, stderr). Its rusage is its
    own (wait4 on its PID); killed by PID at the deadline."""
    env = {**os.environ, "MALLARD_DATA_DIR": str(data_dir), **TELEMETRY_OFF}
    out_path, err_path = data_dir / "bench-import.out", data_dir / "bench-import.err"
    t = time.perf_counter()
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "mallard.cli", *args], cwd=REPO, env=env, stdout=out, stderr=err
        )
    try:
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.monotonic() > deadline:
                raise TimeoutError("mallard " + " ".join(args))
            time.sleep(0.02)
        wall = time.perf_counter() - t
        proc.returncode = os.waitstatus_to_exitcode(status)
    finally:
        if proc.returncode is None:
            os.kill(proc.pid, signal.SIGKILL)
            os.waitpid(proc.pid, 0)
            proc.returncode = -9
    return (
        proc.returncode,
        wall,
        usage,
        out_path.read_text(),
        err_path.read_text(),
    )


def baseline(csv: Path, out: Path) -> float:
    """polars reads the CSV and writes it as Parquet, fsynced: seconds."""
    t = time.perf_counter()
    pl.read_csv(csv).write_parquet(out)
    fd = os.open(out, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return time.perf_counter() - t


def landed(data_dir: Path) -> tuple[int, int, int]:
    """Rows and distinct messageIds in the import's landing files; segments left in its log."""
    import duckdb

    files = sorted(str(p) for p in (data_dir / "landing").glob("date=*/import-*.parquet"))
    left = [p for p in (data_dir / "wal" / "import").glob("*") if not p.name.startswith(".")]
    if not files:
        return 0, 0, len(left)
    con = duckdb.connect()
    try:
        rows, distinct = con.execute(
            "select count(*), count(distinct message_id) from read_parquet(?)", [files]
        ).fetchone()  # type: ignore[misc]
    finally:
        con.close()
    return int(rows), int(distinct), len(left)


def run(n: int, deadline: float) -> list[dict[str, object]]:
    work = WORK / "importer"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    csv, bad_csv = work / "customers.csv", work / "customers-bad.csv"
    t = time.perf_counter()
    customers_csv(csv, n)
    gen_s = time.perf_counter() - t
    shutil.copyfile(csv, bad_csv)
    with open(bad_csv, "a") as f:
        f.write(f"imp-{n},nobody,First,Last,free,DE,30\n")
    mib = csv.stat().st_size / 2**20
    print(f"{n:,} rows, {mib:.0f} MiB of CSV generated in {gen_s:.1f} s", flush=True)

    data_dir = work / "data"
    creds = init_data_dir(data_dir)
    tenant = ["--client", creds["clientId"], "--account", creds["accountId"]]
    server = Server(data_dir, free_port(), creds)
    server.start()
    try:
        base_s = baseline(csv, work / "baseline.parquet")
        print(f"baseline (polars CSV -> Parquet, fsynced): {base_s:.2f} s", flush=True)

        rc, val_s, val_use, _, err = cli(
            ["import", "customers", str(bad_csv), *tenant], data_dir, deadline
        )
        bad_line = f"line {n + 2}: email is not a valid address"
        if rc != 1 or bad_line not in err:
            raise RuntimeError(f"validation run: exit {rc}, expected {bad_line!r}:\n{err}")
        stored_by_bad = landed(data_dir)[0]
        val_rss = val_use.ru_maxrss / 1024
        print(f"validate alone: {val_s:.2f} s (exit 1, {bad_line}), peak RSS {val_rss:.0f} MiB")

        rc, imp_s, imp_use, out, err = cli(
            ["import", "customers", str(csv), *tenant, "--json"], data_dir, deadline
        )
        if rc != 0:
            raise RuntimeError(f"import failed ({rc}):\n{err}")
        summary: dict[str, Any] = json.loads(out)
        imp_rss = imp_use.ru_maxrss / 1024
        # CPU seconds (user + sys, every thread): other processes on the cores stretch the
        # wall time, much less the CPU time, so rows per CPU second compares across runs.
        imp_cpu = imp_use.ru_utime + imp_use.ru_stime
        print(f"import: {imp_s:.2f} s wall, {summary}, peak RSS {imp_rss:.0f} MiB", flush=True)
    finally:
        server.stop()
    rows_landed, distinct, left = landed(data_dir)
    rate = n / imp_s
    exact = summary["stored"] == n and rows_landed == n and distinct == n and left == 0
    return [
        row("rows (CSV, 7 columns)", n, "rows"),
        row("  CSV size", round(mib, 1), "MiB"),
        row("baseline: polars CSV -> Parquet, fsynced", round(base_s, 2), "s"),
        row("validate alone (one bad last row: exit 1, nothing stored)", round(val_s, 2), "s"),
        row("  rows stored by the rejected file", stored_by_bad, "rows", "0", stored_by_bad == 0),
        row("import to durable (command wall time)", round(imp_s, 2), "s"),
        row("import to durable", round(rate), "rows/s", f">= {GOAL:,}", rate >= GOAL),
        row("  importer's own figure (after Python start)", summary["rowsPerSecond"], "rows/s"),
        row("  import / baseline", round(imp_s / base_s, 2), "ratio"),
        row("  CPU time of the import (user + sys)", round(imp_cpu, 2), "s"),
        row("  rows per CPU second", round(n / imp_cpu), "rows/s"),
        row("  peak RSS (import)", round(imp_rss), "MiB"),
        row("  peak RSS (validate alone)", round(val_rss), "MiB"),
        row(
            "stored = landed rows = distinct messageIds = CSV rows",
            f"{summary['stored']:,} / {rows_landed:,} / {distinct:,} / {n:,}",
            "",
            "equal, log empty",
            exact,
        ),
    ]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.importer")
    p.add_argument("--full", action="store_true", help="same run (the scenario has one size)")
    p.add_argument("--rows", type=int, default=ROWS)
    p.add_argument("--timeout", type=float, default=900.0, help="fail after this many seconds")
    args = p.parse_args(argv)
    try:
        rows = run(args.rows, time.monotonic() + args.timeout)
    except TimeoutError as e:
        write_result("importer", [row("bounded run", f"timed out: {e}", "", "finished", False)])
        return 1
    for r in rows:
        print(f"{r['metric']:<60} {r['value']} {r['unit']}  {r['goal']}")
    # Written whatever the goals' outcome: the report marks a row not met.
    write_result("importer", rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
