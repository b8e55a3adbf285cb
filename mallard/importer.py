"""`mallard import customers`: a CSV, Parquet or JSON-lines file of customers, stored as identify
messages by a collector of its own (id `import`), with no server running.

Every row is checked before anything is stored; one bad row stores nothing. The rows then pass
the regulation lists (a suppressed user's row is dropped and counted) and are written as the
dispatcher's outcomes are (orchestration/delivery/dispatch.py OutcomeLog): framed, fsynced,
sealed segments of `wal/import/`, each rolled into a landing file, so the next pipeline pass
loads them like any collector's. A row's messageId is a hash of the account, the file's content
and the row, so importing the same file again adds only duplicates the pipeline drops.

Each message carries `context.mallardImport` = {filename, createdTime} and is stamped with
channel `import`: a customer whose first message is such a row shows
`createdBy = {filename, createdTime, type: "import"}` (dbt customer_profiles).
"""

from __future__ import annotations

import asyncio
import fcntl
import hashlib
import os
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import msgspec
import polars as pl

from mallard.paths import DataPaths

COLLECTOR = "import"
CHANNEL = "import"
LIBRARY = {"name": "mallard-import"}
# Rows per sealed segment (and landing file): ~1 s of work each, a few MB of log.
CHUNK_ROWS = 50_000
MAX_REPORTED = 50
USER_ID_COLUMNS = ("userId", "user_id")
EMAIL_COLUMN = "email"
# Plausible, not RFC 5322: one @, no spaces, a dot in the domain.
EMAIL = r"^[^@\s]+@[^@\s]+\.[^@\s]+$"
_SUFFIXES = {".csv": "csv", ".parquet": "parquet", ".jsonl": "jsonl", ".ndjson": "jsonl"}


class ImportFailed(Exception):
    """The file cannot be imported as a whole (unreadable, unknown tenant, bad --map)."""


@dataclass(frozen=True)
class BadRows:
    """Rows that fail a check: (line, reason) in line order."""

    problems: list[tuple[int, str]]


@dataclass(frozen=True)
class Summary:
    read: int
    stored: int
    dropped: int
    seconds: float

    @property
    def rate(self) -> float:
        return self.read / self.seconds if self.seconds > 0 else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            "read": self.read,
            "stored": self.stored,
            "droppedByRegulations": self.dropped,
            "seconds": round(self.seconds, 3),
            "rowsPerSecond": round(self.rate),
        }


# --- reading and mapping ----------------------------------------------------------------------


def read_file(path: Path) -> tuple[pl.DataFrame, int]:
    """The rows, and the line number of the first one (CSV: 2, after the header)."""
    kind = _SUFFIXES.get(path.suffix.lower())
    if kind is None:
        raise ImportFailed(f"{path.name}: expected a .csv, .parquet or .jsonl file")
    try:
        if kind == "csv":
            # Every value as text: a CSV has no types, and inference would turn "01234" into 1234.
            return pl.read_csv(path, infer_schema=False), 2
        if kind == "parquet":
            return pl.read_parquet(path), 1
        return pl.read_ndjson(path, infer_schema_length=None), 1
    except (OSError, pl.exceptions.PolarsError) as e:
        raise ImportFailed(f"{path.name}: cannot be read: {e}") from e


def column_map(columns: list[str], explicit: list[str]) -> dict[str, str]:
    """Column -> field (`userId`, `email`, `traits.<name>`) for the kept columns.

    By convention a `userId` or `user_id` column is the userId, `email` the email, every other
    column a trait of its name; `--map column=field` (field `-`: drop the column) overrides.
    """
    out: dict[str, str] = {}
    for c in columns:
        if c in USER_ID_COLUMNS:
            out[c] = "userId"
        elif c == EMAIL_COLUMN:
            out[c] = "email"
        else:
            out[c] = f"traits.{c}"
    for item in explicit:
        column, sep, field = item.partition("=")
        if not sep or not column:
            raise ImportFailed(f"--map {item!r}: expected column=userId|email|traits.<name>|-")
        if column not in columns:
            raise ImportFailed(f"--map {item!r}: no column {column!r} in the file")
        if field == "-":
            out.pop(column, None)
        elif field == "traits.email":  # the email is a trait anyway
            out[column] = "email"
        elif field in ("userId", "email") or (field.startswith("traits.") and len(field) > 7):
            out[column] = field
        else:
            raise ImportFailed(
                f"--map {item!r}: the field must be userId, email, traits.<name> or -"
            )
    fields = list(out.values())
    for f in set(fields):
        if fields.count(f) > 1:
            names = ", ".join(c for c, v in out.items() if v == f)
            raise ImportFailed(
                f"columns {names} all map to {f}; --map one of them elsewhere or to -"
            )
    if "userId" not in fields:
        raise ImportFailed("no userId column: name one userId or user_id, or --map <column>=userId")
    return out


