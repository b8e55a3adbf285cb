"""The server secret: made once, kept in the data dir only (mode 0600). Subscription ids are an
HMAC of the customer under it, and regulation lists and tombstones hash identifiers with a key
derived from it."""

from __future__ import annotations

import hashlib
import hmac
import secrets

from mallard.paths import DataPaths


def ensure_secret(paths: DataPaths) -> str:
    """The secret, hex; written atomically on first use."""
    if not paths.secret_file.exists():
        paths.secret_file.parent.mkdir(parents=True, exist_ok=True)
        tmp = paths.secret_file.with_suffix(".tmp")
        tmp.write_text(secrets.token_hex(32))
        tmp.chmod(0o600)
        tmp.rename(paths.secret_file)
    return paths.secret_file.read_text().strip()


def derived_key(paths: DataPaths, purpose: str) -> str:
    """A key for one purpose, hex: HMAC-SHA256(secret, purpose). Knowing it reveals nothing of
    the secret or of the other purposes' keys."""
    secret = bytes.fromhex(ensure_secret(paths))
    return hmac.new(secret, purpose.encode(), hashlib.sha256).hexdigest()
