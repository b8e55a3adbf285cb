"""No component Mallard runs reports usage: every mallard command forces the telemetry switches
(mallard/offline.py) whatever the user's environment says, dbt and Dagster read them as off,
Dagster's instance has telemetry off, and DuckDB never installs an extension."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest
import yaml

from mallard.offline import DUCKDB_OFFLINE, dagster_yaml, force_offline
from mallard.paths import DataPaths
from mallard.warehouse import duckdb_config
from orchestration.context import ensure_dagster_home

REPO = Path(__file__).resolve().parents[3]
# What each switch must read, stated here and not taken from mallard/offline.py: re-enabling or
# dropping one there fails this test.
OFF = {
    "DO_NOT_TRACK": "1",
    "DAGSTER_DISABLE_TELEMETRY": "1",
    "DBT_SEND_ANONYMOUS_USAGE_STATS": "false",
}
# A user who turned every one of them on.
HOSTILE = {"DO_NOT_TRACK": "0", "DBT_SEND_ANONYMOUS_USAGE_STATS": "true"}

_SHOW_ENV = """
import json, os, sys
from mallard.cli import main
code = main(sys.argv[1:])
print(json.dumps({"code": code, "env": dict(os.environ)}))
"""


def test_a_mallard_command_forces_telemetry_off_for_itself_and_its_children(
    tmp_path: Path,
) -> None:
    env = {k: v for k, v in os.environ.items() if k not in OFF}
    env.update(HOSTILE, MALLARD_DATA_DIR=str(tmp_path / "data"))
    out = subprocess.run(
        [sys.executable, "-c", _SHOW_ENV, "init", "--json"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    # init prints its JSON first; the last line is what main left in os.environ.
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen["code"] == 0
    assert {k: seen["env"].get(k) for k in OFF} == OFF


def _dbt_sends_usage(project: Path, env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> bool:
    """dbt's own reading of its flags for `dbt parse` of `project` under `env`."""
    from dbt.cli.flags import Flags, args_to_context

    for key in OFF:
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    args = ["parse", "--project-dir", str(project), "--profiles-dir", str(project)]
    return bool(Flags(args_to_context(args)).SEND_ANONYMOUS_USAGE_STATS)


def test_dbt_reads_each_switch_as_off(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bare = tmp_path / "project"  # a project that says nothing: dbt's default is on
    bare.mkdir()
    (bare / "dbt_project.yml").write_text("name: bare\nversion: '1'\nprofile: bare\n")
    assert _dbt_sends_usage(bare, {}, monkeypatch)
    assert not _dbt_sends_usage(bare, {"DO_NOT_TRACK": OFF["DO_NOT_TRACK"]}, monkeypatch)
    key = "DBT_SEND_ANONYMOUS_USAGE_STATS"
    assert not _dbt_sends_usage(bare, {key: OFF[key]}, monkeypatch)
    env = dict(HOSTILE)
    force_offline(env)
    assert not _dbt_sends_usage(bare, env, monkeypatch)
    # Mallard's project, whose flags say false too, with a user's environment that says true.
    project = REPO / "dbt_project"
    assert not _dbt_sends_usage(project, env, monkeypatch)


def test_dagster_reads_the_switch_and_the_instance_as_off(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dagster import DagsterInstance
    from dagster._core.telemetry_upload import is_running_in_test

    env: dict[str, str] = {}
    force_offline(env)
    monkeypatch.delenv("DAGSTER_DISABLE_TELEMETRY", raising=False)
    monkeypatch.delenv("BUILDKITE", raising=False)
    monkeypatch.delenv("TF_BUILD", raising=False)
    assert not is_running_in_test()  # Dagster's gate before it uploads: open without the switch
    monkeypatch.setenv("DAGSTER_DISABLE_TELEMETRY", env["DAGSTER_DISABLE_TELEMETRY"])
    assert is_running_in_test()

    paths = DataPaths(tmp_path / "data")
    paths.dagster_home.mkdir(parents=True)
    # A dagster.yaml of the user's with telemetry and the UI's pop-up on: turned off, the rest
    # kept.
    (paths.dagster_home / "dagster.yaml").write_text(
        "telemetry:\n  enabled: true\nrun_monitoring:\n  enabled: true\nnux:\n  enabled: true\n"
    )
    home = ensure_dagster_home(paths)
    cfg = yaml.safe_load((home / "dagster.yaml").read_text())
    assert cfg == {
        "telemetry": {"enabled": False},
        "run_monitoring": {"enabled": True},
        "nux": {"enabled": False},
    }
    with DagsterInstance.from_config(str(home)) as instance:
        assert instance.telemetry_enabled is False
        assert instance.nux_enabled is False  # what the UI's shouldShowNux reads
    assert dagster_yaml((home / "dagster.yaml").read_text()) is None  # left as it is


def test_duckdb_never_installs_an_extension(tmp_path: Path) -> None:
    conn = duckdb.connect(":memory:", config=duckdb_config(DataPaths(tmp_path / "data")))
    settings = dict(
        conn.execute(
            "select name, value from duckdb_settings() where name like 'auto%_known_extensions'"
        ).fetchall()
    )
    assert settings == {
        "autoinstall_known_extensions": "false",
        "autoload_known_extensions": "true",
    }
    # dbt's connections (profiles.yml) have the same settings.
    profile = yaml.safe_load((REPO / "dbt_project" / "profiles.yml").read_text())
    options = profile["mallard"]["outputs"]["local"]["config_options"]
    assert {k: str(options[k]).lower() for k in DUCKDB_OFFLINE} == DUCKDB_OFFLINE
