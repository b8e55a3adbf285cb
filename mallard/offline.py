"""The one definition of what keeps Mallard's processes off the network after install: the
telemetry switches of the components it runs, forced into every process, and DuckDB's settings.

`force_offline()` runs first thing in the CLI's main (every `mallard` command, and through
`mallard up` the server, the pipeline watcher and Dagster's processes), so dbt and Dagster, which
read these when they run, and every child process see them. They are forced, not defaulted: a
user's `DO_NOT_TRACK=0` or `DBT_SEND_ANONYMOUS_USAGE_STATS=true` does not turn usage reporting
on, because the promise of a self-hosted install is that no data leaves it (docs/privacy.md).
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping
from pathlib import Path
from typing import Any

# dbt reads DO_NOT_TRACK and DBT_SEND_ANONYMOUS_USAGE_STATS when it parses its flags (each alone
# turns its usage events off); Dagster reads DAGSTER_DISABLE_TELEMETRY before it uploads, and
# DAGSTER_HOME/dagster.yaml's `telemetry: enabled` (DAGSTER_OFF) before it logs an event. (uv
# runs only in `make install`, where the Makefile forbids it to download a Python; nothing runs
# it later.)
TELEMETRY_OFF = {
    "DO_NOT_TRACK": "1",
    "DAGSTER_DISABLE_TELEMETRY": "1",
    "DBT_SEND_ANONYMOUS_USAGE_STATS": "false",
}

# DuckDB installs a known extension from extensions.duckdb.org when a query needs one it does
# not have: never; the wheel-shipped ones are loaded by name (mallard/warehouse.py). dbt's
# profile (dbt_project/profiles.yml) sets the same, checked by tests/unit/mallard/test_offline.py.
DUCKDB_OFFLINE: dict[str, str] = {
    "autoinstall_known_extensions": "false",
    "autoload_known_extensions": "true",
}


def force_offline(environ: MutableMapping[str, str] = os.environ) -> None:
    """Set every telemetry switch off in `environ` (this process's, which children inherit)."""
    environ.update(TELEMETRY_OFF)


# The settings of DAGSTER_HOME/dagster.yaml forced off: `telemetry` (usage events), and `nux`,
# the Dagster UI's first-visit pop-up that asks for an email address to send to Dagster's
# community list (the UI reads it as the GraphQL field `shouldShowNux`).
DAGSTER_OFF = ("telemetry", "nux")


def dagster_yaml(existing: str) -> str | None:
    """The dagster.yaml text with each of DAGSTER_OFF's `enabled: false` and anything else
    kept, or None when `existing` already has them off."""
    import yaml

    cfg: Any = yaml.safe_load(existing) if existing.strip() else {}
    if not isinstance(cfg, dict):
        cfg = {}
    changed = False
    for key in DAGSTER_OFF:
        section = cfg.get(key)
        if isinstance(section, dict) and section.get("enabled") is False:
            continue
        cfg[key] = {**(section if isinstance(section, dict) else {}), "enabled": False}
        changed = True
    return str(yaml.safe_dump(cfg, sort_keys=False)) if changed else None


def ensure_dagster_settings_off(dagster_home: Path) -> None:
    """DAGSTER_HOME/dagster.yaml says `enabled: false` for each of DAGSTER_OFF, written if it
    did not."""
    cfg = dagster_home / "dagster.yaml"
    text = dagster_yaml(cfg.read_text() if cfg.exists() else "")
    if text is not None:
        tmp = cfg.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(text)
        os.replace(tmp, cfg)
