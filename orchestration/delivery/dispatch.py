"""The dispatcher: after each pass, the commands the pass made are planned, guarded, rendered,
sent through their channel's provider, and each outcome recorded as an event.

Steps of `dispatch(paths)`:
1. Plan: the rows of `lake.marts.commands` whose eventId the outbox has not planned (the cursor
   is the outbox's `planned` table: a command is planned once, in one transaction with its
   sends). Each send is keyed by `send_id(eventId, channel, recipient)`; the guards decide its
   first state: `failed: customer_not_identified`, `skipped: no_address`, `skipped:
   preferences` (marketing only), `skipped: suppressed` (a hard-bounced address). A customer
   suppressed or deleted by a regulation gets no send and no event. The asset is rendered at
   planning with the customer's traits of that moment; the rendered content is the send's
   payload, so a retried send carries the same content.
2. Send: `Outbox.claim()` takes due sends (with a lease); each goes to its provider with the
   send id as Message-ID / Idempotency-Key, then is marked.
3. Record: each final send becomes a track message (`email_sent`, `sms_skipped`, ...) with a
   messageId derived from the send id, so writing it twice stores it once.

Outcome events reach the warehouse the way every collector's messages do: the dispatcher is a
collector of its own (id `dispatch`, log directory `wal/dispatch`). It appends the stamped
messages to a log segment there (framed and fsynced as collector/wal.py writes them), seals it
and rolls it into a landing file with collector/roller.py; the next pass loads it. A crash
before the roll leaves a segment that the next dispatch rolls first (`recover`).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import signal
import time
import tomllib
import urllib.error
import urllib.request
from collections.abc import Mapping
from contextlib import closing
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from html import escape
from pathlib import Path
from typing import Any
from urllib.parse import quote

from collector.messages import Tenant, stamp
from collector.roller import recover, roll_segment
from collector.wal import SEALED_SUFFIX, frame, fsync_dir
from mallard import gc_pause, jsontext
from mallard.commands import SEND_CHANNELS, START_JOURNEY
from mallard.paths import DataPaths
from mallard.served import link_base
from mallard.warehouse import STRINGS, strings
from orchestration.delivery.outbox import FAILED, PENDING, SENT, SKIPPED, Outbox, Send, send_id

log = logging.getLogger(__name__)

DISPATCH_COLLECTOR = "dispatch"
MAX_ATTEMPTS = 5
# Commands planned per warehouse read and outbox transaction.
PLAN_BATCH = 1000
# Journey instances moved per warehouse read and outbox transaction.
JOURNEY_BATCH = 10000
BACKOFF_S = (5.0, 30.0, 120.0, 600.0)
HTTP_TIMEOUT_S = 10.0
SIGNATURE_PURPOSE = "mallard webhook signature v1"


@dataclass
class DispatchResult:
    planned: int = 0
    sent: int = 0
    skipped: int = 0
    failed: int = 0
    retrying: int = 0
    recorded: int = 0
    entered: int = 0  # journey instances started
    moved: int = 0  # journey steps entered
    exited: int = 0  # journey instances ended
    errors: list[str] = field(default_factory=list)

    def summary(self) -> str:
        journeys = (
            f", journeys: {self.entered} entered, {self.moved} steps, {self.exited} exited"
            if self.entered or self.moved or self.exited
            else ""
        )
        return (
            f"{self.planned} commands planned, {self.sent} sent, {self.skipped} skipped,"
            f" {self.failed} failed, {self.retrying} to retry, {self.recorded} outcomes recorded"
            + journeys
        )


class TryAgain(Exception):
    """The provider could not take the send now (4xx of SMTP, 5xx of a webhook, no connection)."""


class Gone(Exception):
    """The provider refused the recipient for good (SMTP 5xx bounce, a push token gone)."""


def outbox_path(paths: DataPaths) -> Path:
    return getattr(paths, "outbox_db", paths.root / "outbox.sqlite")


def public_url(paths: DataPaths) -> str:
    """The base URL links in messages point at (`MALLARD_PUBLIC_URL`, else the address the
    data dir's server listens on: mallard/served.py)."""
    from mallard.settings import get_settings

    return link_base(get_settings(), paths)


# --- outcome events -------------------------------------------------------------------------


class OutcomeLog:
    """Appends stamped messages to the dispatcher's own log directory and lands them."""

    def __init__(self, paths: DataPaths) -> None:
        self.paths = paths
        self.dir = paths.wal_dir / DISPATCH_COLLECTOR
        self.dir.mkdir(parents=True, exist_ok=True)
        self._next_seq = recover(self.dir, paths, DISPATCH_COLLECTOR)

    def write(self, messages: list[dict[str, Any]]) -> None:
        if not messages:
            return
        seq = max(self._next_seq, time.time_ns() // 1_000_000)
        self._next_seq = seq + 1
        sealed = self.dir / f"{seq:016d}{SEALED_SUFFIX}"
        tmp = self.dir / f".{seq:016d}.tmp"
        data = b"".join(frame(jsontext.dumps(m).encode()) for m in messages)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(tmp, sealed)
        fsync_dir(self.dir)
        roll_segment(sealed, self.paths, DISPATCH_COLLECTOR)


def outcome_event(send: Send) -> str:
    """The event a final send records: `<channel>_<status>`, `email_bounced` for a bounce."""
    if send.status == FAILED and send.reason == "bounced":
        return f"{send.channel}_bounced"
    return f"{send.channel}_{send.status}"


def outcome_message(send: Send, received: datetime) -> dict[str, Any]:
    p = send.payload
    event = outcome_event(send)
    props: dict[str, Any] = {
        "sendType": send.channel,
        "assetId": send.asset_id,
        "sendId": send.send_id,
        "commandEventId": send.command_event_id,
    }
    props.update(p.get("journey") or {})  # a journey's send: journeyId, instanceId, stepId
    if send.status in (SKIPPED, FAILED):
        props["reason"] = send.reason
        if send.last_error:
            props["error"] = send.last_error
    msg: dict[str, Any] = {
        "event": event,
        "properties": props,
        "messageId": f"{send.send_id}:{event}",
        "context": {"library": {"name": "mallard-dispatch"}},
    }
    if p.get("userId"):
        msg["userId"] = p["userId"]
    else:
        msg["anonymousId"] = p.get("anonymousId") or send.command_event_id
    tenant = Tenant(p["clientId"], send.account_id, p["brandId"])
    return stamp(
        "track",
        msg,
        tenant,
        channel="server",
        source=DISPATCH_COLLECTOR,
        received=received,
        request_ip=None,
    )


def journey_message(row: tuple[Any, ...], received: datetime) -> dict[str, Any]:
    """A journey event (journeys.unrecorded's row) as a stored track message; its time is the
    journeys' clock's at the transition."""
    from mallard import clock

    key, event, props, at, client_id, account_id, brand_id, user_id, anonymous_id, cmd = row[:10]
    msg: dict[str, Any] = {
        "event": event,
        "properties": jsontext.loads(props),
        "messageId": "journey:" + hashlib.sha256(key.encode()).hexdigest()[:32],
        "timestamp": clock.iso(at),
        "context": {"library": {"name": "mallard-dispatch"}},
    }
    if user_id:
        msg["userId"] = user_id
    else:
        msg["anonymousId"] = anonymous_id or cmd
    return stamp(
        "track",
        msg,
        Tenant(client_id, account_id, brand_id),
        channel="server",
        source=DISPATCH_COLLECTOR,
        received=received,
        request_ip=None,
    )


# --- planning -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Command:
    event_id: str
    message_id: str
    client_id: str
    account_id: str
    brand_id: str
    customer_id: str
    user_id: str | None
    command: str
    asset_id: str | None
    merge_data: dict[str, Any]


_COMMAND_COLUMNS = (
    "event_id, message_id, client_id, account_id, brand_id, customer_id, user_id, command,"
    " asset_id, merge_data"
)


class Lake:
    """The warehouse reads the dispatcher needs, on one read-only connection."""

    def __init__(self, paths: DataPaths) -> None:
        from mallard.warehouse import connect

        self.conn = connect(paths, read_only=True)

    def close(self) -> None:
        self.conn.close()

    def has(self, schema: str, table: str) -> bool:
        return bool(
            self.conn.execute(
                "select count(*) from duckdb_tables() where database_name = 'lake'"
                " and schema_name = ? and table_name = ?",
                [schema, table],
            ).fetchone()[0]  # type: ignore[index]
            or self.conn.execute(
                "select count(*) from duckdb_views() where database_name = 'lake'"
                " and schema_name = ? and view_name = ?",
                [schema, table],
            ).fetchone()[0]  # type: ignore[index]
        )

    def command_ids(self) -> list[str]:
        rows = self.conn.execute("select event_id from lake.marts.commands").fetchall()
        return [r[0] for r in rows]

    def commands(self, event_ids: list[str]) -> list[Command]:
        rows = self.conn.execute(
            f"select {_COMMAND_COLUMNS} from lake.marts.commands"
            f" where event_id in (select unnest({STRINGS})) order by received_at, event_id",
            [strings(event_ids)],
        ).fetchall()
        return [
            Command(*r[:9], jsontext.loads(r[9]) if r[9] else {})  # type: ignore[call-arg]
            for r in rows
        ]

    def facts(self, customer_ids: list[str], push: list[str]) -> Facts:
        """The customers' current traits and subscription ids, their preference states, and
        the device tokens of those in `push`: one query of marts.customer_profiles (the table
        the `customers` and `customer_preferences` views read their `traits` and `state` from;
        at 100k customers the views take 0.5 s a batch of 2,000, assembling metadata the
        dispatcher does not read, the table 0.03 s) and, with `push`, one more."""
        from api.preferences import Change, latest, parse_time

        facts = Facts()
        for cid, traits, sid, state in self.conn.execute(
            "select customer_id, traits, subscription_id, preference_state"
            " from lake.marts.customer_profiles"
            f" where customer_id in (select unnest({STRINGS}))",
            [strings(sorted(set(customer_ids)))],
        ).fetchall():
            facts.customers[cid] = (jsontext.loads(traits) if traits else {}), sid
            if sid is None:  # customer_preferences holds customers with a subscription id
                continue
            changes = [
                Change(
                    s["kind"],
                    s["key"],
                    bool(s["value"]),
                    parse_time(s["eventTime"]),
                    parse_time(s["receivedAt"]),
                    s["messageId"],
                )
                for s in (jsontext.loads(state) if state and state != "[]" else [])
            ]
            facts.preferences[cid] = latest(changes)
        if push:
            for cid, token in self.conn.execute(
                "select distinct customer_id, json_extract_string(context, '$.device.token') as t"
                " from lake.intermediate.int_messages_identified"
                f" where customer_id in (select unnest({STRINGS}))"
                " and json_extract_string(context, '$.device.token') is not null"
                " order by customer_id, t",
                [strings(sorted(set(push)))],
            ).fetchall():
                if token:
                    facts.tokens.setdefault(cid, []).append(token)
        return facts


@dataclass
class Facts:
    """What planning knows of a batch's customers (Lake.facts), by customer id."""

    customers: dict[str, tuple[dict[str, Any], str | None]] = field(default_factory=dict)
    preferences: dict[str, dict[tuple[str, str], bool]] = field(default_factory=dict)
    tokens: dict[str, list[str]] = field(default_factory=dict)


class Regulated:
    """Who a regulation took out: suppressed users and deleted ones (tombstones)."""

    def __init__(self, paths: DataPaths) -> None:
        from mallard.regulations import SUPPRESS, USER, existing_store

        self.store = existing_store(paths)
        if self.store is None:
            self._suppress: dict[str, frozenset[str]] = {}
            self._deleted: set[tuple[str, str]] = set()
            return
        self._suppress = {a: d.get(SUPPRESS, frozenset()) for a, d in self.store.lists().items()}
        self._deleted = {(a, h) for a, kind, h, _ in self.store.tombstones() if kind == USER}
        # Accounts with anyone to exclude: others need no hash (a move asks for every instance).
        self._accounts = {a for a, hashes in self._suppress.items() if hashes} | {
            a for a, _ in self._deleted
        }

    def excludes(self, account_id: str, user_id: str | None) -> bool:
        if self.store is None or user_id is None or account_id not in self._accounts:
            return False
        h = self.store.hash(account_id, user_id)
        return h in self._suppress.get(account_id, frozenset()) or (account_id, h) in self._deleted

    def close(self) -> None:
        if self.store is not None:
            self.store.close()


def _send_row(
    cmd: Command, channel: str, recipient: str, status: str, reason: str | None, **payload: Any
) -> dict[str, Any]:
    base = {
        "clientId": cmd.client_id,
        "brandId": cmd.brand_id,
        "userId": cmd.user_id,
        "anonymousId": cmd.merge_data.get("anonymousId"),
        "customerId": cmd.customer_id,
    }
    return {
        "send_id": send_id(cmd.event_id, channel, recipient),
        "account_id": cmd.account_id,
        "channel": channel,
        "recipient": recipient,
        "asset_id": cmd.asset_id or "",
        "status": status,
        "reason": reason,
        "payload": base | payload,
    }


def plan_command(
    cmd: Command,
    facts: Facts,
    outbox: Outbox,
    regulated: Regulated,
    assets: dict[str, Any],
    base_url: str,
    broken: Mapping[str, Exception] | None = None,
) -> list[dict[str, Any]]:
    """The sends of one command, each in its first state (see the module docstring)."""
    channel = SEND_CHANNELS.get(cmd.command)
    if channel is None:  # start_journey: the journeys' runner takes it
        return []
    if regulated.excludes(cmd.account_id, cmd.user_id):
        return []
    if cmd.user_id is None:
        return [_send_row(cmd, channel, "", FAILED, "customer_not_identified")]
    asset = assets.get(cmd.asset_id or "")
    if asset is None and (error := (broken or {}).get(cmd.asset_id or "")) is not None:
        return [_send_row(cmd, channel, "", FAILED, "invalid_asset", error=str(error)[:500])]
    if asset is None:
        return [_send_row(cmd, channel, "", FAILED, "unknown_asset")]
    traits, subscription_id = facts.customers.get(cmd.customer_id, ({}, None))
    recipients: list[str]
    if channel == "email":
        recipients = [traits["email"]] if isinstance(traits.get("email"), str) else []
    elif channel == "sms":
        recipients = [traits["phone"]] if isinstance(traits.get("phone"), str) else []
    elif channel == "push":
        disabled = outbox.disabled_tokens(cmd.account_id)
        recipients = [t for t in facts.tokens.get(cmd.customer_id, []) if t not in disabled]
    else:
        address = traits.get("address")
        recipients = [json.dumps(address, sort_keys=True)] if address else []
    if not recipients:
        return [_send_row(cmd, channel, "", SKIPPED, "no_address")]
    if asset.kind == "marketing":
        from api.preferences import allows_marketing

        state = facts.preferences.get(cmd.customer_id, {})
        if not allows_marketing(state, channel, asset.category):
            return [_send_row(cmd, channel, r, SKIPPED, "preferences") for r in recipients]
    merge = dict(cmd.merge_data)
    merge["customer"] = traits | {
        "id": cmd.customer_id,
        "externalId": cmd.user_id,
        "_subscriptionId": subscription_id,
    }
    # The customer's hosted preferences page, unless the command names a page of its own.
    merge.setdefault("preferencesUrl", preferences_url(base_url, subscription_id))
    rows = []
    for r in recipients:
        if channel in ("email", "sms") and outbox.is_suppressed(cmd.account_id, channel, r):
            rows.append(_send_row(cmd, channel, r, SKIPPED, "suppressed"))
            continue
        try:
            content = render_send(asset, merge)
        except Exception as e:  # RenderError names the variable and line
            rows.append(_send_row(cmd, channel, r, FAILED, "render_error", error=str(e)))
            continue
        extra: dict[str, Any] = {"content": content, "subscriptionId": subscription_id}
        if asset.kind == "marketing" and channel == "email":
            extra["marketing"] = True
            with_preferences_link(
                content, preferences_url(base_url, subscription_id, asset.asset_id)
            )
        rows.append(_send_row(cmd, channel, r, PENDING, None, **extra))
    return rows


def preferences_url(base_url: str, subscription_id: str | None, campaign: str | None = None) -> str:
    """The customer's hosted preferences page (api/preferences_routes.py), with the campaign
    that linked to it."""
    from mallard.settings import get_settings

    url = f"{base_url}/content?{get_settings().prefs_query_param}={quote(subscription_id or '')}"
    return f"{url}&utm_campaign={quote(campaign)}" if campaign else url


def with_preferences_link(content: dict[str, Any], url: str) -> None:
    """Marketing mail ends with the link to the customer's preferences page."""
    if content.get("text") is not None:
        content["text"] = f"{content['text'].rstrip()}\n\nManage your preferences: {url}\n"
    html = content.get("html")
    if html:
        link = f'<p><a href="{escape(url)}">Manage your preferences</a></p>'
        at = html.lower().rfind("</body>")
        content["html"] = html[:at] + link + html[at:] if at >= 0 else html + link


def render_send(asset: Any, merge: dict[str, Any]) -> dict[str, Any]:
    from mallard.assets import render

    out = render(asset, merge)
    return {
        "subject": out.subject,
        "text": out.text,
        "html": out.html,
        "sender": getattr(asset, "sender", None),
    }


# --- providers ------------------------------------------------------------------------------


def load_providers(config_dir: Path) -> dict[str, dict[str, Any]]:
    """`config/providers.toml`: `[sms] url = ...`, `[push]`, `[print]`; missing: none."""
    path = config_dir / "providers.toml"
    if not path.exists():
        return {}
    return {k: v for k, v in tomllib.loads(path.read_text()).items() if isinstance(v, dict)}


def webhook_body(send: Send) -> bytes:
    content = send.payload.get("content") or {}
    body: dict[str, Any] = {
        "sendId": send.send_id,
        "channel": send.channel,
        "to": send.recipient if send.channel != "print" else json.loads(send.recipient),
        "assetId": send.asset_id,
        "commandEventId": send.command_event_id,
        "customerId": send.payload.get("customerId"),
        "userId": send.payload.get("userId"),
    }
    if send.channel == "print":
        body["html"] = content.get("html")
    else:
        body["text"] = content.get("text")
        if content.get("subject"):
            body["title"] = content.get("subject")
    return json.dumps(body, separators=(",", ":"), sort_keys=True).encode()


def post_webhook(paths: DataPaths, url: str, send: Send) -> str:
    """POST the send; the answer's text on 2xx. Gone on 410 (a push token gone), TryAgain on
    5xx, 429 or no connection; other 4xx fail the send (ValueError)."""
    from mallard.secret import derived_key

    body = webhook_body(send)
    key = derived_key(paths, SIGNATURE_PURPOSE).encode()
    sig = hmac.new(key, body, hashlib.sha256).hexdigest()
    req = urllib.request.Request(
        url,
        data=body,
        method="POST",
        headers={
            "Content-Type": "application/json",
            "Idempotency-Key": send.send_id,
            "X-Mallard-Signature": f"sha256={sig}",
        },
    )
    try:
        with urllib.request.urlopen(req, timeout=HTTP_TIMEOUT_S) as resp:
            return f"{resp.status} {resp.read(500).decode(errors='replace')}"
    except urllib.error.HTTPError as e:
        text = f"{e.code} {e.read(500).decode(errors='replace')}"
        if e.code == 410:
            raise Gone(text) from e
        if e.code >= 500 or e.code == 429:
            raise TryAgain(text) from e
        raise ValueError(text) from e
    except (urllib.error.URLError, OSError) as e:
        raise TryAgain(str(e)) from e


def write_file_outbox(paths: DataPaths, send: Send) -> str:
    """No provider configured: the send as JSON in `outbox/<channel>/<send_id>.json`."""
    folder = paths.root / "outbox" / send.channel
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / f"{send.send_id}.json"
    tmp = folder / f".{send.send_id}.{os.getpid()}.tmp"
    tmp.write_bytes(webhook_body(send))
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())
    os.rename(tmp, target)
    fsync_dir(folder)
    return f"file {target.name}"


def link_send(send: Send) -> dict[str, Any]:
    """The send's fields that link and unsubscribe tokens carry (email.SEND_FIELDS)."""
    p = send.payload
    return {
        "sendId": send.send_id,
        "assetId": send.asset_id,
        "eventId": send.command_event_id,
        "customerId": p.get("customerId"),
        "clientId": p.get("clientId"),
        "accountId": send.account_id,
        "brandId": p.get("brandId"),
        "userId": p.get("userId"),
        "anonymousId": p.get("anonymousId"),
    }


def smtp_url() -> str:
    from mallard.settings import get_settings

    return get_settings().smtp_url


def send_email_now(
    paths: DataPaths,
    send: Send,
    base_url: str,
    session: Any = None,
    prepared: Any = None,
) -> str:
    """Sends one email: on `session` (a mail.SmtpSession kept across a batch) when given, else
    on a connection of its own; `prepared` is the message `mail.compose` made for it, whose
    links are stored already; without it the message is composed and its links stored here,
    before it is sent."""
    from orchestration.delivery import email as mail

    if prepared is None:
        prepared, links = mail.compose(
            paths,
            base_url,
            link_send(send),
            send.recipient,
            send.payload.get("content") or {},
            bool(send.payload.get("marketing")),
        )
        if links is not None:
            mail.store_links(paths, send.send_id, links)
    try:
        if session is not None:
            return str(session.send(prepared))
        return mail.send_email(smtp_url(), prepared)
    except mail.Bounced as e:
        raise Gone(f"{e.code} {e.message}") from e
    except mail.TryLater as e:
        raise TryAgain(f"{e.code} {e.message}") from e


def deliver(
    paths: DataPaths,
    send: Send,
    providers: dict[str, dict[str, Any]],
    base_url: str,
    session: Any = None,
    prepared: Any = None,
) -> str:
    """Hands one send to its channel's provider; the provider's answer. `session` and
    `prepared`: see send_email_now."""
    if send.channel == "email":
        return send_email_now(paths, send, base_url, session, prepared)
    url = providers.get(send.channel, {}).get("url")
    if url:
        return post_webhook(paths, str(url), send)
    return write_file_outbox(paths, send)


# --- the dispatcher -------------------------------------------------------------------------


@dataclass
class Planning:
    """What planning and moving journeys read once per dispatch: the config's assets and
    journeys (with the errors of those that do not load), the regulations' lists."""

    assets: dict[str, Any]
    broken_assets: dict[str, Exception]
    journeys: dict[str, Any]
    broken_journeys: dict[str, Exception]
    regulated: Regulated
    url: str

    @classmethod
    def load(cls, paths: DataPaths, url: str) -> Planning:
        from mallard.assets import load_assets_and_errors
        from mallard.config import config_dir
        from mallard.journeys import load_journeys_and_errors

        assets, broken_assets = load_assets_and_errors(config_dir())
        for asset_id, asset_error in broken_assets.items():
            log.error("asset %s does not load; its sends fail: %s", asset_id, asset_error)
        journeys, broken_journeys = load_journeys_and_errors(config_dir())
        for journey_id, journey_error in broken_journeys.items():
            log.error("journey %s does not load; its customers wait: %s", journey_id, journey_error)
        return cls(
            dict(assets),
            dict(broken_assets),
            dict(journeys),
            dict(broken_journeys),
            Regulated(paths),
            url,
        )

    def close(self) -> None:
        self.regulated.close()

    def plan_send_rows(self, cmd: Command, facts: Facts, outbox: Outbox) -> list[dict[str, Any]]:
        """A command's sends in their first states (plan_command with this planning's data)."""
        return plan_command(
            cmd, facts, outbox, self.regulated, self.assets, self.url, self.broken_assets
        )

    def mover(self, conn: Any, outbox: Outbox, facts: Facts, seen: Any) -> Any:
        from mallard import clock
        from orchestration.delivery.journeys import Mover

        return Mover(
            conn,
            outbox,
            self.journeys,
            self.assets,
            partial(self.plan_send_rows, outbox=outbox),
            facts,
            seen,
            self.regulated,
            clock.now(),
        )


def plan(paths: DataPaths, outbox: Outbox, result: DispatchResult, planning: Planning) -> None:
    """Plans the commands no dispatcher planned yet, PLAN_BATCH at a time: a send command's
    sends, a start_journey's entry (orchestration/delivery/journeys.py), each batch in one
    outbox transaction with the commands' marks."""
    from orchestration.delivery.journeys import Seen

    lake = Lake(paths)
    try:
        if not lake.has("marts", "commands"):
            return
        ids = lake.command_ids()
        done = outbox.planned_among(ids)
        new = [i for i in ids if i not in done]
        for i in range(0, len(new), PLAN_BATCH):
            commands = lake.commands(new[i : i + PLAN_BATCH])
            facts = lake.facts(
                [c.customer_id for c in commands],
                [c.customer_id for c in commands if c.command == "send_push"],
            )
            planned = [
                (
                    c.event_id,
                    plan_command(
                        c,
                        facts,
                        outbox,
                        planning.regulated,
                        planning.assets,
                        planning.url,
                        planning.broken_assets,
                    ),
                )
                for c in commands
            ]
            starts = [c for c in commands if c.command == START_JOURNEY]

            def enter(conn: Any, starts: list[Command] = starts, facts: Facts = facts) -> None:
                if starts:
                    mover = planning.mover(conn, outbox, facts, Seen())
                    for c in starts:  # entering twice enters once (instance ids)
                        mover.enter(c)
                    mover.flush()
                    result.entered += mover.entered

            outbox.plan_many(planned, also=enter)
            result.planned += len(planned)
    finally:
        lake.close()


def advance(paths: DataPaths, outbox: Outbox, result: DispatchResult, planning: Planning) -> None:
    """Moves the journeys' instances that may move now (journeys.to_move). With at least
    `journey_split_at` of them (settings) on a machine of several cores, a second process
    (orchestration/delivery/advance_helper.py) moves every second one while this one moves
    the others: each works out a batch's moves outside the outbox's write lock and writes the
    batch in one transaction, as one process does, so a crash of either leaves whole batches
    moved and the rest due, as a crash of one dispatcher does (two dispatchers may always run
    at once). The helper's failure is an error of the result; its instances stay due."""
    from mallard import clock
    from mallard.settings import get_settings
    from orchestration.delivery import journeys as jr

    now = clock.now()
    ids: list[str] = outbox.read(
        lambda conn: jr.to_move(conn, now, planning.journeys, list(planning.broken_journeys))
    )
    if not ids:
        return
    split_at = get_settings().journey_split_at
    helper = None
    if 0 < split_at <= len(ids) and len(ids) > 1 and (os.cpu_count() or 1) > 1:
        from orchestration.delivery import advance_helper

        helper = advance_helper.start(paths, planning.url, ids[1::2])
        ids = ids[0::2]
    try:
        move_instances(paths, outbox, result, planning, ids)
    finally:
        if helper is not None:
            advance_helper.join(helper, result)


def move_instances(
    paths: DataPaths, outbox: Outbox, result: DispatchResult, planning: Planning, ids: list[str]
) -> None:
    """Moves the instances `ids` (those still active), JOURNEY_BATCH at a time, each batch in
    one outbox transaction after reading its customers' facts and events from the warehouse.
    Fault points (MALLARD_FAULT_KILL_AT, see _fault), per batch: `journey_before_move` (read
    and moved in memory, nothing written), `journey_in_move` (moved, not committed),
    `journey_after_move` (committed, its events and sends not recorded or sent)."""
    from orchestration.delivery import journeys as jr

    push = {
        j for j, journey in planning.journeys.items() if jr.sends_push(journey, planning.assets)
    }
    watch = {j for j, journey in planning.journeys.items() if jr.watches_events(journey)}
    with closing(Lake(paths)) as lake, gc_pause.paused():
        for i in range(0, len(ids), JOURNEY_BATCH):
            chunk = ids[i : i + JOURNEY_BATCH]
            # The moves are worked out on the instances as read now, outside the write lock (a
            # second process moves its own meanwhile), and written if no instance changed
            # since: else the batch is read and moved again inside the transaction.
            instances = outbox.read(partial(jr.load, ids=chunk))
            states = {inst.instance_id: jr.state(inst) for inst in instances}
            facts = lake.facts(
                [inst.customer_id for inst in instances],
                [inst.customer_id for inst in instances if inst.journey_id in push],
            )
            watching = [inst for inst in instances if inst.journey_id in watch]
            seen = jr.read_seen(
                lake,
                [inst.customer_id for inst in watching],
                min((min(w.started_real, w.step_entered_real) for w in watching), default=0.0),
            )
            mover = planning.mover(None, outbox, facts, seen)
            for inst in instances:
                mover.move(inst)
            _fault("journey_before_move")
            with outbox.transaction() as conn:
                if jr.states(conn, list(states)) != states:
                    mover = planning.mover(conn, outbox, facts, seen)
                    for inst in jr.load(conn, chunk):
                        mover.move(inst)
                mover.conn = conn
                mover.flush()
                _fault("journey_in_move")
            _fault("journey_after_move")
            result.moved += mover.moved
            result.exited += mover.exited


def _fault(step: str) -> None:
    """With MALLARD_FAULT_KILL_AT naming the step, the dispatcher kills itself here (SIGKILL),
    as a crash would: `dispatch_after_send` is after the provider's answer, before the mark."""
    from mallard.settings import get_settings

    if get_settings().fault_kill_at == step:
        os.kill(os.getpid(), signal.SIGKILL)


def send_due(paths: DataPaths, outbox: Outbox, result: DispatchResult, base_url: str) -> None:
    """Claims due sends, 100 at a time, and hands each to its provider.

    The emails of a claimed batch are composed first and their links stored in one
    transaction (before any of them is sent), and they go out on one SMTP connection kept for
    the whole call. Each send is marked only after its provider answered;
    the `sent` marks are written together, when 50 wait or the oldest waits 0.5 s, before any
    other mark and at the end of each batch: a crash between an answer and its mark leaves
    those few sends `sending`, and their lease makes the next claim re-send each once, with
    the same Message-ID, as it does for one."""
    from mallard.config import config_dir
    from orchestration.delivery import email as mail

    providers = load_providers(config_dir())
    session = mail.SmtpSession(smtp_url())
    sent: list[tuple[str, str, str | None, str | None, str | None]] = []
    oldest = 0.0

    def flush() -> None:
        if sent:
            outbox.mark_many(sent)
            sent.clear()

    try:
        while sends := outbox.claim(limit=100):
            prepared: dict[str, Any] = {}
            links: dict[str, list[str]] = {}
            for s in sends:
                if s.channel != "email":
                    continue
                email, urls = mail.compose(
                    paths,
                    base_url,
                    link_send(s),
                    s.recipient,
                    s.payload.get("content") or {},
                    bool(s.payload.get("marketing")),
                )
                prepared[s.send_id] = email
                if urls is not None:
                    links[s.send_id] = urls
            mail.store_links_many(paths, links)
            for s in sends:
                if sent and (len(sent) >= 50 or time.monotonic() - oldest >= 0.5):
                    flush()
                try:
                    answer = deliver(
                        paths, s, providers, base_url, session, prepared.get(s.send_id)
                    )
                except TryAgain as e:
                    flush()
                    if s.attempts >= MAX_ATTEMPTS:
                        outbox.mark(s.send_id, FAILED, reason="provider_unavailable", error=str(e))
                    else:
                        delay = BACKOFF_S[min(s.attempts - 1, len(BACKOFF_S) - 1)]
                        outbox.retry_later(s.send_id, str(e), delay)
                        result.retrying += 1
                except Gone as e:
                    flush()
                    if s.channel == "push":
                        outbox.disable_token(s.account_id, s.recipient)
                        outbox.mark(s.send_id, FAILED, reason="token_disabled", error=str(e))
                    else:
                        outbox.suppress(s.account_id, s.channel, s.recipient, "bounced")
                        outbox.mark(s.send_id, FAILED, reason="bounced", error=str(e))
                except Exception as e:  # a refused request, a broken payload: not retried
                    flush()
                    log.exception("send %s failed", s.send_id)
                    outbox.mark(s.send_id, FAILED, reason="provider_error", error=str(e)[:500])
                else:
                    _fault("dispatch_after_send")
                    if not sent:
                        oldest = time.monotonic()
                    sent.append((s.send_id, SENT, None, str(answer)[:500], None))
            flush()
    finally:
        flush()
        session.close()


def record(paths: DataPaths, outbox: Outbox, result: DispatchResult, journeys: bool = True) -> None:
    """Writes the final sends' outcome events and (with `journeys`) the journeys' events
    through the dispatcher's log, then marks them recorded (a crash between the two records
    them again under the same messageIds: stored once)."""
    from orchestration.delivery import journeys as jr

    sends = outbox.unrecorded()
    journey_events = outbox.read(jr.unrecorded) if journeys else []
    if not sends and not journey_events:
        return
    outcomes = OutcomeLog(paths)
    now = datetime.now(UTC)
    outcomes.write([outcome_message(s, now) for s in sends])
    outbox.mark_recorded([s.send_id for s in sends])
    # The journeys' events a segment at a time (jr.unrecorded's limit each): a move of 100k
    # customers makes 300k of them.
    with gc_pause.paused():
        while journey_events:
            outcomes.write([journey_message(row, now) for row in journey_events])
            with outbox.transaction() as conn:
                jr.mark_recorded(conn, journey_events)
            journey_events = outbox.read(jr.unrecorded)
    result.recorded += len(sends)
    for s in sends:
        if s.status == SENT:
            result.sent += 1
        elif s.status == SKIPPED:
            result.skipped += 1
        else:
            result.failed += 1


def dispatch(paths: DataPaths) -> DispatchResult:
    """Plan new commands, move the journeys, send what is due, record every outcome (module
    docstring)."""
    result = DispatchResult()
    base_url = public_url(paths)
    outbox = Outbox(outbox_path(paths))
    planning = Planning.load(paths, base_url)
    try:
        plan(paths, outbox, result, planning)
        advance(paths, outbox, result, planning)
        # The guards' outcomes first (they need no provider), then the sends; the journeys'
        # events after them (a move of 100k customers makes 300k, seconds of writing).
        record(paths, outbox, result, journeys=False)
        send_due(paths, outbox, result, base_url)
        record(paths, outbox, result)
    finally:
        planning.close()
        outbox.close()
    return result


def next_due(paths: DataPaths) -> float | None:
    """When the dispatcher next has something to do without a pass (a journey's wait or
    timeout, a send's retry), by the journeys' clock for the first and real time for the
    second, as seconds from now; None when nothing waits."""
    from mallard import clock
    from orchestration.delivery import journeys as jr

    if not outbox_path(paths).exists():
        return None
    outbox = Outbox(outbox_path(paths))
    try:
        waits = [
            d - now
            for d, now in (
                (outbox.read(jr.due_at), clock.now()),
                (outbox.next_attempt_at(), time.time()),
            )
            if d is not None
        ]
    finally:
        outbox.close()
    return min(waits) if waits else None
