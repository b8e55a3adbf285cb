"""The Access export: a zip of what the lake holds on a subject, read at one snapshot.

The rows come from the selection Delete removes (subjects.selections): the zip's messages,
events, trait history, identifier sightings and profiles are exactly the rows a Delete of the same
subject takes out of those tables, and `rows_by_table` in the manifest counts, per lake table, the
subject's rows a Delete removes (exported as a file or held in another table derived from
them). Every query runs in one read transaction at one snapshot, so the files agree with each
other.

The zip holds:
- `manifest.json`: regulation, snapshot, creation time, per file its SHA-256, bytes and rows;
- `profile.json`, `identifiers.json`, `preferences.json`, `regulations.json`: JSON arrays;
- `events.jsonl` (marts.events `record`, byte for byte), `messages.jsonl` (raw.messages `message`
  embedded as received), `trait_history.jsonl`, `identifier_sightings.jsonl`, `deliveries.jsonl`;
- a CSV twin of each of those (`events.csv`, ...), nested values as JSON text;
- `README.md`, answering GDPR Art. 15(1)(a)-(h) for this subject.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import zipfile
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import duckdb
import polars as pl

from mallard.regulations import Regulation
from orchestration.maintenance import SNAPSHOT_RETENTION
from orchestration.regulations.subjects import Selection, Subject, selections

# The lake tables whose selected rows are files of the zip, and the file (without extension).
EXPORTED = {
    "raw.messages": "messages",
    "marts.events": "events",
    "intermediate.int_trait_history": "trait_history",
    "state.customer_identifier_sightings": "identifier_sightings",
    "marts.customer_profiles": "profile",
    "marts.deliveries": "deliveries",
}
# What the subject's rows in the other tables are: copies or derivations of the exported data, or
# bookkeeping of the pipeline. A Delete removes them as well. A table not named here is described
# by its schema (SCHEMA_ROLES).
DERIVED = {
    "intermediate.int_messages_deduped": "your messages, once each (as in messages.jsonl)",
    "intermediate.int_messages_identified": (
        "your messages with the customer each belongs to (as in messages.jsonl)"
    ),
    "intermediate.int_identity_map": (
        "which userId each of your anonymousIds belongs to (as in identifiers.json)"
    ),
    "intermediate.int_customer_traits": "your current traits (as in profile.json)",
    "marts.trait_history": (
        "what your profile held at each time, trait by trait (from trait_history.jsonl)"
    ),
    "intermediate.int_customers_changed": "which customers a pipeline pass rebuilt",
    "intermediate.int_preference_changes": (
        "each marketing preference change your messages made (as in preferences.json)"
    ),
    "state.customer_event_objects": (
        "candidates for your first and last event of each kind (firstEvent and lastEvent of the"
        " metadata in profile.json)"
    ),
    "intermediate.int_group_calls": (
        "each group (company, team or account) your messages put you in, with the traits they"
        " gave it (as in messages.jsonl)"
    ),
    "marts.duplicates": "messageIds received more than once, with counts and times",
    "marts.journey_steps": (
        "each step of an automated message sequence (journey) you entered, from the"
        " journey_step_entered events in events.jsonl"
    ),
    "marts.journey_instances": (
        "each journey you were in: where you are in it or how it ended, from the journey_*"
        " events in events.jsonl"
    ),
    "marts.commands": (
        "each of your events that asked for a message to be sent to you or a journey to start"
        " (send_email, send_sms, send_push, send_print, start_journey in events.jsonl)"
    ),
    "marts.audience_members": (
        "each audience you entered, and when you left it (audiencesStatic in profile.json)"
    ),
    "intermediate.int_audience_matches": (
        "the audiences you match now (audiencesStatic in profile.json)"
    ),
}
# What a table of each schema is, for the tables DERIVED does not name (docs/warehouse.md): the
# marts are the documented tables the organisation reads; the others are the pipeline's own.
SCHEMA_ROLES = {
    "marts": "a table the organisation's analysts and systems read, built from the data above",
    "intermediate": "a working step of the models that build the data above",
    "state": "bookkeeping the pipeline keeps to build the data above",
}
# The endpoint families a message can come in through (raw.messages `source`).
SOURCES = {
    "http": "the server API: the organisation's own systems sent it",
    "segment": (
        "the Segment-compatible endpoints: the organisation's servers or apps, through a Segment"
        " or RudderStack library"
    ),
    "tag": "the website tag (analytics.js) on the organisation's website, in your browser",
    "mobile": "the mobile SDK in the organisation's app, on your device",
    "preferences": "the marketing preferences page or API: your own choices",
    "import": "a file the organisation imported",
}
REGULATION_TYPES = {
    "ACCESS": "a copy of your data (this archive)",
    "DELETE": "erasure of your data (needs an active suppression)",
    "SUPPRESS_WITH_DELETE": "erasure of your data, and no new data is collected",
    "SUPPRESS": "no new data is collected; what is held stays",
    "UNSUPPRESS": "ends a suppression",
    "NO_TRACK": "tracking stops: no more track, page and screen events, nor identify from the tag",
    "TRACK": "ends NO_TRACK",
}
# The columns of each table file's CSV twin when it has no rows (else the records' keys).
EMPTY_COLUMNS: dict[str, tuple[str, ...]] = {
    "events": (
        "id",
        "customerId",
        "userId",
        "externalId",
        "email",
        "eventId",
        "eventTime",
        "receivedTime",
        "eventAction",
        "clientId",
        "accountId",
        "brandId",
        "source",
        "rawData",
    ),
    "messages": ("eventId", "receivedAt", "channel", "source", "message"),
    "trait_history": (
        "customerId",
        "traitKey",
        "traitValue",
        "eventTime",
        "receivedAt",
        "messageId",
        "eventId",
    ),
    "identifier_sightings": ("customerId", "type", "id", "firstSeen", "lastSeen"),
    "identifiers": ("customerId", "type", "id", "firstSeen", "lastSeen"),
    "profile": ("customerId", "userId", "traits", "metadata", "identifiers"),
    "preferences": (
        "customerId",
        "subscriptionId",
        "brandId",
        "userId",
        "anonymousId",
        "marketingPreferences",
        "changes",
    ),
    "deliveries": ("customerId",),
    "regulations": (
        "regulationId",
        "regulationType",
        "status",
        "createdAt",
        "startedAt",
        "finishedAt",
        "subjectIds",
    ),
}


def iso(t: datetime | None) -> str | None:
    """A time as the API writes it: ISO-8601 in UTC with `Z`."""
    return t.astimezone(UTC).isoformat().replace("+00:00", "Z") if t else None


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


@dataclass
class Table:
    """One table of the zip: its records, how its JSON lines or array are written, its source."""

    stem: str
    source: str  # the lake table or view its rows come from
    records: list[dict[str, Any]]
    jsonl: bool
    # Each record's line as written (events and messages keep the lake's bytes); else json.dumps.
    lines: list[str] | None = None
    # The records as the CSV twin has them, when not `records` (messages keep the raw text).
    csv_records: list[dict[str, Any]] | None = None

    @property
    def name(self) -> str:
        return f"{self.stem}.jsonl" if self.jsonl else f"{self.stem}.json"

    def data(self) -> bytes:
        if not self.jsonl:
            return (json.dumps(self.records, ensure_ascii=False, indent=2) + "\n").encode()
        lines = self.lines if self.lines is not None else [_json(r) for r in self.records]
        return "".join(f"{line}\n" for line in lines).encode()

    def csv(self) -> bytes:
        return csv_bytes(
            self.csv_records if self.csv_records is not None else self.records,
            EMPTY_COLUMNS.get(self.stem, ()),
        )


def _column(values: list[Any]) -> pl.Series:
    """A CSV column's values and type: nested values as JSON text, a column of mixed types as
    text (JSON text for what is not a string)."""
    values = [_json(v) if isinstance(v, dict | list) else v for v in values]
    kinds = {type(v) for v in values if v is not None}
    if kinds == {bool}:
        return pl.Series(values, dtype=pl.Boolean)
    if kinds == {int}:
        return pl.Series(values, dtype=pl.Int64)
    if kinds and kinds <= {int, float}:
        return pl.Series(values, dtype=pl.Float64)
    if kinds - {str}:
        values = [v if v is None or isinstance(v, str) else _json(v) for v in values]
    return pl.Series(values, dtype=pl.String)


def csv_bytes(records: list[dict[str, Any]], columns: Sequence[str] = ()) -> bytes:
    """The CSV of records (polars): `columns`, then every other key in order of first
    appearance; empty without any column."""
    names = list(dict.fromkeys([*columns, *(k for r in records for k in r)]))
    if not names:
        return b""
    frame = pl.DataFrame({name: _column([r.get(name) for r in records]) for name in names})
    buf = io.BytesIO()
    frame.write_csv(buf)
    return buf.getvalue()


@dataclass
class Lake:
    """Reads of the lake at one snapshot, inside the caller's transaction."""

    conn: duckdb.DuckDBPyConnection
    version: int

    def at(self, relation: str) -> str:
        return f"{relation} AT (VERSION => {int(self.version)})"

    def rows(self, sql: str, params: Mapping[str, object] | Sequence[object] = ()) -> list[Any]:
        """The rows of a query of relations put at the snapshot (`at`); a table or view that
        did not exist at the snapshot holds no rows."""
        return self.records(sql, params)[1]

    def records(
        self, sql: str, params: Mapping[str, object] | Sequence[object] = ()
    ) -> tuple[list[str], list[Any]]:
        """The column names and rows of a query, as `rows`."""
        try:
            cur = self.conn.execute(sql, params)
        except duckdb.CatalogException:
            return [], []
        return [d[0] for d in cur.description or []], cur.fetchall()

    def selected(self, sel: Selection, columns: str, order: str = "") -> list[Any]:
        order_by = f" order by {order}" if order else ""
        return self.rows(
            f"select {columns} from {self.at(sel.relation)} where {sel.where}{order_by}",
            sel.params,
        )

    def count(self, sel: Selection) -> int:
        rows = self.rows(
            f"select count(*) from {self.at(sel.relation)} where {sel.where}", sel.params
        )
        return int(rows[0][0]) if rows else 0

    def view(self, name: str) -> str:
        return self.at(f'lake."marts"."{name}"')


