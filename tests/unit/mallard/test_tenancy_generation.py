"""The control store's request path and the generation counter (mallard/generation.py).

Lookups are answered from a cached snapshot with no system call while the mapped counter
`control.generation` is unchanged; every change made through a ControlStore, in any process,
moves it. These tests keep the once-a-second `pragma data_version` check out of the way
(RECHECK_S raised), so only the counter can reveal another process's revocation: with its check
dropped they fail.
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from mallard.tenancy import ControlStore, Scope

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture
def store(tmp_path: Path) -> ControlStore:
    s = ControlStore(tmp_path / "control.sqlite")
    s.add_brand("acme", "shop", "SHOP")
    s.RECHECK_S = 3600.0  # only the counter may reveal a change by another process
    return s


def _in_another_process(path: Path, code: str) -> None:
    script = "from pathlib import Path\nfrom mallard.tenancy import ControlStore\n" + (
        f"store = ControlStore(Path({str(path)!r}))\n{code}\n"
    )
    subprocess.run([sys.executable, "-c", script], cwd=REPO, check=True, timeout=60)


def test_a_revocation_by_another_process_is_refused_on_the_next_lookup(
    store: ControlStore,
) -> None:
    token, secret = store.create_token(Scope.parse("client:acme"))
    key = store.create_write_key("acme", "shop", "SHOP")
    for _ in range(3):  # loaded, then answered from the snapshot
        assert store.authenticate(secret) == Scope("client", "acme")
        assert store.resolve_write_key(key) is not None
    cached = store._local.snapshot

    _in_another_process(store.path, f"store.revoke_token({token.token_id!r})")
    assert store.authenticate(secret) is None
    _in_another_process(store.path, f"store.revoke_write_key({key!r})")
    assert store.resolve_write_key(key) is None
    assert store._local.snapshot is not cached


def test_a_token_made_by_another_process_works_on_the_next_lookup(store: ControlStore) -> None:
    assert store.tenant_exists("acme", "shop", "SHOP")
    _in_another_process(store.path, "store.add_brand('acme', 'shop', 'NEW')")
    assert store.tenant_exists("acme", "shop", "NEW")


def test_cached_lookups_make_no_system_call(
    store: ControlStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, secret = store.create_token(Scope.parse("client:acme"))
    assert store.authenticate(secret) is not None

    def refused(*args: object, **kwargs: object) -> None:
        raise AssertionError("a cached lookup made a query or a stat()")

    monkeypatch.setattr(store, "_conn", refused)
    monkeypatch.setattr(os, "stat", refused)
    for _ in range(100):
        assert store.authenticate(secret) == Scope("client", "acme")
        assert store.access(secret, "acme", "shop", "SHOP") == (Scope("client", "acme"), True)


def test_a_commit_that_bypasses_the_store_is_seen_at_the_next_recheck(
    store: ControlStore,
) -> None:
    """A hand-edited database does not move the counter; `pragma data_version`, asked at most
    once a RECHECK_S, still reveals it."""
    token, secret = store.create_token(Scope.parse("client:acme"))
    assert store.authenticate(secret) is not None
    with sqlite3.connect(store.path) as conn:
        conn.execute("update tokens set revoked_at = 1 where token_id = ?", (token.token_id,))
    assert store.authenticate(secret) is not None  # within RECHECK_S: the snapshot
    store._local.recheck_at = 0.0  # as RECHECK_S later
    assert store.authenticate(secret) is None


def test_the_counter_moves_with_every_change(store: ControlStore) -> None:
    from mallard.generation import Generation

    counter = Generation(store.path.with_suffix(".generation"))
    before = counter.read()
    token, _ = store.create_token(Scope.parse("client:acme"))
    store.revoke_token(token.token_id)
    assert counter.read() == before + 2
