"""A regulation's run that stops outside the job's steps (here: the data dir's Dagster instance
cannot be opened) marks the regulation failed with the error, so a caller waiting on its status
sees the failure instead of `running` with no run behind it."""

from __future__ import annotations

from pathlib import Path

import pytest

from mallard.paths import DataPaths
from mallard.regulations import RegulationStore
from orchestration.regulations.job import run_regulation


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
