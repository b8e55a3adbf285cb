"""Regulations at the collector: which calls of regulated subjects are dropped before stamping.

The lists (mallard/regulations.py) hold, per account, keyed hashes of the userIds of regulated
subjects and of the anonymousIds tied to them. A call matches a list when the hash of its
userId or of its anonymousId is in it.

- Suppress (`suppress`): every call of the subject is dropped, whatever its type.
- NoTrack (`no_track`): track (except commands), page and screen are dropped; identify is
  dropped from the tag (channel `browser`) and passes through the server API and mobile
  (INTERFACE 2.10: identify via the API still works, identify via the tag does not); every
  other call passes.

The sender gets the answer of any accepted call: 200 with an eventId stamped as a stored call's
is, after the same durable write. A dropped call's record in the log (`dropped_record`) holds its
eventId, account, the list that dropped it and the time, nothing of the call itself; the roller
moves it to the regulations store (`dropped_events`), where the status endpoint finds it for a
token holder. So nothing in the answer, its headers or its timing tells a writeKey holder that a
user is regulated. While the lists cannot be read nothing is admitted: `Unavailable` (503), and
nothing is stored.

Cost: an account with no list entry pays one read of the mapped generation counter and one dict
lookup per request; only the calls of an account with entries are hashed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from collector.messages import Tenant
from mallard.commands import command_of
from mallard.errors import Unavailable
from mallard.regulations import (
    NO_TRACK,
    SUPPRESS,
    AdmissionLists,
    Generation,
    ListsUnavailable,
    identifier_hash,
)

log = logging.getLogger(__name__)

Item = tuple[str, dict[str, Any]]

# INTERFACE 4.6: commands (track events of these names, any case) pass NoTrack.
NO_TRACK_DROPS = frozenset({"track", "page", "screen"})
# The channel the tag's calls are stamped with (collector/clients.py).
TAG_CHANNEL = "browser"
UNAVAILABLE = "the regulation lists cannot be read; nothing was accepted, retry later"


@dataclass(frozen=True)
class Regulated:
    """One account's lists: hashes of the suppressed and of the NoTrack identifiers."""

    suppress: frozenset[str]
    no_track: frozenset[str]


@dataclass(frozen=True)
class Snapshot:
    """The lists as of one generation of the counter; `accounts` holds only accounts with
    entries, so the common case is one failed lookup."""

    generation: int
    key: str
    accounts: dict[str, Regulated]


# The identifiers of a call that are matched: userId, anonymousId, and an alias's previousId
# (the identity the alias ties to the userId).
ID_FIELDS = ("userId", "anonymousId", "previousId")


def drop_reason(
    kind: str, msg: dict[str, Any], channel: str, regulated: Regulated, hashes: list[str]
) -> str | None:
    """The list that drops a call of a subject with these identifier hashes, or None."""
    if any(h in regulated.suppress for h in hashes):
        return SUPPRESS
    if not any(h in regulated.no_track for h in hashes):
        return None
    if kind == "track":
        return None if command_of(msg.get("event")) is not None else NO_TRACK
    if kind in NO_TRACK_DROPS:
        return NO_TRACK
    if kind == "identify" and channel == TAG_CHANNEL:
        return NO_TRACK
    return None


Drops = list[str | None] | None


def admit_regulated(snapshot: Snapshot, tenant: Tenant, channel: str, items: list[Item]) -> Drops:
    """Per item the list that drops it (None: let in), or None when all are let in (the account
    has no list entry)."""
    regulated = snapshot.accounts.get(tenant.account_id)
    if regulated is None:
        return None
    key, account = snapshot.key, tenant.account_id
    # The items of a batch mostly share their ids: each is hashed once per request.
    hashed: dict[str, str] = {}

    def hashes(msg: dict[str, Any]) -> list[str]:
        out = []
        for name in ID_FIELDS:
            value = msg.get(name)
            if value is not None:
                text = str(value)
                h = hashed.get(text)
                if h is None:
                    h = hashed[text] = identifier_hash(key, account, text)
                out.append(h)
        return out

    return [drop_reason(kind, msg, channel, regulated, hashes(msg)) for kind, msg in items]


# The first element of a dropped call's record in the log: a stored message is a JSON object,
# this record a JSON array, so the roller and the status endpoint tell them apart by the first
# byte, and a client's keys can never make a message look like one.
DROPPED = "dropped"


