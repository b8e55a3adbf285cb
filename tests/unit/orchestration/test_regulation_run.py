"""A regulation's run: one that stops outside the job's steps (here: the data dir's Dagster
instance cannot be opened) marks the regulation failed with the error, so a caller waiting on its
status sees the failure instead of `running` with no run behind it; one that waited for the lake
writer's turn to run its catch-up pass runs none when another's pass took its messages."""

from __future__ import annotations

import logging
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from mallard.passes import read_last_pass
from mallard.paths import DataPaths
from mallard.regulations import RegulationStore
from orchestration import locks
from orchestration.regulations.job import catch_up_models, run_regulation
from tests.unit.orchestration.test_load import write_landing


def test_a_run_that_cannot_open_its_instance_fails_the_regulation(tmp_path: Path) -> None:
    paths = DataPaths(tmp_path / "data")
    paths.root.mkdir()
    store = RegulationStore(paths)
    reg = store.file("demo", "demo", "DEMO", "SUPPRESS", ["u1"], {"u1": []})
    paths.dagster_home.mkdir(parents=True)
    # The instance keeps its runs in the directory `history` of DAGSTER_HOME: a file stops it.
    (paths.dagster_home / "history").write_text("not a directory")

    with pytest.raises(Exception) as raised:
        run_regulation(paths.root, reg.regulation_id)

    done = store.get(reg.regulation_id)
    assert done is not None and done.status == "failed", done
    assert done.error is not None and done.error.startswith("the run stopped: ")
    assert type(raised.value).__name__ in done.error


# Another actor's pass: it takes the lake writer's turn, says so, and runs the pass on a line
# of its stdin.
OTHER_PASS = """
import sys
from pathlib import Path
from mallard.paths import DataPaths
from orchestration.locks import lake_writer
from orchestration.pipeline import run_pipeline
paths = DataPaths(Path(sys.argv[1]))
with lake_writer(paths, "pass (another regulation)"):
    print("held", flush=True)
    sys.stdin.readline()
    steps = run_pipeline(paths.root, launched_by="regulation other (catch up)")
    sys.exit(0 if all(s.ok for s in steps) else 1)
"""


def test_a_regulation_that_waited_for_the_writer_runs_no_pass_another_ran(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """With no watcher, a regulation runs its catch-up pass itself, in the lake writer's turn.
    Regulations that find no watcher at once (one killed and restarting) all wait for the
    turn; when a regulation's turn comes, the pass before it has taken its messages, and it
    runs none of its own."""
    monkeypatch.setattr(locks, "WAIT_SAID_S", 0.2)  # its line says when it waits for the turn
    paths = DataPaths(tmp_path / "data")
    write_landing(paths, events=20, seed=3, files=1)
    reg = RegulationStore(paths).file("demo", "demo", "DEMO", "SUPPRESS", ["u1"], {"u1": []})
    other = subprocess.Popen(
        [sys.executable, "-c", OTHER_PASS, str(paths.root)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert other.stdin is not None and other.stdout is not None
        assert other.stdout.readline().strip() == "held"
        said: list[str] = []
        with caplog.at_level(logging.WARNING, logger="orchestration.locks"):
            waiter = threading.Thread(target=lambda: said.append(catch_up_models(paths, reg)))
            waiter.start()
            deadline = time.monotonic() + 120
            while not caplog.records and time.monotonic() < deadline:
                time.sleep(0.1)
            assert caplog.records, "the regulation did not wait for the writer's turn"
            assert "(pass (another regulation))" in caplog.records[0].getMessage()
            other.stdin.write("go\n")
            other.stdin.close()
            assert other.wait(600) == 0
            waiter.join(600)
    finally:
        other.kill()
        other.wait()
    assert said == ["0 log segments landed; a full pass holds the messages (catch up)"]
    last = read_last_pass(paths)
    assert last is not None and last.pass_number == 1, last
    assert last.launched_by == "regulation other (catch up)"
