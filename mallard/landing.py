"""Where the landing files are: the data dir's landing folder, and with MALLARD_LANDING_URL
(mallard/distributed.py) an S3 prefix that every collector lands into under its own id.

A landing file is named relative to its root: `date=D/<collector>-<seq>.parquet` in the data
dir, `<collector>/date=D/<collector>-<seq>.parquet` on S3 (the name says which: a local one
starts with `date=`). The pipeline loads from both, so files that `mallard import` lands in
the data dir still load when the collectors land on S3. An S3 object appears whole when its
PUT completes, so a landing there needs no temp file and no rename.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from mallard.distributed import storage
from mallard.paths import DataPaths

LOCAL_PREFIX = "date="


@dataclass(frozen=True)
class Landed:
    name: str  # relative to its root (above)
    mtime_ns: int  # when it landed: a local file's ctime (set by the rename), an object's mtime


def _local(paths: DataPaths) -> Iterator[Landed]:
    if paths.landing_dir.exists():
        for p in paths.landing_dir.glob("date=*/*.parquet"):
            if p.name.startswith("."):  # a roll in progress
                continue
            with suppress(FileNotFoundError):  # removed meanwhile (retention)
                yield Landed(str(p.relative_to(paths.landing_dir)), p.stat().st_ctime_ns)


def _bucket_path(url: str) -> str:
    return url.removeprefix("s3://").rstrip("/")


def _remote() -> Iterator[Landed]:
    where = storage()
    if not where.landing_url:
        return
    from pyarrow import fs

    root = _bucket_path(where.landing_url)
    sel = fs.FileSelector(root, recursive=True, allow_not_found=True)
    for info in where.s3_filesystem().get_file_info(sel):
        name = info.path.removeprefix(root + "/")
        if info.type == fs.FileType.File and name.endswith(".parquet") and "/date=" in name:
            yield Landed(name, int(info.mtime_ns or 0))


def listing(paths: DataPaths) -> list[Landed]:
    """Every complete landing file, local and remote."""
    return [*_local(paths), *_remote()]


def url(paths: DataPaths, name: str) -> str:
    """What DuckDB and pyarrow open for a landing file of that name."""
    if name.startswith(LOCAL_PREFIX):
        return str(paths.landing_dir / name)
    return storage().landing_url + name


def roots(paths: DataPaths) -> list[str]:
    """The prefixes url() puts before a name (the local one first)."""
    remote = storage().landing_url
    return [str(paths.landing_dir) + "/", *([remote] if remote else [])]


def remote_name(collector_id: str, day: str, file_name: str) -> str:
    return f"{collector_id}/date={day}/{file_name}"


def exists_remote(name: str) -> bool:
    from pyarrow import fs

    where = storage()
    info = where.s3_filesystem().get_file_info(_bucket_path(where.landing_url) + "/" + name)
    return bool(info.type == fs.FileType.File)


def write_remote(table: pa.Table, name: str) -> None:
    """One PUT of the whole file (visible whole or not at all), replacing any of that name."""
    where = storage()
    with where.s3_filesystem().open_output_stream(
        _bucket_path(where.landing_url) + "/" + name
    ) as out:
        pq.write_table(table, out, compression="zstd")


def read(paths: DataPaths, name: str) -> pa.Table:
    if name.startswith(LOCAL_PREFIX):
        return pq.read_table(paths.landing_dir / name)
    where = storage()
    return pq.read_table(
        _bucket_path(where.landing_url) + "/" + name, filesystem=where.s3_filesystem()
    )


def local_path(paths: DataPaths, name: str) -> Path | None:
    return paths.landing_dir / name if name.startswith(LOCAL_PREFIX) else None
