"""Regulations at the collector: which calls of regulated subjects are dropped before stamping.

The lists (mallard/regulations.py) hold, per account, keyed hashes of the userIds of regulated
subjects and of the anonymousIds tied to them. A call matches a list when the hash of its
userId or of its anonymousId is in it.

- Suppress (`suppress`): every call of the subject is dropped, whatever its type.
- NoTrack (`no_track`): track (except commands), page and screen are dropped; identify is
  dropped from the tag (channel `browser`) and passes through the server API and mobile
  (INTERFACE 2.10: identify via the API still works, identify via the tag does not); every
  other call passes.

The sender still gets 200; a dropped call's eventId is null in the answer. While the lists
cannot be read nothing is admitted: `Unavailable` (503), and nothing is stored.

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
from mallard.regulations import AdmissionLists, Generation, ListsUnavailable, identifier_hash

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


def admits(
    kind: str, msg: dict[str, Any], channel: str, regulated: Regulated, hashes: list[str]
) -> bool:
    """Whether a call of a subject with these identifier hashes is let in."""
    if any(h in regulated.suppress for h in hashes):
        return False
    if not any(h in regulated.no_track for h in hashes):
        return True
    if kind == "track":
        return command_of(msg.get("event")) is not None
    if kind in NO_TRACK_DROPS:
        return False
    if kind == "identify":
        return channel != TAG_CHANNEL
    return True


def admit_regulated(
    snapshot: Snapshot, tenant: Tenant, channel: str, items: list[Item]
) -> list[bool] | None:
    """Per item whether it is let in, or None when all are (the account has no list entry)."""
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

    return [admits(kind, msg, channel, regulated, hashes(msg)) for kind, msg in items]


def admitted(items: list[Item], keep: list[bool] | None) -> list[Item]:
    if keep is None:
        return items
    return [item for item, ok in zip(items, keep, strict=True) if ok]


def answer_ids(keep: list[bool] | None, stored_ids: list[str]) -> list[str | None]:
    """The eventIds of the answer, one per item in order: null where the item was dropped."""
    if keep is None:
        return list(stored_ids)
    ids = iter(stored_ids)
    return [next(ids) if ok else None for ok in keep]


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

    async def admit(self, tenant: Tenant, channel: str, items: list[Item]) -> list[bool] | None:
        """Per item whether it is let in, or None when all are."""
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
