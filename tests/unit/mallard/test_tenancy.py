from __future__ import annotations

import os
from pathlib import Path

import pytest

from mallard.tenancy import ControlStore, Scope, TenancyError


@pytest.fixture
def store(tmp_path: Path) -> ControlStore:
    s = ControlStore(tmp_path / "control.sqlite")
    s.add_brand("acme", "shop", "SHOP")
    s.add_brand("acme", "shop", "OUTLET")
    s.add_account("acme", "acme")  # single-brand account: BRANDID = ACME
    return s


@pytest.mark.parametrize(
    ("scope", "path", "allowed"),
    [
        ("client:acme", ("acme", "shop", "OUTLET"), True),
        ("client:acme", ("other", "shop", "SHOP"), False),
        ("account:acme/shop", ("acme", "shop", "SHOP"), True),
        ("account:acme/shop", ("acme", "shop", "OUTLET"), False),
        ("account:acme/shop", ("acme", "acme", "ACME"), False),
        ("brands:acme/shop", ("acme", "shop", "OUTLET"), True),
        ("brands:acme/shop", ("acme", "acme", "ACME"), False),
        ("brand:acme/shop/OUTLET", ("acme", "shop", "OUTLET"), True),
        ("brand:acme/shop/OUTLET", ("acme", "shop", "SHOP"), False),
    ],
)
def test_scope_allows(scope: str, path: tuple[str, str, str], allowed: bool) -> None:
    assert Scope.parse(scope).allows(*path) is allowed


@pytest.mark.parametrize("bad", ["client:", "account:acme", "brand:acme/shop", "all:acme", "x"])
def test_bad_scope_is_refused(bad: str) -> None:
    with pytest.raises(TenancyError):
        Scope.parse(bad)


def test_tenant_rules_of_section_1(store: ControlStore) -> None:
    assert store.tenant_exists("acme", "shop", "OUTLET")
    assert not store.tenant_exists("acme", "shop", "SHOPX")
    # With brands configured, the default upper-case brand does not exist unless configured.
    assert not store.tenant_exists("acme", "shop", "SHOPPY")
    assert store.tenant_exists("acme", "acme", "ACME")
    assert not store.tenant_exists("acme", "acme", "acme")
    assert not store.tenant_exists("nobody", "nobody", "NOBODY")


def test_ids_must_be_lower_case(store: ControlStore) -> None:
    with pytest.raises(TenancyError):
        store.add_account("Acme", "acme")
    with pytest.raises(TenancyError):
        store.add_account("acme", "Shop")


def test_token_lifecycle(store: ControlStore) -> None:
    token, secret = store.create_token(Scope.parse("brand:acme/shop/SHOP"), name="ci")
    assert store.authenticate(secret) == Scope("brand", "acme", "shop", "SHOP")
    assert store.authenticate(secret + "x") is None
    assert store.authenticate(None) is None
    listed = store.list_tokens()
    assert [t.token_id for t in listed] == [token.token_id]
    assert secret not in repr(listed)
    assert store.revoke_token(token.token_id)
    assert store.authenticate(secret) is None
    assert not store.revoke_token(token.token_id)


def test_changes_by_another_connection_apply_at_once(store: ControlStore) -> None:
    """The request path reads a cached snapshot; another process's commit must invalidate it."""
    other = ControlStore(store.path)  # stands in for the CLI in another process
    token, secret = other.create_token(Scope.parse("client:acme"))
    assert store.authenticate(secret) == Scope("client", "acme")  # now cached
    key = other.create_write_key("acme", "shop", "SHOP")
    assert store.resolve_write_key(key) is not None
    other.add_brand("acme", "acme", "NEW")
    assert store.tenant_exists("acme", "acme", "NEW")
    assert not store.tenant_exists("acme", "acme", "ACME")  # brands configured now
    other.revoke_token(token.token_id)
    other.revoke_write_key(key)
    assert store.authenticate(secret) is None
    assert store.resolve_write_key(key) is None


def _idle(store: ControlStore, seconds: float = 10.0) -> None:
    """The control database's files as after `seconds` without a write (their mtimes moved back):
    the request path no longer looks at them (it reads the mapped generation counter), so an
    idle spell must change nothing."""
    for p in (store.path, store.path.with_name(store.path.name + "-wal")):
        if p.exists():
            st = os.stat(p)
            os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns - int(seconds * 1e9)))


