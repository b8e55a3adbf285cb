"""Typed runtime settings, read from MALLARD_* environment variables by a cached get_settings()."""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path


def _env(name: str, default: str) -> str:
    return os.environ.get(f"MALLARD_{name}", default)


@dataclass(frozen=True)
class Limits:
    """Request limits; the defaults are the interface's documented limits."""

    max_body_bytes: int = 1024 * 1024  # one request body: 1 MB, refused before parsing
    max_call_bytes: int = 32 * 1024  # one call, or one batch item: 32 KB
    rate_per_second: float = 100.0  # per token / writeKey
    rate_burst: int = 500
    # A request's body must have arrived this many seconds after the request did, or it gets
    # 408 (mallard/body_deadline.py): 1 MB in a minute is 17 KB/s; a slowloris client is cut off.
    body_timeout_s: float = 60.0
    # A request's head (request line and headers) must be complete this many seconds after the
    # connection opened or its previous response ended, and at most max_head_bytes long, or the
    # connection is closed (408 / 431; mallard/head_deadline.py). A browser's head is a few KB
    # in one packet; a client sending its head a byte at a time is cut off.
    head_timeout_s: float = 20.0
    max_head_bytes: int = 64 * 1024


@dataclass(frozen=True)
class Settings:
    data_dir: Path
    host: str = "127.0.0.1"
    port: int = 8000
    # The log is rolled into a Parquet landing file every roll_interval_s or roll_max_bytes,
    # whichever comes first: seconds bound freshness, bytes bound recovery time.
    roll_interval_s: float = 2.0
    roll_max_bytes: int = 16 * 1024 * 1024
    # fsync can be turned off only for throwaway benchmarks of the framework itself.
    fsync: bool = True
    # Names this collector's log directory and landing files; unique per collector process.
    collector_id: str = "c0"
    # `mallard serve`'s processes on its port (mallard/workers.py), each a collector of its own.
    serve_workers: int = 1
    limits: Limits = field(default_factory=Limits)
    # Query parameter of the hosted preferences page that carries the subscription id.
    prefs_query_param: str = "s"
    # The pipeline watcher's passes: a full pass (every model, tests, health checks, dispatch) this
    # long after the last one ended, served passes (the models the read API serves) between
    # them, so a message is served within seconds; 0: every pass is full.
    full_pass_every_s: float = 30.0
    # The niceness the pipeline's model builds and the API's background read-index builds run
    # at: on a shared machine the API's reads come first and the builds wait (at 10M, traits
    # p99 during a pass went from 24 to 10 ms with the pipeline's).
    pipeline_nice: int = 10
    # Whether the pipeline's model builds and maintenance run under SCHED_IDLE (Linux), taking
    # only the CPU that reads and ingest leave (see mallard/priority.py), rather than niced.
    pipeline_idle: bool = True
    # Whether the read API's event pages (and the events half of its read index) live in a
    # process of their own (api/pages.py), off the GIL that traits lookups need.
    pages_process: bool = True
    # Whether the pipeline runs dbt on a thread of its own process (orchestration/dbt_in_process.py)
    # rather than as a subprocess: each pass's models start seconds sooner. dbt runs one thread
    # either way (dbt_project/profiles.yml): two DuckLake writers fail each other's commits.
    dbt_in_process: bool = True
    # A table is compacted after a pass once it has this many files that compaction would
    # rewrite or merge (orchestration/maintenance.py); 0 leaves compaction to the nightly job.
    compact_at_files: int = 8
    # Compaction after a pass stops starting tables once it has run this long, and the tables
    # left wait for the next pass that completes: the one writer goes back to serving passes
    # instead of holding them through every fragmented table at once (0: no limit).
    compact_slice_s: float = 10.0
    # Fault injection for the fault tests: a regulation's run kills itself (SIGKILL) once the
    # step of this name has done its work, before Dagster records it ("" for none).
    fault_kill_at: str = ""
    # A dispatch with at least this many journey instances to move hands every second one to a
    # second process (orchestration/delivery/advance_helper.py); 0: never.
    journey_split_at: int = 20_000
    # The mail server email sends go to (`smtp://` or `smtps://`, optional `user:password@`,
    # `?starttls=1`); `make run` points it at its local mailbox.
    smtp_url: str = "smtp://127.0.0.1:1025"
    # The base of the links in messages (pixel, click redirects, unsubscribe, preferences);
    # "" for the address the server listens on (mallard/served.py).
    public_url: str = ""

    def with_data_dir(self, data_dir: str | Path) -> Settings:
        return replace(self, data_dir=Path(data_dir).resolve())


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    limits = Limits(
        max_body_bytes=int(_env("MAX_BODY_BYTES", str(Limits.max_body_bytes))),
        max_call_bytes=int(_env("MAX_CALL_BYTES", str(Limits.max_call_bytes))),
        rate_per_second=float(_env("RATE_PER_SECOND", str(Limits.rate_per_second))),
        rate_burst=int(_env("RATE_BURST", str(Limits.rate_burst))),
        body_timeout_s=float(_env("BODY_TIMEOUT_S", str(Limits.body_timeout_s))),
        head_timeout_s=float(_env("HEAD_TIMEOUT_S", str(Limits.head_timeout_s))),
        max_head_bytes=int(_env("MAX_HEAD_BYTES", str(Limits.max_head_bytes))),
    )
    return Settings(
        data_dir=Path(_env("DATA_DIR", "./data")).resolve(),
        host=_env("HOST", "127.0.0.1"),
        port=int(_env("PORT", "8000")),
        roll_interval_s=float(_env("ROLL_INTERVAL_S", "2.0")),
        roll_max_bytes=int(_env("ROLL_MAX_BYTES", str(16 * 1024 * 1024))),
        fsync=_env("FSYNC", "1") not in ("0", "false", "no"),
        collector_id=_env("COLLECTOR_ID", "c0"),
        serve_workers=int(_env("SERVE_WORKERS", "1")),
        limits=limits,
        prefs_query_param=_env("PREFS_QUERY_PARAM", "s"),
        pipeline_nice=int(_env("PIPELINE_NICE", "10")),
        pipeline_idle=_env("PIPELINE_IDLE", "1") not in ("0", "false", "no"),
        pages_process=_env("PAGES_PROCESS", "1") not in ("0", "false", "no"),
        dbt_in_process=_env("DBT_IN_PROCESS", "1") not in ("0", "false", "no"),
        compact_at_files=int(_env("COMPACT_AT_FILES", "8")),
        compact_slice_s=float(_env("COMPACT_SLICE_S", str(Settings.compact_slice_s))),
        full_pass_every_s=float(_env("FULL_PASS_EVERY_S", str(Settings.full_pass_every_s))),
        fault_kill_at=_env("FAULT_KILL_AT", ""),
        journey_split_at=int(_env("JOURNEY_SPLIT_AT", "20000")),
        smtp_url=_env("SMTP_URL", "smtp://127.0.0.1:1025"),
        public_url=_env("PUBLIC_URL", ""),
    )
