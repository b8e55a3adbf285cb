"""The vendored analytics.js is patched (scripts/patch_analytics.py) and Mallard's settings aim
every configurable request at Mallard: the hosts left in the files are only ones the tag never
asks when Mallard serves it (the browser tests, test_tag_offline.py, prove the paths)."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from types import ModuleType

import pytest

from collector.tag import STATIC_DIR, source_settings

REPO = Path(__file__).resolve().parents[3]
# Case-sensitive: "Segment.io" is the name of analytics.js's own destination, not a host.
HOST = re.compile(
    r"(?:https?:)?//([a-z0-9-]+(?:\.[a-z0-9-]+)+)"
    r"|[\"'`]([a-z0-9-]+(?:\.[a-z0-9-]+)*\.(?:io|com|net|org|build|dev|app))[/\"'`]"
)
# Every host named in the vendored files, and why the tag served by Mallard never asks it.
ALLOWED = {
    "standalone.js": {
        # The default apiHost of the Segment.io destination and of metrics: Mallard's settings
        # set both; metrics without settings are off (patch).
        "api.segment.io",
        # The CDN when neither `analytics._cdn` nor the script's own /analytics.js/v1/ src
        # names it (patch: an http src counts too), and the CSP fallback that fires only once
        # a request to it was blocked.
        "cdn.segment.com",
        "cdn.segment",  # remote plugins' URLs are rewritten to the CDN; Mallard lists none
        "segment.com",  # the text of a console warning
    },
    # Legacy video plugins: off in Mallard's settings (legacyVideoPluginsEnabled).
    "407.bundle.61efa1acb302134c434b.js": {"api.vimeo.com", "www.googleapis.com"},
    "auto-track.bundle.f131ce01a05e3a33a8c1.js": {"www.w3.org"},  # the xlink XML namespace
}


def patcher() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "patch_analytics", REPO / "scripts" / "patch_analytics.py"
    )
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_checked_in_tag_is_what_the_patches_make() -> None:
    p = patcher()
    for name in {patch.file for patch in p.PATCHES}:
        text = (STATIC_DIR / name).read_text()
        # Patching again changes nothing: every patch is there, once.
        assert p.patch_text(name, text) == text
        for patch in (x for x in p.PATCHES if x.file == name):
            assert text.count(patch.after) == 1, patch.why
    assert (STATIC_DIR / p.POLYFILL).is_file()


def test_a_build_without_the_pieces_stops_the_vendoring() -> None:
    p = patcher()
    text = (STATIC_DIR / "standalone.js").read_text()
    first = p.PATCHES[0]
    # Another build where the piece is not found (nor already patched): an error, no file.
    with pytest.raises(p.PatchError, match="cannot apply patch"):
        p.patch_text("standalone.js", text.replace(first.after, "/* changed */"))
    # The unpatched upstream piece is patched.
    upstream = text.replace(first.after, first.before)
    assert p.patch_text("standalone.js", upstream) == text


def test_only_the_explained_hosts_are_in_the_vendored_files() -> None:
    found = {}
    for path in sorted(STATIC_DIR.glob("*.js")):
        hosts = {m.group(1) or m.group(2) for m in HOST.finditer(path.read_text())}
        if hosts:
            found[path.name] = hosts
    assert found == ALLOWED


def test_the_settings_keep_every_configurable_request_on_mallard() -> None:
    host = "127.0.0.1:8123"
    for protocol in ("http", "https"):
        s = source_settings("wk", protocol, host)
        assert list(s["integrations"]) == ["Segment.io"]
        seg = s["integrations"]["Segment.io"]
        assert seg["apiHost"] == f"{host}/cdp/events/std" and seg["protocol"] == protocol
        assert seg["unbundledIntegrations"] == []  # no classic destinations from a CDN
        assert s["metrics"]["host"] == seg["apiHost"]
        assert s["remotePlugins"] == [] and s["legacyVideoPluginsEnabled"] is False
        assert s["middlewareSettings"] == {} and s["enabledMiddleware"] == {}
    assert source_settings("wk", "http", host)["metrics"]["sampleRate"] == 0