@dataclass
class Facts:
    """What the README says about this subject's data (render_readme)."""

    regulation_id: str
    snapshot_id: int
    created_at: datetime
    user_ids: list[str]
    files: list[tuple[str, int | None, str]]  # name, rows (None: not a table), what it holds
    sources: dict[tuple[str, str], int] = field(default_factory=dict)  # (channel, source) -> n
    event_actions: dict[str, int] = field(default_factory=dict)
    trait_keys: list[str] = field(default_factory=list)
    context_keys: list[str] = field(default_factory=list)
    identifier_counts: dict[str, int] = field(default_factory=dict)  # id type -> n
    deliveries_table: bool = False
    deliveries: int = 0
    delivery_recipients: list[str] = field(default_factory=list)
    audiences: list[str] = field(default_factory=list)
    journey_rows: int = 0
    derived: dict[str, int] = field(default_factory=dict)  # lake table -> the subject's rows
    retention: timedelta = SNAPSHOT_RETENTION


def regulations_json(
    regulations: Sequence[Regulation | Mapping[str, Any]], subject: Subject
) -> list[dict[str, Any]]:
    """The subject's regulations as regulations.json lists them: a regulation of several users
    shows only this subject's userIds (a zip never names another person)."""
    mine = set(subject.user_ids)
    out: list[dict[str, Any]] = []
    for reg in regulations:
        if isinstance(reg, Regulation):

            def ts(t: float | None) -> str | None:
                return iso(datetime.fromtimestamp(t, UTC)) if t is not None else None

            out.append(
                {
                    "regulationId": reg.regulation_id,
                    "regulationType": reg.regulation_type,
                    "status": reg.status,
                    "createdAt": ts(reg.created_at),
                    "startedAt": ts(reg.started_at),
                    "finishedAt": ts(reg.finished_at),
                    "subjectIds": [u for u in reg.subject_ids if u in mine],
                }
            )
        else:
            item = dict(reg)
            ids = item.get("subjectIds")
            if isinstance(ids, list):
                item["subjectIds"] = [u for u in ids if u in mine]
            out.append(item)
    return out


