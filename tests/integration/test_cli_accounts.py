"""`mallard accounts list`, `mallard accounts sync` and `mallard writekeys list`, run as the CLI
on a data dir `mallard init` made: what they print is what the control store holds.

No server and no pipeline pass: these commands read and write the control store only.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import init_data_dir, mallard

pytestmark = pytest.mark.integration

TENANTS = """
[clients.demo.accounts.demo]

[clients.acme.accounts.shop]
brands = ["SHOP", "OUTLET"]

[clients.solo.accounts.solo]
"""


def _json(*args: str, data_dir: Path, env: dict[str, str] | None = None) -> Any:
    return json.loads(mallard(*args, "--json", data_dir=data_dir, env=env).stdout)


def test_accounts_sync_adds_the_config_tenants_and_list_shows_them(tmp_path: Path) -> None:
    d = tmp_path / "data"
    init_data_dir(d)
    # `mallard init` applied the repository's config: the demo account, with its default brand.
    assert _json("accounts", "list", data_dir=d) == [
        {"clientId": "demo", "accountId": "demo", "brands": "DEMO (default)"}
    ]
    # Before the sync the store knows no acme/shop/SHOP: no writeKey can be made for it.
    refused = mallard("writekeys", "create", "acme", "shop", "SHOP", data_dir=d, check=False)
    assert refused.returncode == 2 and "unknown brand acme/shop/SHOP" in refused.stderr

    config = tmp_path / "config"
    config.mkdir()
    (config / "tenants.toml").write_text(TENANTS)
    env = {"MALLARD_CONFIG_DIR": str(config)}
    out = mallard("accounts", "sync", data_dir=d, env=env).stdout.strip()
    # The default file is $MALLARD_CONFIG_DIR/tenants.toml; the demo account was there already.
    assert out == (
        f"{config.resolve() / 'tenants.toml'}: added acme/shop, acme/shop/SHOP,"
        " acme/shop/OUTLET, solo/solo"
    )
    assert _json("accounts", "list", data_dir=d) == [
        {"clientId": "acme", "accountId": "shop", "brands": "OUTLET,SHOP"},
        {"clientId": "demo", "accountId": "demo", "brands": "DEMO (default)"},
        {"clientId": "solo", "accountId": "solo", "brands": "SOLO (default)"},
    ]
    table = mallard("accounts", "list", data_dir=d).stdout.splitlines()
    assert table[0].split() == ["clientId", "accountId", "brands"]
    assert [line.rstrip().split(maxsplit=2) for line in table[1:]] == [
        ["acme", "shop", "OUTLET,SHOP"],
        ["demo", "demo", "DEMO (default)"],
        ["solo", "solo", "SOLO (default)"],
    ]
    # Synced tenants are real: their brands take writeKeys now.
    assert mallard("writekeys", "create", "acme", "shop", "SHOP", data_dir=d).stdout.startswith(
        "wk_"
    )

    # A second sync of the same file adds nothing; a brand added to the file is picked up, and
    # a tenant taken out of it stays (sync only adds).
    assert (
        mallard("accounts", "sync", data_dir=d, env=env).stdout.strip().endswith(": nothing to add")
    )
    (config / "tenants.toml").write_text(
        TENANTS.replace('["SHOP", "OUTLET"]', '["SHOP", "OUTLET", "KIDS"]').replace(
            "[clients.solo.accounts.solo]", ""
        )
    )
    out = mallard("accounts", "sync", "--file", str(config / "tenants.toml"), data_dir=d).stdout
    assert out.strip() == f"{config / 'tenants.toml'}: added acme/shop/KIDS"
    listed = {
        (r["clientId"], r["accountId"]): r["brands"] for r in _json("accounts", "list", data_dir=d)
    }
    assert listed == {
        ("acme", "shop"): "KIDS,OUTLET,SHOP",
        ("demo", "demo"): "DEMO (default)",
        ("solo", "solo"): "SOLO (default)",
    }


def test_writekeys_list_shows_each_key_by_prefix_and_which_are_revoked(tmp_path: Path) -> None:
    d = tmp_path / "data"
    creds = init_data_dir(d)
    mallard("accounts", "add", "acme", "shop", "--brand", "SHOP", "--brand", "OUTLET", data_dir=d)
    shop = mallard("writekeys", "create", "acme", "shop", "SHOP", data_dir=d).stdout.strip()
    outlet = mallard("writekeys", "create", "acme", "shop", "OUTLET", data_dir=d).stdout.strip()
    revoked = mallard("writekeys", "revoke", outlet, data_dir=d).stdout.strip()
    assert revoked == "revoked 1 writeKey(s)"
    # Rotating SHOP's key revokes the older one and makes a new live one.
    rotated = mallard("writekeys", "rotate", "acme", "shop", "SHOP", data_dir=d).stdout.strip()

    listed = _json("writekeys", "list", data_dir=d)
    got = [(r["prefix"], r["clientId"], r["accountId"], r["brandId"], r["revoked"]) for r in listed]
    # In the order they were made; the prefix is the key's first 11 characters.
    assert got == [
        (creds["writeKey"][:11], "demo", "demo", "DEMO", False),
        (shop[:11], "acme", "shop", "SHOP", True),
        (outlet[:11], "acme", "shop", "OUTLET", True),
        (rotated[:11], "acme", "shop", "SHOP", False),
    ]
    # The list never shows a secret, in either form.
    table = mallard("writekeys", "list", data_dir=d).stdout
    for key in (creds["writeKey"], shop, outlet, rotated):
        assert key not in table and key not in json.dumps(listed)
    lines = table.splitlines()
    header = ["prefix", "clientId", "accountId", "brandId", "createdAt", "revoked"]
    assert lines[0].split() == header
    rows = [line.split() for line in lines[1:]]
    assert [(r[0], r[3], r[-1]) for r in rows] == [
        (creds["writeKey"][:11], "DEMO", "False"),
        (shop[:11], "SHOP", "True"),
        (outlet[:11], "OUTLET", "True"),
        (rotated[:11], "SHOP", "False"),
    ]
