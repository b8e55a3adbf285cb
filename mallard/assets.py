"""Campaign assets as code: `<config dir>/assets/<assetId>/asset.toml` plus templates.

asset.toml:
    channel = "email"            # email | sms | push | print
    kind = "marketing"           # marketing | transactional
    category = "Weekly News"     # marketing only: a category of preferences.toml
    subject = "Hi ${customer.firstName!"there"}"   # email (a template too); push: the title
    from = "News <news@example.com>"               # email

Templates per channel: email `body.html.ftl` and `body.txt.ftl`; sms and push `body.txt.ftl`;
print `body.html.ftl`. They are the FreeMarker subset of mallard/templates.py; `.html.ftl`
output is HTML-escaped.
"""

from __future__ import annotations

import os
import re
import threading
import tomllib
from dataclasses import dataclass
from functools import cached_property
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

from mallard.preferences import PreferencesConfigError, category_name
from mallard.preferences import parse as parse_preferences
from mallard.templates import RenderError, compile_template

__all__ = [
    "CHANNELS",
    "KINDS",
    "TEMPLATES",
    "Asset",
    "AssetError",
    "Rendered",
    "RenderError",
    "asset_channels",
    "load_assets",
    "load_assets_and_errors",
    "render",
]

CHANNELS = ("email", "sms", "push", "print")
KINDS = ("marketing", "transactional")
TEMPLATES: dict[str, tuple[str, ...]] = {
    "email": ("body.html.ftl", "body.txt.ftl"),
    "sms": ("body.txt.ftl",),
    "push": ("body.txt.ftl",),
    "print": ("body.html.ftl",),
}
ASSET_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")


class AssetError(Exception):
    """An asset that does not load: a bad asset.toml or a missing template."""

    def __init__(self, asset_id: str, message: str) -> None:
        self.asset_id = asset_id
        self.message = message
        super().__init__(f"asset {asset_id!r}: {message}")


@dataclass(frozen=True)
class Asset:
    asset_id: str
    channel: str
    kind: str
    category: str | None  # the category's name (underscore form, as the preferences API)
    subject: str | None
    sender: str | None
    templates: dict[str, str]  # file name -> source


@dataclass(frozen=True)
class Rendered:
    subject: str | None
    text: str | None
    html: str | None

    @cached_property
    def links(self) -> list[str]:
        """Every href of the HTML's <a> and <area> tags, in order (parsed when asked: a send
        takes its links from the HTML at send time, and parsing is most of a render's cost)."""
        return links_of(self.html) if self.html is not None else []


def assets_dir(config_dir: Path) -> Path:
    return config_dir / "assets"


def _categories(config_dir: Path) -> dict[str, str]:
    """Every category of preferences.toml (any account or brand): display and name -> name."""
    path = config_dir / "preferences.toml"
    if not path.exists():
        return {}
    try:
        prefs = parse_preferences(path.read_text(), str(path))
    except PreferencesConfigError:
        return {}
    out: dict[str, str] = {}
    for choices in [prefs.defaults, *prefs.accounts.values(), *prefs.brands.values()]:
        for cat in choices.categories:
            out[cat.name] = cat.name
            out[cat.display] = cat.name
    return out


def _read_toml(asset_id: str, directory: Path) -> dict[str, Any]:
    path = directory / "asset.toml"
    try:
        return tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise AssetError(asset_id, "asset.toml is missing") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise AssetError(asset_id, f"asset.toml: {e}") from None


def _optional_str(asset_id: str, doc: dict[str, Any], key: str) -> str | None:
    value = doc.get(key)
    if value is not None and (not isinstance(value, str) or not value.strip()):
        raise AssetError(asset_id, f"asset.toml: {key} must be a non-empty string")
    return value


