"""Client envelopes: gzip limits, Basic writeKeys, client dialects, tag settings, CORS paths."""

from __future__ import annotations

import base64
import gzip
import zlib
from types import SimpleNamespace
from typing import Any

import pytest

from collector.clients import adapt, basic_user, inflate
from collector.cors import wants_cors
from collector.tag import source_settings
from mallard.errors import InvalidRequest, PayloadTooLarge
from mallard.settings import Limits

LIMITS = Limits(max_body_bytes=1000)


def test_inflate_passes_plain_bodies_and_gunzips() -> None:
    assert inflate(b"{}", None, LIMITS) == b"{}"
    assert inflate(b"{}", "identity", LIMITS) == b"{}"
    assert inflate(gzip.compress(b'{"a":1}'), "gzip", LIMITS) == b'{"a":1}'
    assert inflate(gzip.compress(b"x" * 1000), "GZIP", LIMITS) == b"x" * 1000


def test_inflate_limits_the_decompressed_size() -> None:
    bomb = gzip.compress(b" " * 10_000_000)
    assert len(bomb) < 20_000
    with pytest.raises(PayloadTooLarge):
        inflate(bomb, "gzip", LIMITS)
    with pytest.raises(PayloadTooLarge):
        inflate(gzip.compress(b"x" * 1001), "gzip", LIMITS)


@pytest.mark.parametrize(
    ("body", "encoding"),
    [
        (b"not gzip", "gzip"),
        # mtime=0: the bytes (and so the test id) are the same in every process, which two
        # pytest-xdist workers require of the tests they collect.
        (gzip.compress(b'{"a":1}', mtime=0)[:-8], "gzip"),  # truncated
        (zlib.compress(b"{}"), "br"),
    ],
    ids=["not-gzip", "truncated-gzip", "zlib-as-br"],
)
def test_inflate_refuses_bad_encodings(body: bytes, encoding: str) -> None:
    with pytest.raises(InvalidRequest):
        inflate(body, encoding, LIMITS)


def _request(authorization: str | None) -> Any:
    headers = {} if authorization is None else {"authorization": authorization}
    return SimpleNamespace(headers=headers)


@pytest.mark.parametrize(
    ("header", "user"),
    [
        ("Basic " + base64.b64encode(b"wk_abc:").decode(), "wk_abc"),
        ("basic " + base64.b64encode(b"wk_abc:secret").decode(), "wk_abc"),
        ("Basic " + base64.b64encode(b"wk_abc").decode(), "wk_abc"),
        ("Basic " + base64.b64encode(b":pw").decode(), None),
        ("Basic !!!", None),
        ("Bearer wk_abc", None),
        (None, None),
    ],
)
def test_basic_user(header: str | None, user: str | None) -> None:
    assert basic_user(_request(header)) == user


def test_adapt_client_dialects() -> None:
    rudder_identify: dict[str, Any] = {"userId": "u", "context": {"traits": {"plan": "pro"}}}
    adapt("identify", rudder_identify)
    assert rudder_identify["traits"] == {"plan": "pro"}
    explicit: dict[str, Any] = {"traits": {"a": 1}, "context": {"traits": {"b": 2}}}
    adapt("identify", explicit)
    assert explicit["traits"] == {"a": 1}
    mobile_track: dict[str, Any] = {"name": "App Opened"}
    adapt("track", mobile_track)
    assert mobile_track["event"] == "App Opened"
    named_track: dict[str, Any] = {"event": "Clicked", "name": "x"}
    adapt("track", named_track)
    assert named_track["event"] == "Clicked"
    screen: dict[str, Any] = {"name": "Home"}
    adapt("screen", screen)
    assert "event" not in screen


def test_source_settings_send_everything_here() -> None:
    s = source_settings("wk_1", "http", "127.0.0.1:8000")
    assert list(s["integrations"]) == ["Segment.io"]
    assert s["integrations"]["Segment.io"]["apiHost"] == "127.0.0.1:8000/cdp/events/std"
    assert s["integrations"]["Segment.io"]["protocol"] == "http"
    assert s["remotePlugins"] == [] and not s["enabledMiddleware"]
    assert s["metrics"]["sampleRate"] == 0  # analytics.js would send them over https
    assert source_settings("wk_1", "https", "e.example")["metrics"]["sampleRate"] > 0


@pytest.mark.parametrize(
    ("path", "cors"),
    [
        ("/cdp/events/std/t", True),
        ("/cdp/events/std/mobile/batch", True),
        ("/cdp/analytics.js/v1/wk/analytics.min.js", True),
        ("/cdp/analytics-next/bundles/x.js", True),
        ("/cdp/v1/projects/wk/settings", True),
        ("/track/c/a/A/v1/events/", False),
        ("/track/c/a/A/v1/track", False),
        ("/v1/batch", False),
    ],
)
def test_cors_only_on_browser_paths(path: str, cors: bool) -> None:
    assert wants_cors(path) is cors