def _snapshot(conn: duckdb.DuckDBPyConnection, snapshot_id: int | None) -> int:
    if snapshot_id is None:
        row = conn.execute("select id from lake.current_snapshot()").fetchone()
        assert row is not None
        return int(row[0])
    found = conn.execute(
        "select snapshot_id from lake.snapshots() where snapshot_id = ?", [snapshot_id]
    ).fetchone()
    if found is None:
        raise ValueError(f"snapshot {snapshot_id} is not in the lake (expired or never made)")
    return int(snapshot_id)


@dataclass
class Export:
    """What the lake holds on the subject at the snapshot."""

    version: int
    tables: list[Table]
    rows_by_table: dict[str, int]
    facts: dict[str, Any]


def _read(conn: duckdb.DuckDBPyConnection, subject: Subject, version: int) -> Export:
    lake = Lake(conn, version)
    sels = {s.name: s for s in selections(conn, subject)}
    rows_by_table: dict[str, int] = {}
    facts: dict[str, Any] = {}

    def sel_rows(table: str, columns: str, order: str = "") -> list[Any]:
        sel = sels.get(table)
        if sel is None:
            return []
        out = lake.selected(sel, columns, order)
        rows_by_table[table] = len(out)
        return out

    # messages.jsonl: each message as received, embedded byte for byte in its line.
    messages = sel_rows(
        "raw.messages",
        "event_id, received_at, channel, source, message",
        "received_at, event_id",
    )
    msg_records, msg_lines, msg_csv = [], [], []
    sources: Counter[tuple[str, str]] = Counter()
    context_keys: set[str] = set()
    for event_id, received_at, channel, source, message in messages:
        head = {
            "eventId": event_id,
            "receivedAt": iso(received_at),
            "channel": channel,
            "source": source,
        }
        parsed = json.loads(message)
        msg_records.append({**head, "message": parsed})
        # The collector stores compact JSON; a line break would end the line early.
        embedded = message if "\n" not in message and "\r" not in message else _json(parsed)
        msg_lines.append(_json(head)[:-1] + ',"message":' + embedded + "}")
        msg_csv.append({**head, "message": message})
        sources[(channel, source)] += 1
        if isinstance(parsed, dict) and isinstance(parsed.get("context"), dict):
            context_keys |= set(parsed["context"])
    facts["sources"] = dict(sources)
    facts["context_keys"] = sorted(context_keys)

    # events.jsonl: marts.events `record`, the event record the API serves, as it is stored.
    events = sel_rows("marts.events", "event_id, record", "event_time, event_id")
    event_records = [json.loads(r[1]) for r in events]
    facts["event_actions"] = dict(Counter(str(r.get("eventAction")) for r in event_records))

    history = sel_rows(
        "intermediate.int_trait_history",
        "customer_id, trait_key, trait_value, event_time, received_at, message_id, event_id",
        "event_time, received_at, message_id, trait_key",
    )
    history_records = [
        {
            "customerId": r[0],
            "traitKey": r[1],
            "traitValue": None if r[2] is None else json.loads(r[2]),
            "eventTime": iso(r[3]),
            "receivedAt": iso(r[4]),
            "messageId": r[5],
            "eventId": r[6],
        }
        for r in history
    ]

    sightings = sel_rows(
        "state.customer_identifier_sightings",
        "customer_id, id_type, id_value, first_seen, last_seen",
        "customer_id, id_type, id_value, first_seen, last_seen",
    )
    sighting_records = [
        {
            "customerId": r[0],
            "type": r[1],
            "id": r[2],
            "firstSeen": iso(r[3]),
            "lastSeen": iso(r[4]),
        }
        for r in sightings
    ]

    # profile.json: each customer's traits and metadata objects and identifiers, as the profile
    # API answers them (the identifiers folded per identifier, as customer_identifiers shows).
    profiles = sel_rows("marts.customer_profiles", "customer_id, user_id, traits", "customer_id")
    customer_ids = [r[0] for r in profiles]
    identifiers = lake.rows(
        "select customer_id, id_type, id_value, first_seen, last_seen"
        f" from {lake.view('customer_identifiers')}"
        " where customer_id in (select unnest($ids)) order by id_type, first_seen, id_value",
        {"ids": customer_ids},
    )
    identifier_records = [
        {
            "customerId": r[0],
            "type": r[1],
            "id": r[2],
            "firstSeen": iso(r[3]),
            "lastSeen": iso(r[4]),
        }
        for r in identifiers
    ]
    profile_records = []
    audiences: set[str] = set()
    trait_keys: set[str] = set()
    for cid, user_id, traits in profiles:
        # One query per customer: a filter on one customer_id reaches both scans behind the view.
        meta = lake.rows(
            f"select metadata from {lake.view('customers')} where customer_id = $cid", {"cid": cid}
        )
        metadata = json.loads(meta[0][0]) if meta else None
        traits_obj = json.loads(traits)
        trait_keys |= set(traits_obj)
        if isinstance(metadata, dict):
            audiences |= {str(a) for a in metadata.get("audiencesStatic") or []}
        profile_records.append(
            {
                "customerId": cid,
                "userId": user_id,
                "traits": traits_obj,
                "metadata": metadata,
                "identifiers": [
                    {k: v for k, v in r.items() if k != "customerId"}
                    for r in identifier_records
                    if r["customerId"] == cid
                ],
            }
        )
    facts["trait_keys"] = sorted(trait_keys)
    facts["audiences"] = sorted(audiences)
    facts["identifier_counts"] = dict(Counter(r["type"] for r in identifier_records))

    prefs = lake.rows(
        "select customer_id, subscription_id, brand_id, user_id, anonymous_id,"
        f" marketing_preferences, state from {lake.view('customer_preferences')}"
        " where customer_id in (select unnest($ids)) order by customer_id",
        {"ids": customer_ids},
    )
    pref_records = [
        {
            "customerId": r[0],
            "subscriptionId": r[1],
            "brandId": r[2],
            "userId": r[3],
            "anonymousId": r[4],
            "marketingPreferences": json.loads(r[5]) if r[5] is not None else None,
            "changes": json.loads(r[6]) if r[6] is not None else [],
        }
        for r in prefs
    ]

    # deliveries.jsonl: the rows of marts.deliveries, once the product delivers messages.
    delivery_records: list[dict[str, Any]] = []
    facts["deliveries_table"] = "marts.deliveries" in sels
    if "marts.deliveries" in sels:
        sel = sels["marts.deliveries"]
        names, rows = lake.records(
            f"select * from {lake.at(sel.relation)} where {sel.where}", sel.params
        )
        for row in rows:
            delivery_records.append({_camel(n): _plain(v) for n, v in zip(names, row, strict=True)})
        rows_by_table["marts.deliveries"] = len(delivery_records)
    facts["delivery_recipients"] = sorted(
        {
            str(r[k])
            for r in delivery_records
            for k in ("provider", "channel", "sendType")
            if r.get(k) is not None
        }
    )

    # The subject's rows of every other table: derived from the exported ones, not files.
    derived = {}
    for name, sel in sels.items():
        if name not in EXPORTED:
            derived[name] = lake.count(sel)
    rows_by_table.update(derived)
    facts["derived"] = derived
    facts["journey_rows"] = sum(n for t, n in derived.items() if "journey" in t)

    tables = [
        Table("profile", "marts.customer_profiles", profile_records, jsonl=False),
        Table(
            "events",
            "marts.events",
            event_records,
            jsonl=True,
            # Stored as compact JSON (to_json), one line each.
            lines=[r[1] if "\n" not in r[1] else _json(json.loads(r[1])) for r in events],
        ),
        Table(
            "messages",
            "raw.messages",
            msg_records,
            jsonl=True,
            lines=msg_lines,
            csv_records=msg_csv,
        ),
        Table("trait_history", "intermediate.int_trait_history", history_records, jsonl=True),
        Table("identifiers", "marts.customer_identifiers", identifier_records, jsonl=False),
        Table(
            "identifier_sightings",
            "state.customer_identifier_sightings",
            sighting_records,
            jsonl=True,
        ),
        Table("preferences", "marts.customer_preferences", pref_records, jsonl=False),
        Table(
            "deliveries",
            "marts.deliveries" if facts["deliveries_table"] else "",
            delivery_records,
            jsonl=True,
        ),
    ]
    return Export(version, tables, dict(sorted(rows_by_table.items())), facts)


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(p[:1].upper() + p[1:] for p in rest)