def load_asset(asset_id: str, directory: Path, categories: dict[str, str]) -> Asset:
    if not ASSET_ID.match(asset_id):
        raise AssetError(asset_id, "an asset id is letters, digits, '_', '-' and '.'")
    doc = _read_toml(asset_id, directory)
    channel, kind = doc.get("channel"), doc.get("kind")
    if channel not in CHANNELS:
        raise AssetError(asset_id, f"asset.toml: channel must be one of {', '.join(CHANNELS)}")
    if kind not in KINDS:
        raise AssetError(asset_id, f"asset.toml: kind must be one of {', '.join(KINDS)}")
    unknown = sorted(set(doc) - {"channel", "kind", "category", "subject", "from"})
    if unknown:
        raise AssetError(asset_id, f"asset.toml: unknown keys {', '.join(unknown)}")
    category = _optional_str(asset_id, doc, "category")
    if kind == "marketing":
        if category is None:
            raise AssetError(asset_id, "asset.toml: a marketing asset needs a category")
        if category not in categories:
            known = ", ".join(sorted({c for c in categories if c != category_name(c)})) or "none"
            raise AssetError(
                asset_id,
                f"asset.toml: category {category!r} is not in preferences.toml (known: {known})",
            )
        category = categories[category]
    elif category is not None:
        category = categories.get(category, category_name(category))
    subject = _optional_str(asset_id, doc, "subject")
    sender = _optional_str(asset_id, doc, "from")
    if channel == "email":
        if subject is None:
            raise AssetError(asset_id, "asset.toml: an email needs a subject")
        if sender is None:
            raise AssetError(asset_id, "asset.toml: an email needs from")
    templates: dict[str, str] = {}
    for name in TEMPLATES[channel]:
        try:
            templates[name] = (directory / name).read_text()
        except FileNotFoundError:
            raise AssetError(asset_id, f"{name} is missing (a {channel} asset needs it)") from None
        except UnicodeDecodeError as e:
            raise AssetError(asset_id, f"{name} is not UTF-8: {e}") from None
    return Asset(asset_id, channel, kind, category, subject, sender, templates)


def _signature(config_dir: Path) -> tuple[Any, ...]:
    """What load_assets depends on: every file's path, mtime and size."""
    root = assets_dir(config_dir)
    sig: list[Any] = []
    for base in (config_dir / "preferences.toml", root):
        try:
            st = os.stat(base)
            sig.append((str(base), st.st_mtime_ns, st.st_size))
        except FileNotFoundError:
            sig.append((str(base), None))
    if root.is_dir():
        for d in sorted(root.iterdir()):
            if d.is_dir():
                for f in sorted(d.iterdir()):
                    st = f.stat()
                    sig.append((str(f), st.st_mtime_ns, st.st_size))
    return tuple(sig)


_cache_lock = threading.Lock()
_cache: dict[Path, tuple[tuple[Any, ...], dict[str, Asset], dict[str, AssetError]]] = {}


def load_assets(config_dir: Path) -> dict[str, Asset]:
    """Every asset of the config dir by id; AssetError for the first that does not load."""
    assets, broken = load_assets_and_errors(config_dir)
    if broken:
        raise next(iter(broken.values()))
    return assets


def load_assets_and_errors(config_dir: Path) -> tuple[dict[str, Asset], dict[str, AssetError]]:
    """The assets that load by id, and the error of each that does not: one broken asset
    fails its own sends, not every other asset's.

    Cached until a file under assets/ (or preferences.toml) changes."""
    config_dir = Path(config_dir).resolve()
    sig = _signature(config_dir)
    with _cache_lock:
        hit = _cache.get(config_dir)
        if hit is not None and hit[0] == sig:
            return dict(hit[1]), dict(hit[2])
    root = assets_dir(config_dir)
    categories = _categories(config_dir)
    assets: dict[str, Asset] = {}
    broken: dict[str, AssetError] = {}
    if root.is_dir():
        for d in sorted(root.iterdir()):
            if d.is_dir() and not d.name.startswith("."):
                try:
                    assets[d.name] = load_asset(d.name, d, categories)
                except AssetError as e:
                    broken[d.name] = e
    with _cache_lock:
        _cache[config_dir] = (sig, assets, broken)
    return dict(assets), dict(broken)


