"""Where everything lives under the data directory; the one place that names those files."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class DataPaths:
    root: Path

    @property
    def control_db(self) -> Path:
        """SQLite store of clients, accounts, brands, hashed tokens and writeKeys."""
        return self.root / "control.sqlite"

    @property
    def secret_file(self) -> Path:
        """Server secret for subscription ids (HMAC); never leaves the data dir."""
        return self.root / "secret.key"

    @property
    def preferences_journal(self) -> Path:
        """SQLite journal of preference changes accepted but not yet in the warehouse."""
        return self.root / "preferences_journal.sqlite"

    @property
    def outbox_db(self) -> Path:
        """SQLite outbox of sends (orchestration/delivery/) and the links each email carried."""
        return self.root / "outbox.sqlite"

    @property
    def mailbox_dir(self) -> Path:
        """The local mailbox's messages, one .eml file each (`mallard mailbox serve`)."""
        return self.root / "mailbox"

    @property
    def regulations_db(self) -> Path:
        """SQLite store of regulations, the collectors' suppression and NoTrack lists (hashed
        identifiers) and the tombstones of deleted subjects (mallard/regulations.py)."""
        return self.root / "regulations.sqlite"

    @property
    def regulations_generation(self) -> Path:
        """An 8-byte counter every change of the collectors' lists increments; each collector
        maps it and reloads its lists when it moves."""
        return self.root / "regulations.generation"

    @property
    def purge_generation(self) -> Path:
        """An 8-byte counter a Delete increments when it has purged the lake's files and again
        when it finishes: every long-running process then drops what it holds in memory of the
        catalog and of earlier snapshots (the API's read index, event pages and DuckDB
        connection; the orchestrator's shared DuckDB)."""
        return self.root / "regulations.purges"

    @property
    def access_dir(self) -> Path:
        """Access zips of finished ACCESS regulations, until their downloads expire."""
        return self.root / "access"

    @property
    def wal_dir(self) -> Path:
        return self.root / "wal"

    @property
    def landing_dir(self) -> Path:
        """Immutable Parquet landing files: date=YYYY-MM-DD/<collector>-<seq>.parquet."""
        return self.root / "landing"

    @property
    def metrics_dir(self) -> Path:
        """Client performance metrics the tag posts to /cdp/events/std/m, kept apart from events."""
        return self.root / "metrics"

    @property
    def lake_dir(self) -> Path:
        return self.root / "lake"

    @property
    def lake_catalog(self) -> Path:
        return self.lake_dir / "catalog.sqlite"

    @property
    def lake_data(self) -> Path:
        return self.lake_dir / "files"

    @property
    def extensions_dir(self) -> Path:
        """DuckDB extension directory populated from the duckdb-extension-* wheels (no network)."""
        return self.root / "duckdb_extensions"

    @property
    def dagster_home(self) -> Path:
        return self.root / "dagster"

    @property
    def dbt_target(self) -> Path:
        return self.root / "dbt" / "target"

    @property
    def dbt_logs(self) -> Path:
        return self.root / "dbt" / "logs"

    @property
    def dbt_docs(self) -> Path:
        """`mallard docs`: the dbt docs site (index.html, manifest.json, catalog.json), its own
        target dir so it never touches the passes' parse state in dbt_target."""
        return self.root / "dbt" / "docs"

    @property
    def run_dir(self) -> Path:
        """PID files and logs of processes started by `make run`."""
        return self.root / "run"

    @property
    def served_url(self) -> Path:
        """The address `mallard serve` listens on, http://host:port (mallard/served.py)."""
        return self.run_dir / "served-url"

    @property
    def last_pass(self) -> Path:
        """The record of the last pipeline pass, whoever ran it (mallard/passes.py)."""
        return self.run_dir / "last-pass.json"

    def landing_partition(self, date: str) -> Path:
        return self.landing_dir / f"date={date}"
