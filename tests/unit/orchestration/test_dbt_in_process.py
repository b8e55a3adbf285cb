"""dbt runs on a thread of the pipeline's process (orchestration/dbt_in_process.py), with
dagster-dbt reading the same JSON lines it reads from a `dbt` subprocess."""

from __future__ import annotations

import json
import re
from pathlib import Path

from mallard.harness import mallard
from orchestration.context import DBT_DIR
from orchestration.dbt_in_process import DbtThread


def _invoked_on(target: Path) -> str:
    """The thread dbt's last invocation began on, from its debug log (dbt.log): the thread that
    reports dbt's version (models then run on dbt's worker threads either way)."""
    events = [json.loads(line) for line in (target / "dbt.log").read_text().splitlines() if line]
    last = events[-1]["info"]["invocation_id"]
    first = next(e for e in events if e["info"]["invocation_id"] == last)
    assert first["info"]["name"] == "MainReportVersion", first
    return str(first["info"]["thread"])


def test_a_pass_runs_dbt_on_a_thread_of_the_pipeline_process(tmp_path: Path) -> None:
    """A `dbt` subprocess logs from its MainThread; in the pipeline's process dbt runs on the
    thread named dbt. MALLARD_DBT_IN_PROCESS=0 keeps the subprocess. Both build the models."""
    data = tmp_path / "data"
    mallard("init", data_dir=data)
    target = data / "dbt" / "target"

    models = len(list((DBT_DIR / "models").rglob("*.sql")))
    built = f"dbt build: {models}/{models} models built"
    out = mallard("pipeline", "run", data_dir=data)
    assert built in out.stdout, out.stdout
    assert _invoked_on(target) == "dbt"

    # The next pass leaves the views as the first built them (orchestration/window.py).
    out = mallard("pipeline", "run", data_dir=data, env={"MALLARD_DBT_IN_PROCESS": "0"})
    assert re.search(r"dbt build: (\d+)/\1 models built", out.stdout), out.stdout
    assert _invoked_on(target) == "MainThread"


def test_dbt_errors_and_exit_codes_come_back_as_from_the_cli(tmp_path: Path) -> None:
    """What dagster-dbt reads: JSON lines at info level and above (its errors carry level
    error), then the end of the stream, and dbt's exit code: not 0 when dbt failed."""
    missing = tmp_path / "no-project"
    run = DbtThread(
        ["dbt", "build", "--project-dir", str(missing), "--profiles-dir", str(DBT_DIR)],
        env={"DBT_LOG_PATH": str(tmp_path / "logs"), "DBT_TARGET_PATH": str(tmp_path / "t")},
    )
    lines = [json.loads(line) for line in run.stdout]
    assert run.wait(timeout=60) not in (0, None)
    assert lines, "no events"
    assert all(e["info"]["level"] != "debug" for e in lines)
    errors = [e["info"]["msg"] for e in lines if e["info"]["level"] == "error"]
    assert any("dbt_project.yml" in m or str(missing) in m for m in errors), errors