def test_revocations_after_an_idle_spell_apply_at_once(store: ControlStore) -> None:
    """The cached path: the store answers from its snapshot without SQLite; another process's
    revocation moves the control store's generation counter, and a lookup after the files look
    idle again sees it."""
    other = ControlStore(store.path)  # stands in for the CLI in another process
    token, secret = other.create_token(Scope.parse("client:acme"))
    key = other.create_write_key("acme", "shop", "SHOP")
    _idle(store)
    assert store.authenticate(secret) == Scope("client", "acme")
    assert store.resolve_write_key(key) is not None
    cached = store._local.snapshot
    assert store.authenticate(secret) is not None
    assert store._local.snapshot is cached  # answered from the snapshot alone

    # Revoked while the server idles; its next request comes seconds later.
    other.revoke_token(token.token_id)
    other.revoke_write_key(key)
    _idle(store)
    assert store.authenticate(secret) is None
    assert store.resolve_write_key(key) is None


def test_secrets_are_stored_hashed(store: ControlStore, tmp_path: Path) -> None:
    _, secret = store.create_token(Scope.parse("client:acme"))
    raw = (tmp_path / "control.sqlite").read_bytes()
    wal = tmp_path / "control.sqlite-wal"
    raw += wal.read_bytes() if wal.exists() else b""
    assert secret.encode() not in raw
    # A writeKey is a public identifier (in every page's tag snippet), kept so the preferences
    # resource can return it; its lookups still go by hash.
    key = store.create_write_key("acme", "shop", "SHOP")
    assert store.current_write_key("acme", "shop", "SHOP") == key


def test_token_for_unknown_tenant_is_refused(store: ControlStore) -> None:
    with pytest.raises(TenancyError):
        store.create_token(Scope.parse("brand:acme/shop/NOPE"))
    with pytest.raises(TenancyError):
        store.create_token(Scope.parse("client:nobody"))


def test_write_keys_resolve_to_their_brand(store: ControlStore) -> None:
    key = store.create_write_key("acme", "shop", "OUTLET")
    src = store.resolve_write_key(key)
    assert src is not None and (src.client_id, src.account_id, src.brand_id) == (
        "acme",
        "shop",
        "OUTLET",
    )
    assert store.resolve_write_key("wk_nope") is None


def test_write_key_rotation_stops_older_keys(store: ControlStore) -> None:
    old = store.create_write_key("acme", "shop", "SHOP")
    other_brand = store.create_write_key("acme", "shop", "OUTLET")
    new = store.rotate_write_key("acme", "shop", "SHOP")
    assert store.resolve_write_key(old) is None
    assert store.resolve_write_key(new) is not None
    assert store.resolve_write_key(other_brand) is not None
    listed = store.list_write_keys()
    assert all(new not in str(row) for row in listed)
    assert store.revoke_write_key(new[:11]) == 1
    assert store.resolve_write_key(new) is None


def test_tenants_file_is_applied_additively(tmp_path: Path) -> None:
    from mallard.config import apply_tenants

    f = tmp_path / "tenants.toml"
    f.write_text(
        '[clients.acme.accounts.shop]\nbrands = ["SHOP", "OUTLET"]\n[clients.solo.accounts.solo]\n'
    )
    store = ControlStore(tmp_path / "c.sqlite")
    assert apply_tenants(store, f) == [
        "acme/shop",
        "acme/shop/SHOP",
        "acme/shop/OUTLET",
        "solo/solo",
    ]
    assert apply_tenants(store, f) == []
    assert store.tenant_exists("solo", "solo", "SOLO")
    assert store.tenant_exists("acme", "shop", "OUTLET")
    f.write_text("[clients.acme.accounts.shop]\nbrands = 3\n")
    with pytest.raises(TenancyError):
        apply_tenants(store, f)


def test_current_write_key_is_the_newest_live_key(store: ControlStore) -> None:
    assert store.current_write_key("acme", "shop", "SHOP") is None
    old = store.create_write_key("acme", "shop", "SHOP")
    assert store.current_write_key("acme", "shop", "SHOP") == old
    new = store.rotate_write_key("acme", "shop", "SHOP")
    assert store.current_write_key("acme", "shop", "SHOP") == new
    assert store.resolve_write_key(new) is not None
    store.revoke_write_key(new)
    assert store.current_write_key("acme", "shop", "SHOP") is None


def test_stores_made_before_key_values_were_kept_still_open(tmp_path: Path) -> None:
    import sqlite3

    path = tmp_path / "old.sqlite"
    conn = sqlite3.connect(path)
    conn.executescript(
        "create table write_keys (key_hash text primary key, key_prefix text not null,"
        " client_id text not null, account_id text not null, brand_id text not null,"
        " created_at real not null, revoked_at real);"
        "insert into write_keys values ('h', 'wk_old', 'acme', 'shop', 'SHOP', 1.0, null);"
    )
    conn.commit()
    conn.close()
    store = ControlStore(path)
    assert store.current_write_key("acme", "shop", "SHOP") is None
    store.add_account("acme", "shop")
    key = store.create_write_key("acme", "shop", "SHOP")
    assert store.current_write_key("acme", "shop", "SHOP") == key
