"""The control store: clients, accounts, brands, scoped auth tokens and writeKeys (SQLite).

Secrets are shown once at creation and stored only as SHA-256 hashes; a token is a random
256-bit value, so a fast hash is enough (no password stretching needed). A writeKey is not a
secret (it is in every web page's tag snippet, as with Segment): its value is kept too, so the
preferences resource can return the brand's current key; lookups still go by hash.
"""

from __future__ import annotations

import hashlib
import secrets
import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from mallard.generation import Generation

SCHEMA = """
create table if not exists clients (client_id text primary key, created_at real not null);
create table if not exists accounts (
    client_id text not null references clients(client_id),
    account_id text not null,
    created_at real not null,
    primary key (client_id, account_id)
);
create table if not exists brands (
    client_id text not null,
    account_id text not null,
    brand_id text not null,
    created_at real not null,
    primary key (client_id, account_id, brand_id)
);
create table if not exists tokens (
    token_id text primary key,
    secret_hash text not null unique,
    name text not null,
    client_id text not null,
    account_id text,
    brand_id text,
    kind text not null,
    created_at real not null,
    revoked_at real
);
create table if not exists write_keys (
    key_hash text primary key,
    key_prefix text not null,
    client_id text not null,
    account_id text not null,
    brand_id text not null,
    created_at real not null,
    revoked_at real
);
"""

# Scope kinds, widest first.
SCOPE_KINDS = ("client", "account", "brands", "brand")


class TenancyError(ValueError):
    """A tenancy command was given something that does not exist or is malformed."""


@dataclass(frozen=True)
class Scope:
    """What a token may reach.

    kind `client`: every account and brand of the client; `account`: one account, the data of
    the account itself and its default brand; `brands`: one account and all of its brands;
    `brand`: one brand of one account.
    """

    kind: str
    client_id: str
    account_id: str | None = None
    brand_id: str | None = None

    def allows(self, client_id: str, account_id: str, brand_id: str) -> bool:
        if client_id != self.client_id:
            return False
        if self.kind == "client":
            return True
        if account_id != self.account_id:
            return False
        if self.kind == "brands":
            return True
        if self.kind == "account":
            return brand_id == account_id.upper()
        return brand_id == self.brand_id

    def __str__(self) -> str:
        parts = [self.client_id, self.account_id, self.brand_id]
        return f"{self.kind}:" + "/".join(p for p in parts if p)

    @classmethod
    def parse(cls, text: str) -> Scope:
        """`client:demo`, `account:demo/demo`, `brands:demo/demo`, `brand:demo/demo/DEMO`."""
        kind, _, rest = text.partition(":")
        parts = [p for p in rest.split("/") if p]
        need = {"client": 1, "account": 2, "brands": 2, "brand": 3}.get(kind)
        if need is None or len(parts) != need:
            raise TenancyError(
                f"bad scope {text!r}: use client:C, account:C/A, brands:C/A or brand:C/A/B"
            )
        return cls(kind, *parts)  # type: ignore[arg-type]


@dataclass(frozen=True)
class Token:
    token_id: str
    name: str
    scope: Scope
    created_at: float
    revoked_at: float | None


@dataclass(frozen=True)
class Source:
    """Where a writeKey sends data."""

    client_id: str
    account_id: str
    brand_id: str


