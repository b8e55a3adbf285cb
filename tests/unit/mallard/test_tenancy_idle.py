"""A revocation by another process is seen by a control store idle for more than 2 s.

The request path's lookups are cached and trusted while the control store's generation counter
is unchanged (ControlStore._snapshot; before, while the database's files kept their stat
signature and were older than 2 s); the files are made to look idle here instead of sleeping.
tests/reliability/test_isolation.py and tests/integration/test_revocation.py check revocation on
a running server.
"""

from __future__ import annotations

import os
from pathlib import Path


def test_control_store_sees_a_revocation_after_idle(tmp_path: Path) -> None:
    """The same in-process, with the database's files made to look old (no sleep): a commit by
    another connection that leaves the files' size and mtime unchanged is still seen."""
    from mallard.tenancy import ControlStore, Scope

    db = tmp_path / "control.db"
    store = ControlStore(db)
    store.add_account("demo", "demo")
    tok, secret = store.create_token(Scope("client", "demo"))
    assert store.authenticate(secret) is not None
    other = ControlStore(db)  # as the CLI in another process

    def idle() -> None:  # the files' timestamps as after more than 2 s without a commit
        for p in (db, db.with_name("control.db-wal")):
            if p.exists():
                os.utime(p, ns=(1_000_000_000, 1_000_000_000))

    idle()
    assert store.authenticate(secret) is not None  # cached, files look old and unchanged
    assert store.authenticate(secret) is not None
    assert other.revoke_token(tok.token_id)
    idle()
    assert store.authenticate(secret) is None
