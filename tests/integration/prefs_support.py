"""A module-scoped server with preference choices configured and customers in the warehouse."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from tests.conftest import REPO, Server, free_port, init_data_dir, wait_landed

PREFERENCES_TOML = """
[defaults]
channels = ["email", "sms", "whatsapp", "facebook", "push"]

[clients.demo.accounts.demo]
channels = ["email", "sms", "push"]
categories = ["Weekly News", "Product Updates", { display = "Offers & Deals", name = "offers" }]
"""


@dataclass
class PrefsEnv:
    server: Server
    config_dir: Path
    sids: dict[str, str]  # userId -> _subscriptionId
    customer_ids: dict[str, str]

    def url(self, user: str) -> str:
        return f"{self.server.url}/cdp/marketing-preferences/{self.sids[user]}"

    def get(self, user: str) -> httpx.Response:
        return httpx.get(self.url(user), timeout=30)

    def post(self, user: str, body: Any, asset_id: str | None = None) -> httpx.Response:
        params = {"assetId": asset_id} if asset_id else None
        return httpx.post(self.url(user), json=body, params=params, timeout=30)

    def identify(self, user: str, traits: dict[str, Any], **extra: Any) -> str:
        r = self.server.post(
            "identify", {"userId": user, "event": "identify", "traits": traits, **extra}
        )
        assert r.status_code == 200, r.text
        return str(r.json()["eventId"])


def prefs_config(root: Path) -> Path:
    """root/config: the repo's tenants and assets, and the preference choices above."""
    config = root / "config"
    config.mkdir()
    shutil.copy(REPO / "config" / "tenants.toml", config / "tenants.toml")
    shutil.copytree(REPO / "config" / "assets", config / "assets")
    (config / "preferences.toml").write_text(PREFERENCES_TOML)
    return config


def start_prefs_env(
    root: Path,
    users: dict[str, dict[str, Any]],
    env: dict[str, str] | None = None,
    port: int | None = None,
    extra_config: dict[str, str] | None = None,
) -> Iterator[PrefsEnv]:
    """Start a server whose config has categories (and `extra_config`: files by their path in
    the config dir, written before the server starts), identify `users` (userId -> traits), run
    the pipeline once, and read each customer's `_subscriptionId` from the profile API."""
    config = prefs_config(root)
    for name, text in (extra_config or {}).items():
        (config / name).parent.mkdir(parents=True, exist_ok=True)
        (config / name).write_text(text)
    data = root / "data"
    creds = init_data_dir(data)
    server = Server(
        data,
        port or free_port(),
        creds,
        env={"MALLARD_ROLL_INTERVAL_S": "0.3", "MALLARD_CONFIG_DIR": str(config), **(env or {})},
    )
    server.start()
    try:
        prefs = PrefsEnv(server, config, {}, {})
        ids = [prefs.identify(u, traits) for u, traits in users.items()]
        wait_landed(data, ids)
        server.pipeline()
        for user in users:
            meta = server.get(f"profiles/userId:{user}/meta")
            assert meta.status_code == 200, meta.text
            prefs.sids[user] = meta.json()["_subscriptionId"]
            prefs.customer_ids[user] = meta.json()["id"]
        yield prefs
    finally:
        server.stop()
