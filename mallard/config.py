"""Configuration as code: tenants (and later categories, assets, journeys) from files in git."""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass
from pathlib import Path

from mallard.tenancy import ControlStore, TenancyError

REPO_CONFIG = Path(__file__).resolve().parents[1] / "config"


def config_dir() -> Path:
    """`$MALLARD_CONFIG_DIR`, else `./config` when present, else the repository's `config/`."""
    env = os.environ.get("MALLARD_CONFIG_DIR")
    if env:
        return Path(env).resolve()
    local = Path("config").resolve()
    return local if (local / "tenants.toml").exists() else REPO_CONFIG


@dataclass(frozen=True)
class TenantSpec:
    client_id: str
    account_id: str
    brands: tuple[str, ...]


def load_tenants(path: Path) -> list[TenantSpec]:
    if not path.exists():
        return []
    try:
        doc = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as e:
        raise TenancyError(f"{path}: {e}") from e
    specs = []
    for client_id, client in (doc.get("clients") or {}).items():
        for account_id, account in (client.get("accounts") or {}).items():
            brands = account.get("brands") or []
            if not isinstance(brands, list) or not all(isinstance(b, str) for b in brands):
                raise TenancyError(
                    f"{path}: clients.{client_id}.accounts.{account_id}.brands "
                    "must be a list of strings"
                )
            specs.append(TenantSpec(client_id, account_id, tuple(brands)))
    return specs


def apply_tenants(control: ControlStore, path: Path | None = None) -> list[str]:
    """Add the file's clients, accounts and brands to the store; returns what was added."""
    path = path or config_dir() / "tenants.toml"
    added = []
    for spec in load_tenants(path):
        if control.add_account(spec.client_id, spec.account_id):
            added.append(f"{spec.client_id}/{spec.account_id}")
        for brand in spec.brands:
            if control.add_brand(spec.client_id, spec.account_id, brand):
                added.append(f"{spec.client_id}/{spec.account_id}/{brand}")
    return added