def asset_channels(config_dir: Path) -> dict[str, str | None]:
    """Each asset directory's id -> its channel (None when its asset.toml does not give a
    valid one): only the asset.toml files are read, the collector's view of the assets."""
    root = assets_dir(config_dir)
    out: dict[str, str | None] = {}
    if not root.is_dir():
        return out
    for d in sorted(root.iterdir()):
        if not d.is_dir() or d.name.startswith("."):
            continue
        try:
            channel = _read_toml(d.name, d).get("channel")
        except AssetError:
            channel = None
        out[d.name] = channel if channel in CHANNELS else None
    return out


class _Links(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.links: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in ("a", "area"):
            for name, value in attrs:
                if name == "href" and value is not None:
                    self.links.append(value)


def links_of(html: str) -> list[str]:
    """Every href of the HTML's links (<a>, <area>), in order, entities decoded."""
    parser = _Links()
    parser.feed(html)
    parser.close()
    return parser.links


def render(asset: Asset, data: dict[str, Any]) -> Rendered:
    """The asset's subject and bodies merged with data; RenderError (variable, line, template)
    when a template does not parse or a value is missing."""
    prefix = asset.asset_id + "/"
    subject = None
    if asset.subject is not None:
        subject = compile_template(asset.subject, prefix + "subject", False).render(data)
        subject = " ".join(subject.split())
    text = html = None
    if "body.txt.ftl" in asset.templates:
        name = prefix + "body.txt.ftl"
        text = compile_template(asset.templates["body.txt.ftl"], name, False).render(data)
    if "body.html.ftl" in asset.templates:
        name = prefix + "body.html.ftl"
        html = compile_template(asset.templates["body.html.ftl"], name, True).render(data)
    return Rendered(subject, text, html)


# The merge data `mallard assets check` renders with when an asset has no sample.json; the
# dispatcher's data has this shape: the command's root keys plus `customer` and
# `preferencesUrl`.
SAMPLE_DATA: dict[str, Any] = {
    "userId": "sample-user",
    "preferencesUrl": "http://127.0.0.1:8000/content?s=sub_sample",
    "customer": {
        "id": "sample-user",
        "externalId": "sample-user",
        "_subscriptionId": "sub_sample",
        "firstName": "Sam",
        "lastName": "Sample",
        "email": "sam@example.com",
        "phone": "+15555550100",
    },
}


@dataclass(frozen=True)
class CheckResult:
    asset_id: str
    ok: bool
    line: str  # what `mallard assets check` prints for the asset


def check_assets(config_dir: Path) -> list[CheckResult]:
    """Load and render every asset with its sample.json (else SAMPLE_DATA), each on its own."""
    import json

    root = assets_dir(config_dir)
    categories = _categories(config_dir)
    out: list[CheckResult] = []
    dirs = sorted(d for d in root.iterdir() if d.is_dir()) if root.is_dir() else []
    for d in dirs:
        if d.name.startswith("."):
            continue
        try:
            asset = load_asset(d.name, d, categories)
            data = dict(SAMPLE_DATA)
            sample = d / "sample.json"
            if sample.exists():
                try:
                    loaded = json.loads(sample.read_text())
                except ValueError as e:
                    raise AssetError(d.name, f"sample.json: {e}") from None
                if not isinstance(loaded, dict):
                    raise AssetError(d.name, "sample.json must be a JSON object")
                data.update(loaded)
            rendered = render(asset, data)
        except (AssetError, RenderError) as e:
            out.append(CheckResult(d.name, False, f"FAIL {d.name}: {e}"))
            continue
        what = f"{asset.channel} {asset.kind}" + (f" ({asset.category})" if asset.category else "")
        sizes = ", ".join(
            f"{name} {len(body)} chars"
            for name, body in (("text", rendered.text), ("html", rendered.html))
            if body is not None
        )
        subject = f", subject {rendered.subject!r}" if rendered.subject is not None else ""
        links = f", {len(rendered.links)} links" if rendered.html is not None else ""
        out.append(CheckResult(d.name, True, f"ok   {d.name}: {what}{subject}, {sizes}{links}"))
    return out
