"""What one dbt invocation did, from its run_results.json: counts by node kind and the failures.

Dagster reports models and data tests but not dbt unit tests, and a failed step only carries
the last line of dbt's output; the CLI summary names what failed from dbt's own record instead.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

_PASSED = {"success", "pass"}
_KINDS = (("model", "models built"), ("test", "data tests"), ("unit_test", "unit tests"))


@dataclass(frozen=True)
class DbtTally:
    ok: bool
    summary: str


def tally(run_results: dict[str, Any]) -> DbtTally:
    """`13 models built, 31/31 data tests, 7/7 unit tests passed`, plus what failed."""
    total: Counter[str] = Counter()
    passed: Counter[str] = Counter()
    failed: list[str] = []
    for r in run_results.get("results", []):
        kind, _, rest = r["unique_id"].partition(".")
        total[kind] += 1
        if r["status"] in _PASSED:
            passed[kind] += 1
        elif r["status"] != "skipped":
            name = rest.split(".", 1)[-1]  # drop the project name
            failed.append(f"{kind} {name} ({r['status']})")
    parts = [f"{passed['model']}/{total['model']} models built"]
    parts += [f"{passed[k]}/{total[k]} {label}" for k, label in _KINDS[1:] if total[k]]
    summary = ", ".join(parts) + " passed"
    skipped = sum(total.values()) - sum(passed.values()) - len(failed)
    if failed:
        summary += f"; failed: {'; '.join(failed)}"
    if skipped:
        summary += f"; {skipped} skipped"
    return DbtTally(not failed and not skipped, summary)


def read_tally(target: Path, since: datetime) -> DbtTally | None:
    """The tally of the invocation that wrote target/run_results.json, if it ran after `since`."""
    path = target / "run_results.json"
    try:
        data = json.loads(path.read_text())
        generated = datetime.fromisoformat(data["metadata"]["generated_at"].replace("Z", "+00:00"))
    except (OSError, ValueError, KeyError):
        return None
    return tally(data) if generated >= since else None