def _plain(value: Any) -> Any:
    """A lake value as JSON has it: times in ISO-8601 UTC, JSON text parsed."""
    if isinstance(value, datetime):
        return iso(value) if value.tzinfo else value.isoformat()
    if isinstance(value, str) and value[:1] in ("{", "["):
        with contextlib.suppress(ValueError):
            return json.loads(value)
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).hex()
    if isinstance(value, int | float | bool | str | list | dict) or value is None:
        return value
    return str(value)


DESCRIPTIONS = {
    "profile.json": "your customer profile(s): traits, metadata and identifiers",
    "events.jsonl": "every event of yours, as the events API returns it",
    "messages.jsonl": "every message received about you, as received",
    "trait_history.jsonl": "every value each trait of yours was given, and when",
    "identifiers.json": "your userIds, anonymousIds and emails, first and last seen",
    "identifier_sightings.jsonl": "the sightings identifiers.json folds (per pipeline pass)",
    "preferences.json": "your marketing preferences and when you set each",
    "deliveries.jsonl": "messages sent to you (email, SMS, push, print)",
    "regulations.json": "your privacy requests (regulations) and their status",
}


def export_access(
    conn: duckdb.DuckDBPyConnection,
    subject: Subject,
    out: Path,
    *,
    regulation_id: str,
    snapshot_id: int | None = None,
    regulations: Sequence[Regulation | Mapping[str, Any]] = (),
    created_at: datetime | None = None,
) -> dict[str, Any]:
    """Write the subject's Access zip to `out` (temp file, fsync, atomic rename) from the lake
    at `snapshot_id` (default: the current one), and return its manifest. `regulations`: the
    subject's regulations (mallard.regulations.Regulation, or dicts as regulations.json lists
    them); only the subject's own userIds of each are written."""
    created = (created_at or datetime.now(UTC)).astimezone(UTC)
    # One read transaction: the snapshot and every table's rows are read from one catalog state.
    conn.execute("begin transaction")
    try:
        version = _snapshot(conn, snapshot_id)
        export = _read(conn, subject, version)
    finally:
        conn.execute("rollback")

    tables = [*export.tables]
    tables.append(Table("regulations", "", regulations_json(regulations, subject), jsonl=False))
    files: list[tuple[str, bytes, int | None, str | None]] = []
    for t in tables:
        files.append((t.name, t.data(), len(t.records), t.source or None))
    for t in tables:
        files.append((f"{t.stem}.csv", t.csv(), len(t.records), t.source or None))

    f = export.facts
    facts = Facts(
        regulation_id=regulation_id,
        snapshot_id=version,
        created_at=created,
        user_ids=list(subject.user_ids),
        files=[(n, rows, DESCRIPTIONS.get(n, "")) for n, _, rows, _ in files if n.endswith("json")]
        + [(n, rows, DESCRIPTIONS.get(n, "")) for n, _, rows, _ in files if n.endswith("jsonl")],
        sources=f["sources"],
        event_actions=f["event_actions"],
        trait_keys=f["trait_keys"],
        context_keys=f["context_keys"],
        identifier_counts=f["identifier_counts"],
        deliveries_table=f["deliveries_table"],
        deliveries=export.rows_by_table.get("marts.deliveries", 0),
        delivery_recipients=f["delivery_recipients"],
        audiences=f["audiences"],
        journey_rows=f["journey_rows"],
        derived=f["derived"],
    )
    files.append(("README.md", render_readme(facts).encode(), None, None))

    manifest: dict[str, Any] = {
        "regulation_id": regulation_id,
        "snapshot_id": version,
        "created_at": iso(created),
        "subject": {
            "account_id": subject.account_id,
            "user_ids": subject.user_ids,
            "customer_ids": subject.customer_ids,
            "anonymous_ids": subject.anonymous_ids,
            "emails": subject.emails,
        },
        "files": [
            {
                "name": name,
                "sha256": hashlib.sha256(data).hexdigest(),
                "bytes": len(data),
                "rows": rows,
                "table": table,
            }
            for name, data, rows, table in files
        ],
        "rows_by_table": export.rows_by_table,
        "exported_tables": {
            t.source: t.name for t in export.tables if t.source in export.rows_by_table
        },
    }
    payload = (json.dumps(manifest, ensure_ascii=False, indent=2) + "\n").encode()
    write_zip(out, [("manifest.json", payload), *((n, d) for n, d, _, _ in files)], created)
    return manifest


