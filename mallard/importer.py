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

from mallard import gc_pause
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
    """Per row `head`: the JSON object {"userId": ..., "traits": {...}} of its non-null traits,
    the text its messageId hashes, built by polars for the whole frame.

    The text is what the per-row build of earlier releases made, so a file they imported keeps
    its messageIds: polars' JSON of {userId, traits} as one struct, and for a row with a null
    trait msgspec's re-encoding of that JSON without the nulls. Over random floats, strings and
    integers the two encoders differ only in a float's exponent (polars 1e+20, msgspec 1e20), so
    a row with a null is polars' JSON of each non-null column, joined, with `e+` made `e` in a
    float column; one with a float inside a struct or list is re-encoded as before
    (tests/unit/mallard/test_importer.py holds the two builds equal).
    """
    traits = [c for c in df.columns if c != "userId"]
    if not traits:
        user = pl.struct("userId").struct.json_encode().str.strip_suffix("}")
        return df.select("userId", (user + pl.lit(',"traits":{}}')).alias("head"))
    out = df.select("userId", _head_json(traits).alias("head"))
    nulls = pl.any_horizontal([pl.col(c).is_null() for c in traits])
    rows = df.select(nulls).to_series().arg_true()
    if rows.len():
        out = out.with_columns(out["head"].scatter(rows, _heads_without_nulls(df[rows], traits)))
    return out


def _head_json(traits: list[str]) -> pl.Expr:
    """polars' JSON of {userId, traits: {<name>: value, ...}}, null traits included."""
    values = [pl.col(c).alias(c.removeprefix("traits.")) for c in traits]
    return pl.struct(pl.col("userId"), pl.struct(values).alias("traits")).struct.json_encode()


def _heads_without_nulls(df: pl.DataFrame, traits: list[str]) -> pl.Series:
    """heads() of rows that have a null trait: the JSON of their non-null traits only."""
    if any(_nests_float(df.schema[c]) for c in traits):
        return pl.Series(
            [_without_nulls(h) for h in df.select(_head_json(traits)).to_series()],
            dtype=pl.String,
        )
    members = []
    for c in traits:
        member = (
            pl.struct(pl.col(c).alias(c.removeprefix("traits.")))
            .struct.json_encode()
            .str.strip_prefix("{")
            .str.strip_suffix("}")
        )
        if df.schema[c].is_float():
            member = member.str.replace("e+", "e", literal=True)
        members.append(pl.when(pl.col(c).is_not_null()).then(member))
    user = pl.struct("userId").struct.json_encode().str.strip_suffix("}")
    body = pl.concat_str(members, separator=",", ignore_nulls=True)
    return df.select(pl.concat_str([user, pl.lit(',"traits":{'), body, pl.lit("}}")])).to_series()


def _nests_float(dtype: Any) -> bool:
    """Whether a struct, list or array type holds a float somewhere inside."""
    if isinstance(dtype, pl.Struct):
        return any(f.dtype.is_float() or _nests_float(f.dtype) for f in dtype.fields)
    if isinstance(dtype, (pl.List, pl.Array)):
        return dtype.inner.is_float() or _nests_float(dtype.inner)
    return False


def _without_nulls(head: str) -> str:
    obj = msgspec.json.decode(head)
    obj["traits"] = {k: v for k, v in obj["traits"].items() if v is not None}
    return msgspec.json.encode(obj).decode()


@dataclass
class Chunk:
    """One segment's worth of stored messages: the columns of its landing file that differ
    between rows, as Arrow string arrays (`messages`: the records the log frames)."""

    event_ids: Any
    message_ids: Any
    user_ids: Any
    messages: Any

    def __len__(self) -> int:
        return len(self.messages)


def message_ids(heads: Any, prefix: bytes) -> Any:
    """`import:` and the first 32 hex digits of SHA-256(prefix + head), per head (a pyarrow
    string array), as a pyarrow string array."""
    import pyarrow as pa

    # The one step per row left in Python (~0.6 us a row): polars has no SHA-256. The prefix
    # is hashed once and each row's state copied from it; a head is a slice of the array's
    # buffer, not an object of its own.
    seed, digests = hashlib.sha256(prefix), bytearray()
    data, offsets = _values(heads)
    for start, end in zip(offsets[:-1], offsets[1:], strict=False):
        h = seed.copy()
        h.update(data[start:end])
        digests += h.digest()[:16]
    raw = pa.FixedSizeBinaryArray.from_buffers(
        pa.binary(16), len(heads), [None, pa.py_buffer(digests)]
    )
    hexed = ("import:" + pl.Series(raw).cast(pl.Binary).bin.encode("hex")).to_arrow()
    return hexed.cast(pa.string())