def _hash(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


@dataclass(frozen=True)
class _Snapshot:
    """What the request path reads on every call, held in memory between changes."""

    tokens: dict[str, Scope]  # secret hash -> scope of a live token
    write_keys: dict[str, Source]  # key hash -> destination of a live writeKey
    accounts: dict[tuple[str, str], tuple[str, ...]]  # (client, account) -> brands

    def has_tenant(self, client_id: str, account_id: str, brand_id: str) -> bool:
        """Section 1: with no brands configured, BRANDID is the accountId in upper case."""
        brands = self.accounts.get((client_id, account_id))
        if brands is None:
            return False
        return brand_id in brands if brands else brand_id == account_id.upper()


class ControlStore:
    """Thread-safe access to the control database; one short transaction per call.

    Lookups on the request path (tokens, writeKeys, tenants) read an in-memory snapshot that
    is reloaded whenever the database changes. Every change made through a ControlStore, in
    any process (the CLI revoking a token), increments the generation counter in
    `control.generation` after its commit; the request path compares the mapped counter with
    the one its snapshot was loaded at, so a revoked token fails on its next request with no
    system call per request (two stat() calls a request cost 4-8% of ingest, bench/results).
    A commit that bypasses this class (a hand-edited database) is still seen by `pragma
    data_version`, asked at most once a RECHECK_S.
    """

    RECHECK_S = 1.0

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._generation = Generation(path.with_suffix(".generation"))
        self._local = threading.local()
        with self._conn() as conn:
            conn.executescript(SCHEMA)
            columns = {r[1] for r in conn.execute("pragma table_info(write_keys)")}
            if "key_value" not in columns:
                # Stores made before values were kept: their keys read as unknown (None).
                conn.execute("alter table write_keys add column key_value text")

    def _conn(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = sqlite3.connect(self.path, timeout=30, isolation_level=None)
            conn.execute("pragma journal_mode=wal")
            conn.execute("pragma synchronous=full")
            self._local.conn = conn
        return conn

    def _write(self, sql: str, params: tuple[object, ...]) -> sqlite3.Cursor:
        cur = self._conn().execute(sql, params)
        # After the commit (autocommit mode): a reader that sees the new value loads the change.
        self._generation.bump()
        return cur

    def _snapshot(self) -> _Snapshot:
        snap: _Snapshot | None = getattr(self._local, "snapshot", None)
        generation = self._generation.read()
        if (
            snap is not None
            and generation == self._local.snapshot_generation
            and time.monotonic() < self._local.recheck_at
        ):
            return snap
        conn = self._conn()
        version = conn.execute("pragma data_version").fetchone()[0]
        self._local.recheck_at = time.monotonic() + self.RECHECK_S
        if (
            snap is not None
            and generation == self._local.snapshot_generation
            and self._local.snapshot_version == version
        ):
            return snap
        tokens = {
            h: Scope(k, c, a, b)
            for h, k, c, a, b in conn.execute(
                "select secret_hash, kind, client_id, account_id, brand_id from tokens"
                " where revoked_at is null"
            )
        }
        keys = {
            h: Source(c, a, b)
            for h, c, a, b in conn.execute(
                "select key_hash, client_id, account_id, brand_id from write_keys"
                " where revoked_at is null"
            )
        }
        accounts: dict[tuple[str, str], tuple[str, ...]] = {
            (c, a): () for c, a in conn.execute("select client_id, account_id from accounts")
        }
        for c, a, b in conn.execute(
            "select client_id, account_id, brand_id from brands order by brand_id"
        ):
            accounts[(c, a)] = (*accounts.get((c, a), ()), b)
        snap = _Snapshot(tokens, keys, accounts)
        # The counter was read before the rows: a change committed meanwhile moves it again
        # and is loaded at the next lookup.
        self._local.snapshot, self._local.snapshot_version = snap, version
        self._local.snapshot_generation = generation
        return snap

    # --- clients, accounts, brands -------------------------------------------------------

    def add_client(self, client_id: str) -> bool:
        _check_id(client_id, "clientId", lower=True)
        cur = self._write("insert or ignore into clients values (?, ?)", (client_id, time.time()))
        return cur.rowcount > 0

    def add_account(self, client_id: str, account_id: str) -> bool:
        _check_id(account_id, "accountId", lower=True)
        self.add_client(client_id)
        cur = self._write(
            "insert or ignore into accounts values (?, ?, ?)", (client_id, account_id, time.time())
        )
        return cur.rowcount > 0

    def add_brand(self, client_id: str, account_id: str, brand_id: str) -> bool:
        _check_id(brand_id, "BRANDID", lower=False)
        self.add_account(client_id, account_id)
        cur = self._write(
            "insert or ignore into brands values (?, ?, ?, ?)",
            (client_id, account_id, brand_id, time.time()),
        )
        return cur.rowcount > 0

    def brands(self, client_id: str, account_id: str) -> list[str]:
        return list(self._snapshot().accounts.get((client_id, account_id), ()))

    def accounts(self) -> list[tuple[str, str, list[str]]]:
        rows = (
            self._conn()
            .execute("select client_id, account_id from accounts order by 1, 2")
            .fetchall()
        )
        return [(c, a, self.brands(c, a)) for c, a in rows]

    def tenant_exists(self, client_id: str, account_id: str, brand_id: str) -> bool:
        """A path's clientId/accountId/BRANDID names a configured brand (section 1 rules)."""
        return self._snapshot().has_tenant(client_id, account_id, brand_id)

    def access(
        self, secret: str, client_id: str, account_id: str, brand_id: str
    ) -> tuple[Scope | None, bool]:
        """For the request path: the token's scope (None if unknown or revoked) and whether
        the path names a configured tenant, from one snapshot."""
        snap = self._snapshot()
        return snap.tokens.get(_hash(secret)), snap.has_tenant(client_id, account_id, brand_id)

    # --- tokens ---------------------------------------------------------------------------

    def create_token(self, scope: Scope, name: str = "") -> tuple[Token, str]:
        """Returns the token and its secret; the secret is not kept and cannot be shown again."""
        self._check_scope(scope)
        token_id = secrets.token_hex(4)
        secret = f"mlt_{token_id}_{secrets.token_urlsafe(32)}"
        now = time.time()
        self._write(
            "insert into tokens values (?, ?, ?, ?, ?, ?, ?, ?, null)",
            (
                token_id,
                _hash(secret),
                name,
                scope.client_id,
                scope.account_id,
                scope.brand_id,
                scope.kind,
                now,
            ),
        )
        return Token(token_id, name, scope, now, None), secret

    def list_tokens(self) -> list[Token]:
        rows = (
            self._conn()
            .execute(
                "select token_id, name, kind, client_id, account_id, brand_id, created_at,"
                " revoked_at from tokens order by created_at"
            )
            .fetchall()
        )
        return [Token(r[0], r[1], Scope(r[2], r[3], r[4], r[5]), r[6], r[7]) for r in rows]

    def revoke_token(self, token_id: str) -> bool:
        cur = self._write(
            "update tokens set revoked_at=? where token_id=? and revoked_at is null",
            (time.time(), token_id),
        )
        return cur.rowcount > 0

    def authenticate(self, secret: str | None) -> Scope | None:
        """The scope of a live token, or None. Checked per request, so revocation is immediate."""
        if not secret:
            return None
        return self._snapshot().tokens.get(_hash(secret))

    # --- writeKeys ------------------------------------------------------------------------

    def create_write_key(self, client_id: str, account_id: str, brand_id: str) -> str:
        if not self.tenant_exists(client_id, account_id, brand_id):
            raise TenancyError(f"unknown brand {client_id}/{account_id}/{brand_id}")
        key = f"wk_{secrets.token_urlsafe(24)}"
        self._write(
            "insert into write_keys (key_hash, key_prefix, client_id, account_id, brand_id,"
            " created_at, key_value) values (?, ?, ?, ?, ?, ?, ?)",
            (_hash(key), key[:11], client_id, account_id, brand_id, time.time(), key),
        )
        return key

    def list_write_keys(self) -> list[dict[str, object]]:
        rows = (
            self._conn()
            .execute(
                "select key_prefix, client_id, account_id, brand_id, created_at, revoked_at"
                " from write_keys order by created_at"
            )
            .fetchall()
        )
        return [
            {
                "prefix": r[0],
                "clientId": r[1],
                "accountId": r[2],
                "brandId": r[3],
                "createdAt": r[4],
                "revoked": r[5] is not None,
            }
            for r in rows
        ]

    def rotate_write_key(self, client_id: str, account_id: str, brand_id: str) -> str:
        """A new writeKey for the brand; every older key of the brand stops working at once."""
        key = self.create_write_key(client_id, account_id, brand_id)
        self._write(
            "update write_keys set revoked_at=? where client_id=? and account_id=? and brand_id=?"
            " and revoked_at is null and key_hash<>?",
            (time.time(), client_id, account_id, brand_id, _hash(key)),
        )
        return key

    def revoke_write_key(self, key_or_prefix: str) -> int:
        cur = self._write(
            "update write_keys set revoked_at=? where revoked_at is null"
            " and (key_hash=? or key_prefix=?)",
            (time.time(), _hash(key_or_prefix), key_or_prefix[:11]),
        )
        return cur.rowcount

    def current_write_key(self, client_id: str, account_id: str, brand_id: str) -> str | None:
        """The brand's newest live writeKey; None if none, or made before values were kept."""
        row = (
            self._conn()
            .execute(
                "select key_value from write_keys where client_id=? and account_id=?"
                " and brand_id=? and revoked_at is null and key_value is not null"
                " order by created_at desc limit 1",
                (client_id, account_id, brand_id),
            )
            .fetchone()
        )
        return str(row[0]) if row else None

    def resolve_write_key(self, key: str | None) -> Source | None:
        if not key:
            return None
        return self._snapshot().write_keys.get(_hash(key))

    def _check_scope(self, scope: Scope) -> None:
        known = {(c, a): b for c, a, b in self.accounts()}
        if scope.kind == "client":
            if not any(c == scope.client_id for c, _ in known):
                raise TenancyError(f"unknown client {scope.client_id}")
            return
        if (scope.client_id, scope.account_id) not in known:
            raise TenancyError(f"unknown account {scope.client_id}/{scope.account_id}")
        if scope.kind == "brand" and not self.tenant_exists(
            scope.client_id, scope.account_id or "", scope.brand_id or ""
        ):
            raise TenancyError(f"unknown brand {scope}")


def _check_id(value: str, what: str, lower: bool) -> None:
    ok = value and value.replace("-", "").replace("_", "").isalnum()
    if not ok or (lower and value != value.lower()):
        case = "lower-case " if lower else ""
        raise TenancyError(f"{what} must be {case}letters, digits, '-' or '_': {value!r}")
