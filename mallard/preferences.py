"""Marketing preference channels and categories per account and brand, as code
(`config/preferences.toml`)."""

from __future__ import annotations

import logging
import os
import re
import threading
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mallard.config import config_dir

log = logging.getLogger(__name__)

# The channels the interface names, with the label a page shows for each.
CHANNELS = {
    "email": "Email",
    "sms": "SMS",
    "whatsapp": "WhatsApp",
    "facebook": "Facebook",
    "push": "Push notifications",
}


class PreferencesConfigError(ValueError):
    """config/preferences.toml names an unknown channel or is malformed."""


def category_name(display: str) -> str:
    """`Weekly News` -> `weekly_news`: lower case, every run of other characters one `_`."""
    return re.sub(r"[^a-z0-9]+", "_", display.lower()).strip("_")


@dataclass(frozen=True)
class Category:
    name: str  # underscore form: the value the API takes
    display: str


@dataclass(frozen=True)
class Choices:
    """What a brand's customers can choose: channels (opt-in) and categories (opt-out)."""

    channels: tuple[str, ...]
    categories: tuple[Category, ...]

    def category(self, name: str) -> Category | None:
        return next((c for c in self.categories if c.name == name), None)


def _choices(where: str, table: dict[str, Any], inherit: Choices | None) -> Choices:
    channels: tuple[str, ...] = inherit.channels if inherit else tuple(CHANNELS)
    categories: tuple[Category, ...] = inherit.categories if inherit else ()
    if "channels" in table:
        raw = table["channels"]
        if not isinstance(raw, list) or not all(isinstance(c, str) for c in raw):
            raise PreferencesConfigError(f"{where}.channels must be a list of strings")
        unknown = [c for c in raw if c not in CHANNELS]
        if unknown:
            raise PreferencesConfigError(
                f"{where}.channels: unknown {unknown[0]!r}; use {', '.join(CHANNELS)}"
            )
        channels = tuple(dict.fromkeys(raw))
    if "categories" in table:
        raw = table["categories"]
        if not isinstance(raw, list):
            raise PreferencesConfigError(f"{where}.categories must be a list")
        cats: dict[str, Category] = {}
        for item in raw:
            if isinstance(item, str):
                cat = Category(category_name(item), item)
            elif isinstance(item, dict) and isinstance(item.get("display"), str):
                cat = Category(
                    str(item.get("name") or category_name(item["display"])), item["display"]
                )
            else:
                raise PreferencesConfigError(
                    f"{where}.categories: each item is a display name or {{display, name}}"
                )
            if not re.fullmatch(r"[a-z0-9]+(_[a-z0-9]+)*", cat.name):
                raise PreferencesConfigError(f"{where}.categories: bad name {cat.name!r}")
            if cat.name in cats:
                raise PreferencesConfigError(f"{where}.categories: {cat.name!r} twice")
            cats[cat.name] = cat
        categories = tuple(cats.values())
    return Choices(channels, categories)


@dataclass(frozen=True)
class PreferencesConfig:
    defaults: Choices
    accounts: dict[tuple[str, str], Choices]
    brands: dict[tuple[str, str, str], Choices]

    def for_brand(self, client_id: str, account_id: str, brand_id: str) -> Choices:
        return (
            self.brands.get((client_id, account_id, brand_id))
            or self.accounts.get((client_id, account_id))
            or self.defaults
        )


def parse(text: str, where: str = "preferences.toml") -> PreferencesConfig:
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise PreferencesConfigError(f"{where}: {e}") from e
    defaults = _choices(f"{where}: defaults", doc.get("defaults") or {}, None)
    accounts: dict[tuple[str, str], Choices] = {}
    brands: dict[tuple[str, str, str], Choices] = {}
    for client_id, client in (doc.get("clients") or {}).items():
        for account_id, account in (client.get("accounts") or {}).items():
            at = f"{where}: clients.{client_id}.accounts.{account_id}"
            acc = _choices(at, account, defaults)
            accounts[(client_id, account_id)] = acc
            for brand_id, brand in (account.get("brands") or {}).items():
                brands[(client_id, account_id, brand_id)] = _choices(
                    f"{at}.brands.{brand_id}", brand, acc
                )
    return PreferencesConfig(defaults, accounts, brands)


class PreferencesConfigFile:
    """The file, re-read when it changes: config edits apply without a restart."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path or config_dir() / "preferences.toml"
        self._lock = threading.Lock()
        self._sig: tuple[int, int] | None = None
        self._config = parse("")

    def get(self) -> PreferencesConfig:
        try:
            st = os.stat(self.path)
            sig = (st.st_mtime_ns, st.st_size)
        except FileNotFoundError:
            return parse("")
        with self._lock:
            if sig != self._sig:
                try:
                    self._config = parse(self.path.read_text(), str(self.path))
                except PreferencesConfigError:
                    if self._sig is None:
                        raise
                    # A bad edit of a running server's config: keep serving the last good one.
                    log.exception("keeping the previous preferences config")
                self._sig = sig
            return self._config