def _values(strings: Any) -> tuple[memoryview, list[int]]:
    """A pyarrow string array's data buffer, where its values lie end to end, and each value's
    start (and the last one's end) in it."""
    import numpy as np

    _, offsets, data = strings.buffers()
    at = strings.offset
    ends = np.frombuffer(offsets, np.int32)[at : at + len(strings) + 1].tolist()
    return memoryview(data if data is not None else b""), ends  # no data: every value empty


def chunk_messages(part: pl.DataFrame, st: Stamping, keep: list[bool] | None) -> Chunk:
    """The stored identify messages of the rows of `part` (heads()) that are kept: the
    record of each is its head's members, messageId, a fresh eventId and the shared tail."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from mallard.ids import new_ids

    if keep is not None:
        part = part.filter(pl.Series(keep, dtype=pl.Boolean))

    def arrow(column: pl.Series) -> Any:
        # polars' string views as they are; Arrow makes the plain strings the landing has.
        return column.to_arrow(compat_level=pl.CompatLevel.newest()).cast(pa.string())

    heads = arrow(part["head"])
    event_ids = new_ids(part.height)
    ids = message_ids(heads, st.prefix)
    # Joined by Arrow, whose allocator reuses the last chunk's memory: built by polars and
    # exported, the records took two fresh copies (~0.2 s per million rows more).
    messages = pc.binary_join_element_wise(
        pc.utf8_slice_codeunits(heads, 0, -1),  # the head without its closing brace
        ',"messageId":"',
        ids,
        '","eventId":"',
        event_ids,
        f'",{st.tail}}}',
        "",
    )
    return Chunk(event_ids, ids, arrow(part["userId"]), messages)


def landing_table(chunk: Chunk, st: Stamping) -> Any:
    """The landing table collector/roller.py's records_to_tables makes of these records, built
    from the columns at hand instead of decoding every record again (that was 16 us a row)."""
    import pyarrow as pa

    from mallard.schemas import LANDING_SCHEMA

    n, t = len(chunk), st.tenant

    def same(value: Any, field: str) -> Any:
        return pa.repeat(pa.scalar(value, LANDING_SCHEMA.field(field).type), n)

    return pa.table(
        {
            "event_id": chunk.event_ids,
            "message_id": chunk.message_ids,
            "client_id": same(t.client_id, "client_id"),
            "account_id": same(t.account_id, "account_id"),
            "brand_id": same(t.brand_id, "brand_id"),
            "type": same("identify", "type"),
            "event": same(None, "event"),
            "user_id": chunk.user_ids,
            "anonymous_id": same(None, "anonymous_id"),
            "timestamp": same(st.received, "timestamp"),
            "received_at": same(st.received, "received_at"),
            "sent_at": same(None, "sent_at"),
            "channel": same(CHANNEL, "channel"),
            "source": same(COLLECTOR, "source"),
            "message": chunk.messages,
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

    def seal(self, messages: Any) -> Path:
        """One segment of the records (a pyarrow string array), written, fsynced and renamed
        sealed; returns it."""
        from collector.wal import SEALED_SUFFIX, fsync_dir, write_frames

        # Milliseconds since the epoch: later imports take later numbers, no landing name is
        # reused. Several chunks in one millisecond take the next numbers.
        seq = max(self._next_seq, time.time_ns() // 1_000_000)
        self._next_seq = seq + 1
        sealed = self.dir / f"{seq:016d}{SEALED_SUFFIX}"
        tmp = self.dir / f".{seq:016d}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            write_frames(fd, *_values(messages))
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
    # A chunk makes a few short-lived objects per row (digests, slices, frames), none in a
    # cycle; the collections they set off traversed every live object (~8% of the import's CPU).
    with gc_pause.paused():
        try:
            for start in range(0, df.height, chunk_rows):
                part = heads(df.slice(start, chunk_rows))
                keep = None
                if regulated:
                    items = [("identify", {"userId": u}) for u in part["userId"]]
                    drops = admit_regulated(snapshot, tenant, CHANNEL, items)
                    keep = None if drops is None else [reason is None for reason in drops]
                chunk = chunk_messages(part, st, keep)
                dropped += part.height - len(chunk)
                if len(chunk):
                    segment = log.seal(chunk.messages)
                    table = landing_table(chunk, st)
                    if landing is not None:
                        landing.result()
                    landing = lander.submit(log.land, segment, table, day)
                    stored += len(chunk)
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
