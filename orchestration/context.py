"""Where the orchestration runs (MALLARD_DATA_DIR) and the environment dbt needs."""

from __future__ import annotations

import hashlib
import hmac
import os
from pathlib import Path

from mallard.paths import DataPaths
from mallard.priority import yield_cpu
from mallard.settings import get_settings
from orchestration.warehouse import ensure_secret

REPO = Path(__file__).resolve().parents[1]
DBT_DIR = REPO / "dbt_project"


def data_paths() -> DataPaths:
    return DataPaths(Path(os.environ.get("MALLARD_DATA_DIR") or get_settings().data_dir).resolve())


def hmac_pads(secret_hex: str) -> tuple[str, str]:
    """Inner and outer HMAC-SHA256 pads of the key, hex (RFC 2104)."""
    key = bytes.fromhex(secret_hex)
    if len(key) > 64:
        key = hashlib.sha256(key).digest()
    key = key.ljust(64, b"\0")
    return bytes(b ^ 0x36 for b in key).hex(), bytes(b ^ 0x5C for b in key).hex()


def subscription_id(secret_hex: str, customer_id: str) -> str:
    """What the customers model computes in SQL: HMAC-SHA256(secret, customer id), hex."""
    return hmac.new(bytes.fromhex(secret_hex), customer_id.encode(), hashlib.sha256).hexdigest()


def dbt_env(paths: DataPaths) -> dict[str, str]:
    ipad, opad = hmac_pads(ensure_secret(paths))
    return {
        "MALLARD_DATA_DIR": str(paths.root),
        "MALLARD_HMAC_IPAD": ipad,
        "MALLARD_HMAC_OPAD": opad,
        "DO_NOT_TRACK": "1",
        "DBT_SEND_ANONYMOUS_USAGE_STATS": "false",
    }


def ensure_dagster_home(paths: DataPaths) -> Path:
    home = paths.dagster_home
    home.mkdir(parents=True, exist_ok=True)
    cfg = home / "dagster.yaml"
    if not cfg.exists():
        cfg.write_text("telemetry:\n  enabled: false\n")
    return home


def yield_cpu_to_readers() -> None:
    """Run this thread (and the dbt it starts) at MALLARD_PIPELINE_NICE and, unless
    MALLARD_PIPELINE_IDLE=0, under SCHED_IDLE, so a build on the same machine as the API takes
    the CPU the API's reads leave. Niceness only ever rises."""
    settings = get_settings()
    yield_cpu(settings.pipeline_nice, idle=settings.pipeline_idle)