def write_zip(out: Path, entries: list[tuple[str, bytes]], created: datetime) -> None:
    """Write the zip beside `out` (mode 0600), fsync it, rename it over `out`, fsync the dir. A
    temp file an earlier, interrupted export left is removed first."""
    out.parent.mkdir(parents=True, exist_ok=True)
    for stale in out.parent.glob(f"{out.name}.*.tmp"):
        stale.unlink(missing_ok=True)
    tmp = out.with_name(f"{out.name}.{os.getpid()}.tmp")
    stamp = created.timetuple()[:6]
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            with zipfile.ZipFile(f, "w", zipfile.ZIP_DEFLATED) as z:
                for name, data in entries:
                    info = zipfile.ZipInfo(name, date_time=stamp)
                    info.compress_type = zipfile.ZIP_DEFLATED
                    info.external_attr = 0o600 << 16
                    z.writestr(info, data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, out)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    dir_fd = os.open(out.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


# --- the README --------------------------------------------------------------------------------


def _rows(n: int, noun: str = "row") -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _list(items: Sequence[str], empty: str = "none") -> str:
    return ", ".join(f"`{i}`" for i in items) if items else empty


def _duration(d: timedelta) -> str:
    hours = int(d.total_seconds() // 3600)
    if hours and hours % 24 == 0:
        days = hours // 24
        return "one day" if days == 1 else f"{days} days"
    return f"{hours} hours"


def render_readme(f: Facts) -> str:
    """README.md of the zip: what is held on the subject and the answers to GDPR Art. 15(1)
    (a)-(h), from what this export found."""
    users = _list(f.user_ids)
    out: list[str] = []
    w = out.append
    w("# Your personal data: a copy (GDPR Art. 15)\n")
    w(
        f"This archive answers an access request (regulation `{f.regulation_id}`) for userId"
        f" {users}. It was made on {iso(f.created_at)} from snapshot {f.snapshot_id} of the"
        " warehouse of Mallard, the customer data platform the organisation you dealt with runs"
        " on its own servers (that organisation is the controller of your data). Every file was"
        " read from that one snapshot, so they agree with each other.\n"
    )
    w("## The files\n")
    w("| file | rows | what it holds |\n|---|---|---|")
    for name, rows, what in f.files:
        w(f"| `{name}` | {'' if rows is None else rows} | {what} |")
    w(
        "\nEach `.json` file is an array with one object per record; each `.jsonl` file has one"
        " JSON object per line. Every one of them has a CSV twin of the same name (`events.csv`,"
        " ...), one row per record, with nested values as JSON text. `manifest.json` gives each"
        " file's SHA-256, size and row count, so you can check that nothing is missing or"
        " altered.\n"
    )
    if not f.deliveries_table:
        w(
            "`deliveries.jsonl` (and `deliveries.csv`) is empty: this installation does not send"
            " messages yet (it has no deliveries table), so there is nothing to list.\n"
        )
    if f.derived:
        w(
            "The warehouse also keeps your rows in other tables, copies or derivations of the"
            " data above; they are not repeated here, and a deletion removes them too:\n"
        )
        for table, rows in f.derived.items():
            what = DERIVED.get(table) or SCHEMA_ROLES.get(
                table.split(".")[0], "a table of the pipeline"
            )
            w(f"- `{table}`: {_rows(rows)}, {what}")
        w("")

    w("## (a) Purposes of the processing\n")
    w(
        "- To recognise you across visits, devices and channels: your anonymousIds and emails are"
        " linked to your userId (`identifiers.json`).\n"
        "- To keep your customer profile: your current traits and the history of their values"
        " (`profile.json`, `trait_history.jsonl`), which the organisation's systems read through"
        " the profile API.\n"
        "- To keep the history of your interactions (`events.jsonl`, from the messages in"
        " `messages.jsonl`), which the organisation reads through the events API and analyses.\n"
        "- To honour your marketing preferences: which channels you opted into and which topics"
        " you opted out of (`preferences.json`)."
    )
    if f.deliveries_table:
        w("- To send you the messages the organisation asks it to send (`deliveries.jsonl`).")
    w(
        "- To carry out your privacy requests and prove it (`regulations.json`).\n\n"
        "What the organisation uses your profile and events for beyond this (for example"
        " analytics or marketing) is its own decision: ask it.\n"
    )

    w("## (b) Categories of personal data\n")
    ids = ", ".join(f"{n} {t}" for t, n in sorted(f.identifier_counts.items())) or "none"
    w(
        f"- Identifiers ({ids}), the internal customer id and the subscription id of your"
        " marketing preferences: `identifiers.json`, `profile.json`."
    )
    w(
        f"- Profile traits, as the organisation sent them: {_list(f.trait_keys)}:"
        " `profile.json`, `trait_history.jsonl`."
    )
    actions = ", ".join(f"`{a}` ({n})" for a, n in sorted(f.event_actions.items())) or "none"
    w(f"- Events (what you did, when, and their properties): {actions}: `events.jsonl`.")
    w(
        "- Technical data in the messages' context (for example IP address, browser or device,"
        f" page): {_list(f.context_keys)}: `messages.jsonl`."
    )
    w("- Marketing preferences: `preferences.json`.")
    w("- Your privacy requests: `regulations.json`.")
    if f.deliveries_table:
        w("- Messages sent to you: `deliveries.jsonl`.")
    w("")

    w("## (c) Recipients\n")
    w(
        "Mallard itself discloses your data to no one: it runs on the organisation's own"
        " servers, and only the organisation's systems and staff holding its API tokens read it."
        " Mallard transfers nothing to another country or to an international organisation."
    )
    if not f.deliveries_table:
        w(
            "This installation sends no messages (it has no deliveries table yet), so no"
            " delivery provider has received your data.\n"
        )
    elif f.deliveries == 0:
        w("No message has been sent to you, so no delivery provider has received your data.\n")
    else:
        w(
            f"Delivery providers received what they needed (your address and the message) to"
            f" deliver {_rows(f.deliveries, 'message')} to you: {_list(f.delivery_recipients)}."
            " `deliveries.jsonl` lists each delivery.\n"
        )

    w("## (d) Retention period\n")
    w(
        "Your data is kept until it is erased by a `DELETE` or `SUPPRESS_WITH_DELETE` regulation;"
        " it does not expire by itself. A deletion removes it from every table and file of the"
        " data directory (incoming message logs, landing files, warehouse tables, their old"
        " versions and files, caches and earlier copies like this archive) and then checks that"
        " nothing is left.\n\n"
        "The warehouse keeps earlier versions (snapshots) of its tables for"
        f" {_duration(f.retention)}, for time travel and paging: nightly maintenance expires older"
        " snapshots and deletes the files only they used. A changed trait therefore stays"
        " readable in an earlier snapshot for up to that long (and in `trait_history.jsonl` until"
        " a deletion); a deletion does not wait for that: it purges your rows from the old"
        " snapshots too. The download of this archive expires, and a deletion removes it.\n"
    )

    w("## (e) Your rights to rectification, erasure, restriction and objection\n")
    w(
        "Ask the organisation; it files your request as a regulation in Mallard (`POST"
        " .../regulations` with a `regulationType`), or corrects the data:\n"
        "- Rectification: the organisation sends the corrected trait (an identify call); the"
        " newest value wins in your profile (`trait_history.jsonl` keeps the earlier ones until"
        " a deletion).\n"
        f"- Erasure: `DELETE` or `SUPPRESS_WITH_DELETE`: {REGULATION_TYPES['SUPPRESS_WITH_DELETE']}"
        ".\n"
        f"- Restriction of processing: `SUPPRESS`: {REGULATION_TYPES['SUPPRESS']}; `UNSUPPRESS`"
        " ends it.\n"
        f"- Objection: `NO_TRACK`: {REGULATION_TYPES['NO_TRACK']}; `TRACK` ends it. To object to"
        " direct marketing, unsubscribe on the marketing preferences page (or ask the"
        " organisation): channels not listed in `preferences.json` are off, topics not listed"
        " are on, `unsubscribeAll` turns everything off.\n"
        "- Access: `ACCESS`: this archive.\n"
    )

    w("## (f) Right to lodge a complaint\n")
    w(
        "You have the right to lodge a complaint with a supervisory authority (a data protection"
        " authority), in particular in the EU Member State where you live, where you work or"
        " where you think the infringement took place (GDPR Art. 77).\n"
    )

    w("## (g) Source of the data\n")
    if f.sources:
        w("The data comes from the messages about you that Mallard received:")
        for (channel, source), n in sorted(f.sources.items()):
            what = SOURCES.get(source, f"the `{source}` endpoints")
            w(f"- {_rows(n, 'message')} through {what} (channel `{channel}`, source `{source}`)")
        w(
            "\nEvery profile value, identifier and event in this archive is derived from these"
            " messages (`messages.jsonl`, each with its `channel` and `source`).\n"
        )
    else:
        w("Mallard holds no message about you, so it holds no data derived from one.\n")

    w("## (h) Automated decision-making, including profiling\n")
    w(
        "Mallard makes no decision about you based solely on automated processing that has"
        " legal or similarly significant effects (GDPR Art. 22). It combines your messages into"
        " a profile (current traits, first and last event of each kind); that is all the"
        " profiling it does, for the purposes in (a)."
    )
    if f.audiences:
        w(f"You are in these audiences: {_list(f.audiences)} (`audiencesStatic` in profile.json).")
    else:
        w("You are in no audience.")
    if f.journey_rows:
        w(
            f"Automated message sequences (journeys) hold {f.journey_rows} rows of yours: they"
            " choose the next message from your events and traits."
        )
    else:
        w("No automated message sequence (journey) involves you.")
    w("")
    return "\n".join(out)