def shape(df: pl.DataFrame, mapping: dict[str, str]) -> pl.DataFrame:
    """Columns renamed to their fields (userId, email, traits.<name>), the dropped ones gone;
    dates and times as ISO text, since traits are JSON."""
    df = df.select([pl.col(c).alias(f) for c, f in mapping.items()])
    casts = []
    for name, dtype in df.schema.items():
        if name == "userId" and dtype != pl.String:
            if dtype.is_numeric():
                casts.append(pl.col(name).cast(pl.String))
        elif dtype.is_temporal():
            casts.append(pl.col(name).cast(pl.String))
        elif isinstance(dtype, pl.Decimal):
            casts.append(pl.col(name).cast(pl.Float64))
    return df.with_columns(casts) if casts else df


def check(df: pl.DataFrame, first_line: int) -> BadRows:
    """Every row's problems (a row may have several): userId, email, trait values."""
    checks: list[pl.Expr] = []
    uid = pl.col("userId")
    if df.schema["userId"] == pl.String:
        checks.append(
            pl.when(uid.is_null() | (uid.str.strip_chars() == ""))
            .then(pl.lit("userId is empty"))
            .when(uid != uid.str.strip_chars())
            .then(pl.lit("userId has leading or trailing spaces"))
        )
    else:
        checks.append(
            pl.when(uid.is_null())
            .then(pl.lit("userId is empty"))
            .otherwise(pl.lit(f"userId must be a string, not {df.schema['userId']}"))
        )
    if "email" in df.columns:
        email = pl.col("email")
        if df.schema["email"] == pl.String:
            checks.append(
                pl.when(email.is_not_null() & (email.str.strip_chars() != "")).then(
                    pl.when(~email.str.contains(EMAIL)).then(
                        pl.lit('email is not a valid address: "')
                        + email.str.slice(0, 60)
                        + pl.lit('"')
                    )
                )
            )
        else:
            checks.append(pl.when(email.is_not_null()).then(pl.lit("email must be a string")))
    for name, dtype in df.schema.items():
        if not name.startswith("traits."):
            continue
        trait = name[7:]
        col = pl.col(name)
        if dtype in (pl.Binary, pl.Object) or isinstance(dtype, pl.Categorical):
            if dtype != pl.Categorical:
                checks.append(
                    pl.when(col.is_not_null()).then(pl.lit(f"trait {trait} is not JSON ({dtype})"))
                )
        elif dtype.is_float():
            checks.append(
                pl.when(col.is_nan() | col.is_infinite()).then(
                    pl.lit(f"trait {trait} is not a finite number")
                )
            )
    problems: list[tuple[int, str]] = []
    if not checks:
        return BadRows(problems)
    found = (
        df.lazy()
        .with_row_index("row")
        .select(pl.col("row"), pl.concat_list([c.alias(f"c{i}") for i, c in enumerate(checks)]))
        .rename({"c0": "reasons"})
        .with_columns(pl.col("reasons").list.drop_nulls())
        .filter(pl.col("reasons").list.len() > 0)
        .collect()
    )
    for row, reasons in found.iter_rows():
        problems.extend((row + first_line, reason) for reason in reasons)
    return BadRows(problems)


def report(bad: BadRows) -> list[str]:
    """The lines to print: at most MAX_REPORTED problems, then how many more."""
    lines = [f"line {line}: {reason}" for line, reason in bad.problems[:MAX_REPORTED]]
    rest = len(bad.problems) - MAX_REPORTED
    if rest > 0:
        lines.append(f"... and {rest} more")
    rows = len({line for line, _ in bad.problems})
    lines.append(f"{rows} bad row(s), {len(bad.problems)} problem(s): nothing was imported")
    return lines


# --- messages ---------------------------------------------------------------------------------


def file_digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


@dataclass(frozen=True)
class Stamping:
    """What every message of one import shares: its tenant, receipt time and stamped fields."""

    tenant: Any
    received: datetime
    prefix: bytes  # of each messageId's hash: the account and the file's content
    tail: str  # the stamped fields after userId, traits, messageId and eventId, as JSON members


