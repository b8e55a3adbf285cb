"""dbt runs on a thread of the pipeline's process (orchestration/dbt_in_process.py), with
dagster-dbt reading the same JSON lines it reads from a `dbt` subprocess; and what that module
assumes of dagster-dbt's internals still holds."""

from __future__ import annotations

import ast
import inspect
import json
import re
import subprocess
import threading
import time
from pathlib import Path

import dagster_dbt
import pytest
from dagster_dbt.core import dbt_cli_invocation

from mallard.harness import mallard
from mallard.paths import DataPaths
from mallard.settings import get_settings
from orchestration.context import DBT_DIR
from orchestration.dbt_in_process import CHECKED_AGAINST_DAGSTER_DBT, DbtFailed, DbtThread, run_dbt
from orchestration.defs import dbt as dbt_defs
from tests.conftest import init_data_dir


def _calls_of(tree: ast.AST, module: str, name: str) -> list[ast.Call]:
    return [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == name
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id == module
    ]


def test_dagster_dbt_still_starts_dbt_the_way_dbt_thread_stands_in_for() -> None:
    """An upgrade of dagster-dbt that changes how it starts dbt fails here, not in a pass: the
    module's `subprocess` (what in_process_dbt swaps), one `subprocess.Popen` call with only
    keyword arguments DbtThread takes, stdout a pipe with stderr into it, and only the parts of
    the process DbtThread has. Then CHECKED_AGAINST_DAGSTER_DBT moves to the new release."""
    assert dbt_cli_invocation.subprocess is subprocess
    tree = ast.parse(inspect.getsource(dbt_cli_invocation))
    popens = _calls_of(tree, "subprocess", "Popen")
    assert len(popens) == 1, [ast.unparse(c) for c in popens]
    call = popens[0]
    assert not call.args, ast.unparse(call)
    keywords = {k.arg: ast.unparse(k.value) for k in call.keywords}
    accepted = set(inspect.signature(DbtThread).parameters)
    assert set(keywords) <= accepted, set(keywords) - accepted
    assert keywords["stdout"] == "subprocess.PIPE"
    assert keywords["stderr"] == "subprocess.STDOUT"
    used = {
        node.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Attribute)
        and node.value.attr == "process"
    }
    thread = DbtThread(["dbt", "--version"])
    thread.wait(timeout=60)
    assert used <= set(dir(thread)), used - set(dir(thread))
    assert dagster_dbt.__version__ == CHECKED_AGAINST_DAGSTER_DBT


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
    init_data_dir(data)
    target = data / "dbt" / "target"

    every_model_built = r"dbt build: ([1-9]\d*)/\1 models built"
    out = mallard("pipeline", "run", data_dir=data)
    assert re.search(every_model_built, out.stdout), out.stdout
    assert _invoked_on(target) == "dbt"

    # The next pass leaves the views as the first built them (orchestration/window.py).
    out = mallard("pipeline", "run", data_dir=data, env={"MALLARD_DBT_IN_PROCESS": "0"})
    assert re.search(every_model_built, out.stdout), out.stdout
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


def test_the_project_is_parsed_in_this_process_unless_dbt_runs_as_a_subprocess(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A data dir's first parse (ensure_manifest) starts no `dbt` process where passes run dbt
    in theirs; with MALLARD_DBT_IN_PROCESS=0 it does. Both write the manifest."""
    started: list[object] = []
    real_run = subprocess.run

    def run(*args: object, **kwargs: object) -> object:
        started.append(args[0])
        return real_run(*args, **kwargs)  # type: ignore[call-overload]

    monkeypatch.setattr(dbt_defs.subprocess, "run", run)
    monkeypatch.delenv("MALLARD_DBT_IN_PROCESS", raising=False)
    get_settings.cache_clear()
    try:
        manifest = dbt_defs.ensure_manifest(DataPaths(tmp_path / "here"))
        assert json.loads(manifest.read_text())["nodes"], "no nodes parsed"
        assert started == []

        monkeypatch.setenv("MALLARD_DBT_IN_PROCESS", "0")
        get_settings.cache_clear()
        manifest = dbt_defs.ensure_manifest(DataPaths(tmp_path / "apart"))
        assert json.loads(manifest.read_text())["nodes"], "no nodes parsed"
        assert len(started) == 1 and "parse" in started[0]  # type: ignore[operator]
    finally:
        get_settings.cache_clear()


def test_a_failed_dbt_command_in_this_process_raises_with_dbt_s_errors(tmp_path: Path) -> None:
    missing = tmp_path / "no-project"
    with pytest.raises(DbtFailed) as failed:
        run_dbt(["parse", "--project-dir", str(missing), "--profiles-dir", str(DBT_DIR)], {})
    assert "dbt_project.yml" in str(failed.value) or str(missing) in str(failed.value)


def test_a_manifest_read_while_dbt_rewrites_it_is_read_again_whole(tmp_path: Path) -> None:
    """dbt rewrites manifest.json in place; a process building its definitions meanwhile reads
    it half written, and waits for the whole of it (one read: JSONDecodeError)."""
    manifest = tmp_path / "manifest.json"
    whole = json.dumps({"metadata": {"dbt_version": "1.11"}, "nodes": {"model.a": {}}})
    manifest.write_text(whole[: len(whole) // 2])

    def finish() -> None:
        time.sleep(0.5)
        manifest.write_text(whole)

    writer = threading.Thread(target=finish)
    writer.start()
    try:
        assert dbt_defs.read_manifest(manifest)["nodes"] == {"model.a": {}}
    finally:
        writer.join()