def dropped_record(stored: dict[str, Any], reason: str) -> list[str]:
    """The log record of a dropped call: ["dropped", list, accountId, eventId, receivedAt]."""
    return [DROPPED, reason, stored["accountId"], stored["eventId"], stored["receivedAt"]]


def is_dropped_record(raw: bytes) -> bool:
    return raw[:1] == b"["


def records(stamped: list[dict[str, Any]], drops: Drops) -> list[Any]:
    """What goes to the log for these stamped calls: each kept call, each dropped one's record.
    Every call was stamped (its eventId and receivedAt made) the same way whether dropped or
    not, and the answer lists every call's eventId."""
    if drops is None:
        return stamped
    return [
        s if reason is None else dropped_record(s, reason)
        for s, reason in zip(stamped, drops, strict=True)
    ]


# Separators around identifiers inside a metrics string (tags such as "wk:<key>", query strings).
_SEPARATORS = re.compile(r"[\s\"'<>,;:=&?#/|\\()\[\]{}]+")


def _strings(value: Any) -> Iterator[str]:
    """Every string of a JSON value (object keys too), with the tokens between separators."""
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            yield v
            yield from _SEPARATORS.split(v)
        elif isinstance(v, dict):
            stack.extend(v.keys())
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)


def metrics_admitted(snapshot: Snapshot, payload: Any) -> bool:
    """Whether a tag metrics payload is kept: not when any string in it (or a token of one) is
    an identifier on any account's lists. Metrics name no account, so every account with list
    entries is checked; analytics.js sends none of the subject's ids, so this drops only a
    payload that a page or a client put them in."""
    if not snapshot.accounts:
        return True
    candidates = {s for s in _strings(payload) if s}
    for account, regulated in snapshot.accounts.items():
        listed = regulated.suppress | regulated.no_track
        for s in candidates:
            if identifier_hash(snapshot.key, account, s) in listed:
                return False
    return True


class Admission:
    """A collector's lists, reloaded (on a worker thread, one load at a time) when the mapped
    generation counter moved; the check of the counter runs on the event loop."""

    def __init__(self, lists: AdmissionLists) -> None:
        self._lists = lists
        self._generation = Generation(lists.paths.regulations_generation)
        self._snapshot: Snapshot | None = None
        self._loading: asyncio.Task[Snapshot] | None = None

    def _load(self) -> Snapshot:
        lists = self._lists.current()
        accounts = {
            a: Regulated(lists.suppress.get(a, frozenset()), lists.no_track.get(a, frozenset()))
            for a in lists.suppress.keys() | lists.no_track.keys()
        }
        accounts = {a: r for a, r in accounts.items() if r.suppress or r.no_track}
        try:
            key = self._lists.key if accounts else ""
        except (sqlite3.Error, OSError) as e:
            raise ListsUnavailable(f"regulation hash key unreadable: {e}") from e
        return Snapshot(lists.generation, key, accounts)

    async def _reload(self) -> Snapshot:
        try:
            snapshot = await asyncio.to_thread(self._load)
            self._snapshot = snapshot
            return snapshot
        finally:
            self._loading = None

    async def current(self) -> Snapshot:
        """The lists at least as new as the counter when called; Unavailable (503) while they
        cannot be read."""
        while True:
            generation = self._generation.read()
            snapshot = self._snapshot
            if snapshot is not None and snapshot.generation == generation:
                return snapshot
            if self._loading is None:
                self._loading = asyncio.get_running_loop().create_task(self._reload())
                # A load whose waiters were all cancelled must not log an unretrieved error.
                self._loading.add_done_callback(_retrieve)
            try:
                # A load started before this call may have read an older counter: the loop
                # checks the counter again and loads anew until the lists are as new.
                await asyncio.shield(self._loading)
            except ListsUnavailable as e:
                log.warning("admitting nothing: %s", e)
                # Each call loads the lists again; a load retries for LISTS_RETRY_S (1 s).
                raise Unavailable(UNAVAILABLE, headers={"Retry-After": "1"}) from e

    async def admit(self, tenant: Tenant, channel: str, items: list[Item]) -> Drops:
        """Per item the list that drops it (None: let in), or None when all are let in."""
        return admit_regulated(await self.current(), tenant, channel, items)

    async def admits_metrics(self, payload: Any) -> bool:
        """Whether a metrics payload may be stored; not while the lists cannot be read."""
        try:
            snapshot = await self.current()
        except Unavailable:
            return False
        return metrics_admitted(snapshot, payload)


def _retrieve(task: asyncio.Task[Snapshot]) -> None:
    with contextlib.suppress(BaseException):
        task.exception()