def stamping(tenant: Any, digest: str, filename: str, started: datetime) -> Stamping:
    """The fields collector.messages.stamp() adds, computed once: an import's rows differ only
    in userId, traits, messageId and eventId (stamping each row was 40% of the import)."""
    from collector.messages import iso, stamp

    # Milliseconds, as the stored ISO text: the landing columns must parse back to the same.
    received = started.replace(microsecond=started.microsecond // 1000 * 1000)
    context = {
        "library": LIBRARY,
        "mallardImport": {"filename": filename, "createdTime": iso(received)},
    }
    base = stamp(
        "identify",
        {"context": context},
        tenant,
        channel=CHANNEL,
        source=COLLECTOR,
        received=received,
        request_ip=None,
    )
    del base["eventId"], base["messageId"]
    tail = msgspec.json.encode(base).decode()[1:-1]
    return Stamping(tenant, received, f"{tenant.account_id}:{digest}:".encode(), tail)


def heads(df: pl.DataFrame) -> pl.DataFrame:
    """Per row `head`: the JSON object {"userId": ..., "traits": {...}} (null traits included),
    and `nulls`: whether a trait is null, so that row's object is written again without them."""
    traits = [c for c in df.columns if c != "userId"]
    fields = [pl.col("userId")]
    if traits:
        fields.append(
            pl.struct([pl.col(c).alias(c.removeprefix("traits.")) for c in traits]).alias("traits")
        )
    nulls = pl.any_horizontal([pl.col(c).is_null() for c in traits]) if traits else pl.lit(False)
    return df.select(
        pl.col("userId"),
        pl.struct(fields).struct.json_encode().alias("head"),
        nulls.alias("nulls"),
    )


@dataclass
class Chunk:
    """One segment's worth of stored messages: the columns of its landing file and records."""

    event_ids: list[str]
    message_ids: list[str]
    user_ids: list[str]
    records: list[str]


def chunk_messages(part: pl.DataFrame, st: Stamping, keep: list[bool] | None) -> Chunk:
    """The stored identify messages of the rows of `part` (heads()) that are kept."""
    from mallard.ids import new_id

    decode, encode = msgspec.json.decode, msgspec.json.encode
    sha256, prefix, tail = hashlib.sha256, st.prefix, st.tail
    out = Chunk([], [], [], [])
    rows = zip(part["userId"], part["head"], part["nulls"], strict=True)
    for i, (user_id, head, nulls) in enumerate(rows):
        if keep is not None and not keep[i]:
            continue
        if nulls:
            obj = decode(head)
            obj["traits"] = {k: v for k, v in obj["traits"].items() if v is not None}
            head = encode(obj).decode()
        if not head.endswith("}}"):  # no trait column at all
            head = head[:-1] + ',"traits":{}}'
        message_id = "import:" + sha256(prefix + head.encode()).hexdigest()[:32]
        event_id = new_id()
        out.event_ids.append(event_id)
        out.message_ids.append(message_id)
        out.user_ids.append(user_id)
        out.records.append(
            f'{head[:-1]},"messageId":"{message_id}","eventId":"{event_id}",{tail}}}'
        )
    return out


def landing_table(chunk: Chunk, st: Stamping) -> Any:
    """The landing table collector/roller.py's records_to_tables makes of these records, built
    from the columns at hand instead of decoding every record again (that was 16 us a row)."""
    import pyarrow as pa

    from mallard.schemas import LANDING_SCHEMA

    n, t = len(chunk.records), st.tenant

    def same(value: Any, field: str) -> Any:
        return pa.array([value] * n, LANDING_SCHEMA.field(field).type)

    return pa.table(
        {
            "event_id": pa.array(chunk.event_ids, pa.string()),
            "message_id": pa.array(chunk.message_ids, pa.string()),
            "client_id": same(t.client_id, "client_id"),
            "account_id": same(t.account_id, "account_id"),
            "brand_id": same(t.brand_id, "brand_id"),
            "type": same("identify", "type"),
            "event": same(None, "event"),
            "user_id": pa.array(chunk.user_ids, pa.string()),
            "anonymous_id": same(None, "anonymous_id"),
            "timestamp": same(st.received, "timestamp"),
            "received_at": same(st.received, "received_at"),
            "sent_at": same(None, "sent_at"),
            "channel": same(CHANNEL, "channel"),
            "source": same(COLLECTOR, "source"),
            "message": pa.array(chunk.records, pa.string()),
        },
        schema=LANDING_SCHEMA,
    )


# --- storing ----------------------------------------------------------------------------------


class ImportLog:
    """The import's own log directory: one sealed segment per chunk, landed as the roller
    names it (`landing/date=<day>/import-<seq>.parquet`), then deleted. A segment left by an
    interrupted import is landed by the next one (collector/roller.py recover)."""

    def __init__(self, paths: DataPaths) -> None:
        from collector.roller import recover

        self.paths = paths
        self.dir = paths.wal_dir / COLLECTOR
        self.dir.mkdir(parents=True, exist_ok=True)
        # One import at a time: two would take the same segment numbers.
        self._lock_fd = os.open(self.dir / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._lock_fd)
            raise ImportFailed("another import is running on this data dir") from None
        self._next_seq = recover(self.dir, paths, COLLECTOR)

    def seal(self, records: list[str]) -> Path:
        """One segment, written, fsynced and renamed sealed; returns it."""
        from collector.wal import SEALED_SUFFIX, frame, fsync_dir

        # Milliseconds since the epoch: later imports take later numbers, no landing name is
        # reused. Several chunks in one millisecond take the next numbers.
        seq = max(self._next_seq, time.time_ns() // 1_000_000)
        self._next_seq = seq + 1
        sealed = self.dir / f"{seq:016d}{SEALED_SUFFIX}"
        tmp = self.dir / f".{seq:016d}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, b"".join([frame(r.encode()) for r in records]))
            os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(tmp, sealed)
        fsync_dir(self.dir)
        return sealed

    def land(self, segment: Path, table: Any, day: str) -> None:
        from collector.roller import write_atomic
        from collector.wal import fsync_dir, segment_seq

        target = (
            self.paths.landing_partition(day) / f"{COLLECTOR}-{segment_seq(segment):016d}.parquet"
        )
        if not target.exists():
            write_atomic(table, target)
        segment.unlink(missing_ok=True)
        fsync_dir(self.dir)

    def close(self) -> None:
        os.close(self._lock_fd)


def _progress(total: int) -> Any:
    try:
        from tqdm import tqdm
    except ImportError:  # pragma: no cover - tqdm comes with the pipeline's dependencies
        return None
    # disable=None: a bar on a terminal, nothing in a pipe or a test.
    return tqdm(total=total, unit="rows", unit_scale=True, file=sys.stderr, disable=None)


def import_customers(
    paths: DataPaths,
    path: Path,
    *,
    client_id: str,
    account_id: str,
    brand_id: str | None,
    mapping: list[str],
    chunk_rows: int = CHUNK_ROWS,
) -> Summary | BadRows:
    """Checks the whole file, then stores it; BadRows (nothing stored) when a row fails."""
    from concurrent.futures import Future, ThreadPoolExecutor

    from collector.admission import Admission, admit_regulated
    from collector.messages import iso
    from mallard.regulations import AdmissionLists
    from mallard.tenancy import ControlStore

    t0 = time.monotonic()
    started = datetime.now(UTC)
    tenant = _tenant(ControlStore(paths.control_db), client_id, account_id, brand_id)
    df, first_line = read_file(path)
    df = shape(df, column_map(df.columns, mapping))
    bad = check(df, first_line)
    if bad.problems:
        return bad
    st = stamping(tenant, file_digest(path), path.name, started)
    day = iso(st.received)[:10]
    snapshot = asyncio.run(Admission(AdmissionLists(paths)).current())
    regulated = account_id in snapshot.accounts
    log = ImportLog(paths)
    bar = _progress(df.height)
    stored = dropped = 0
    # Parquet writing releases the GIL: a chunk lands while the next one is made.
    lander = ThreadPoolExecutor(max_workers=1, thread_name_prefix="import-land")
    landing: Future[None] | None = None
    try:
        for start in range(0, df.height, chunk_rows):
            part = heads(df.slice(start, chunk_rows))
            keep = None
            if regulated:
                items = [("identify", {"userId": u}) for u in part["userId"]]
                keep = admit_regulated(snapshot, tenant, CHANNEL, items)
            chunk = chunk_messages(part, st, keep)
            dropped += part.height - len(chunk.records)
            if chunk.records:
                segment = log.seal(chunk.records)
                table = landing_table(chunk, st)
                if landing is not None:
                    landing.result()
                landing = lander.submit(log.land, segment, table, day)
                stored += len(chunk.records)
            if bar is not None:
                bar.update(part.height)
        if landing is not None:
            landing.result()
    finally:
        lander.shutdown(wait=True)
        if bar is not None:
            bar.close()
        log.close()
    return Summary(df.height, stored, dropped, time.monotonic() - t0)


def _tenant(control: Any, client_id: str, account_id: str, brand_id: str | None) -> Any:
    from collector.messages import Tenant

    known = {(c, a): b for c, a, b in control.accounts()}
    if (client_id, account_id) not in known:
        raise ImportFailed(f"unknown account {client_id}/{account_id}")
    # With no brands configured an account's brand is its id in upper case (tenancy).
    brands = known[(client_id, account_id)] or [account_id.upper()]
    if brand_id is None:
        if len(brands) > 1:
            raise ImportFailed(
                f"account {client_id}/{account_id} has brands {', '.join(sorted(brands))}:"
                " choose one with --brand"
            )
        brand_id = brands[0]
    if not control.tenant_exists(client_id, account_id, brand_id):
        raise ImportFailed(f"unknown brand {brand_id} of {client_id}/{account_id}")
    return Tenant(client_id, account_id, brand_id)
