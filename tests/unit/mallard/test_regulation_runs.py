"""Regulation runs: one live run per regulation (its lock), and started runs are reaped."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from mallard.paths import DataPaths
from mallard.regulation_runs import (
    BACKLOG,
    RegulationRuns,
    log_path,
    pid_path,
    run_lock,
    running,
)
from mallard.regulations import RegulationStore

RID = "01a2199f-5ffb-7000-b9bd-c01400008d67"


class Echo(RegulationRuns):
    """Starts a short Python process instead of a regulation's run."""

    def command(self, regulation_id: str) -> list[str]:
        return [sys.executable, "-c", f"print('ran {regulation_id}')"]


def children(state: str | None = None) -> list[int]:
    """PIDs of this process's children (in a given state, e.g. Z for zombies)."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == os.getpid() and (state is None or fields[0] == state):
            out.append(int(stat.parent.name))
    return out


def test_a_live_run_holds_its_regulation(tmp_path: Path) -> None:
    paths = DataPaths(tmp_path)
    assert not running(paths, RID)
    with run_lock(paths, RID) as held:
        assert held
        assert pid_path(paths, RID).read_text() == str(os.getpid())
        assert running(paths, RID)
        # Neither a second run nor a start gets in while it lives.
        with run_lock(paths, RID, wait_s=0.2) as second:
            assert not second
        assert Echo(paths).start(RID) is None
    assert not running(paths, RID)
    assert not pid_path(paths, RID).exists()
    with run_lock(paths, RID) as again:
        assert again


def test_started_runs_log_and_leave_no_zombie(tmp_path: Path) -> None:
    paths = DataPaths(tmp_path)
    runs = Echo(paths, {"MALLARD_TEST": "1"})
    assert runs.env["MALLARD_DATA_DIR"] == str(tmp_path)
    assert runs.env["DAGSTER_HOME"] == str(paths.dagster_home)
    pid = runs.start(RID)
    assert pid is not None
    deadline = time.monotonic() + 30
    while pid in children() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert pid not in children(), "the finished run was not reaped"
    assert f"ran {RID}" in log_path(paths).read_text()


@pytest.mark.parametrize("bad", ["../x", "a/b", "", "x" * 65])
def test_only_regulation_ids_name_files(tmp_path: Path, bad: str) -> None:
    with pytest.raises(ValueError):
        pid_path(DataPaths(tmp_path), bad)


def test_resume_starts_one_run_for_every_unfinished_regulation(tmp_path: Path) -> None:
    """After an outage many regulations wait: one process takes them all, not one each."""
    paths = DataPaths(tmp_path)
    store = RegulationStore(paths)
    filed = [store.file("demo", "demo", "DEMO", "SUPPRESS", [f"u{i}"], {}) for i in range(3)]
    runs = Echo(paths)
    with run_lock(paths, filed[0].regulation_id):  # a live run of its own keeps this one
        started = runs.resume(store)
    assert sorted(started) == sorted(r.regulation_id for r in filed[1:])
    assert len(set(started.values())) == 1, started
    assert RegulationRuns(paths).command(BACKLOG)[-2:] == ["run", "--unfinished"]
    with run_lock(paths, BACKLOG):  # a live run of the unfinished ones takes them as it goes
        assert runs.resume(store) == {}


def test_the_run_of_the_unfinished_takes_them_in_filing_order(tmp_path: Path) -> None:
    """`mallard regulations run --unfinished` runs each in turn in its one process (here each
    fails at once: the data dir's Dagster instance cannot be opened)."""
    from mallard.harness import init_data_dir, mallard

    paths = DataPaths(tmp_path / "data")
    init_data_dir(paths.root)
    store = RegulationStore(paths)
    filed = [store.file("demo", "demo", "DEMO", "UNSUPPRESS", [f"u{i}"], {}) for i in range(3)]
    paths.dagster_home.mkdir(parents=True, exist_ok=True)
    (paths.dagster_home / "history").write_text("not a directory")

    done = mallard("regulations", "run", "--unfinished", data_dir=paths.root, check=False)
    assert done.returncode == 1, done.stdout + done.stderr
    pids = set()
    for reg in filed:
        after = store.get(reg.regulation_id)
        assert after is not None and after.status == "failed", after
        line = next(x for x in done.stdout.splitlines() if f"{reg.regulation_id}: run started" in x)
        pids.add(line.rsplit("pid ", 1)[1])
    assert len(pids) == 1, done.stdout
    order = [done.stdout.index(f"{r.regulation_id}: run started") for r in filed]
    assert order == sorted(order), done.stdout
