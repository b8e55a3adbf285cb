"""Where the orchestration's code and dbt project live, the data dir a Dagster code location
serves (MALLARD_DATA_DIR), and the priority its builds run at."""

from __future__ import annotations

import hashlib
import hmac
import os
from pathlib import Path

from mallard.offline import ensure_dagster_settings_off
from mallard.paths import DataPaths
from mallard.priority import yield_cpu
from mallard.settings import get_settings

REPO = Path(__file__).resolve().parents[1]
DBT_DIR = REPO / "dbt_project"


def dbt_project_args(target: Path, paths: DataPaths) -> list[str]:
    """The arguments every dbt command of the orchestrator takes: the project, its profile,
    the target dir it writes to, the data dir's dbt logs, and a quiet console."""
    return [
        "--project-dir",
        str(DBT_DIR),
        "--profiles-dir",
        str(DBT_DIR),
        "--target-path",
        str(target),
        "--log-path",
        str(paths.dbt_logs),
        "--quiet",
    ]


def data_paths() -> DataPaths:
    """The data dir of a process started without one (the Dagster webserver and daemon load
    orchestration/definitions.py): MALLARD_DATA_DIR, else the settings' default. Read once, when
    the definitions are built; the assets, ops and sensors get it from the `LakeResource`."""
    return DataPaths(Path(os.environ.get("MALLARD_DATA_DIR") or get_settings().data_dir).resolve())


def subscription_id(secret_hex: str, customer_id: str) -> str:
    """What the customers model computes in SQL: HMAC-SHA256(secret, customer id), hex."""
    return hmac.new(bytes.fromhex(secret_hex), customer_id.encode(), hashlib.sha256).hexdigest()


def ensure_dagster_home(paths: DataPaths) -> Path:
    home = paths.dagster_home
    home.mkdir(parents=True, exist_ok=True)
    ensure_dagster_settings_off(home)
    return home


def yield_cpu_to_readers() -> None:
    """Run this thread (and the dbt it starts) at MALLARD_PIPELINE_NICE and, unless
    MALLARD_PIPELINE_IDLE=0, under SCHED_IDLE, so a build on the same machine as the API takes
    the CPU the API's reads leave. Niceness only ever rises."""
    settings = get_settings()
    yield_cpu(settings.pipeline_nice, idle=settings.pipeline_idle)
