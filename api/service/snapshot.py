"""The snapshot an answer is read from, and the freshness headers that tell the client."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

FRESHNESS_HEADERS = ("x-mallard-data-through", "x-mallard-built-at", "x-mallard-snapshot")


@dataclass(frozen=True)
class Snapshot:
    version: int
    built_at: datetime | None
    data_through: datetime | None


def iso(t: datetime | None) -> str:
    return t.isoformat().replace("+00:00", "Z") if t else ""


def freshness_headers(snap: Snapshot) -> dict[str, str]:
    """How fresh an answer is: the newest receipt its data reflects, when it was built, and the
    warehouse snapshot it was read from (empty times before the first pipeline run)."""
    through, built, version = FRESHNESS_HEADERS
    return {through: iso(snap.data_through), built: iso(snap.built_at), version: str(snap.version)}
