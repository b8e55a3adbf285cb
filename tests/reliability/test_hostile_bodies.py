"""Hostile bodies at every route that parses JSON: hand-made cases per route, then
hypothesis-generated ones. No 5xx, every error JSON with a message, what was accepted lands, the
server answers /health throughout and its memory stays bounded."""

from __future__ import annotations

import json
import os
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import wait_landed
from tests.reliability.conftest import FIGURES, Probe
from tests.reliability.hostile import BODIES, FRAGMENTS, ROUTES, Route, basic, many_keys

pytestmark = [pytest.mark.reliability, pytest.mark.integration]

# How far the server's RSS may rise over a scenario's start: a 1 MB body parsed into Python
# objects is tens of MiB; a bomb inflated or a context copied per item would be hundreds.
RSS_RISE_MIB = 160
# Hypothesis examples for the generated bodies (make soak raises it).
EXAMPLES = int(os.environ.get("MALLARD_RELIABILITY_EXAMPLES", "150"))


def headers(probe: Probe, route: Route) -> dict[str, str]:
    if route.auth == "token":
        return dict(probe.server.headers)
    if route.auth == "writeKey":
        return basic(probe.write_key)
    return {"content-type": "application/json"}


def url(probe: Probe, route: Route) -> str:
    return route.path.replace("{base}", probe.server.base_path)


def event_ids(response: Any) -> list[str]:
    body = response.json()
    ids = body.get("eventIds") or [body.get("eventId")]
    return [i for i in ids if i]


def landed(probe: Probe, ids: list[str]) -> None:
    FIGURES.accepted += len(ids)
    wait_landed(probe.server.data_dir, ids)
    FIGURES.landed += len(ids)


def send(probe: Probe, route: Route, body: bytes, scenario: str) -> Any:
    return probe.send(
        "POST", url(probe, route), scenario, content=body, headers=headers(probe, route)
    )


@pytest.mark.parametrize("route", ROUTES, ids=[r.name for r in ROUTES])
def test_hostile_fragments(probe: Probe, route: Route) -> None:
    """Each fragment inside each route's body: 200, 400 or 413; never 5xx; accepted ones land."""
    probe.rss.mark()
    accepted: list[str] = []
    outcomes = {}
    for name, fragment in FRAGMENTS.items():
        r = send(probe, route, route.wrap(fragment), "fragments")
        outcomes[name] = r.status_code
        assert r.status_code in (200, 400, 413), f"{name}: {r.status_code} {r.text[:200]}"
        if r.status_code == 200 and route.ingests:
            accepted += event_ids(r)
    probe.healthy()
    if route.name != "tag metrics":  # metrics always answer 200 (they are dropped, not refused)
        assert outcomes["deep arrays 10,000"] == 400, outcomes
        assert outcomes["invalid UTF-8 in a string"] == 400, outcomes
        assert outcomes["float 1e400"] == 400, outcomes
    if route.ingests:
        assert outcomes["NUL escaped"] == 200, outcomes
        assert outcomes["duplicate keys"] == 200, outcomes
        landed(probe, accepted)
    assert probe.peak("fragments") - probe.rss.start_mib < RSS_RISE_MIB


@pytest.mark.parametrize("route", ROUTES, ids=[r.name for r in ROUTES])
def test_hostile_whole_bodies(probe: Probe, route: Route) -> None:
    for name, body in BODIES.items():
        r = send(probe, route, body, "whole bodies")
        if route.name == "tag metrics":
            assert r.status_code == 200, f"{name}: {r.text[:200]}"
        else:
            assert r.status_code == 400, f"{name}: {r.status_code} {r.text[:200]}"
    probe.healthy()


def test_tag_metrics_drop_bad_bodies_and_answer_200(probe: Probe) -> None:
    """The documented leniency of the tag's metrics route (the fuzz test's LENIENT): each hostile
    body is answered 200 {"success": true} and stored nowhere; a valid one is stored."""
    (route,) = [r for r in ROUTES if r.name == "tag metrics"]
    log_dir = probe.server.data_dir / "metrics"

    def stored() -> str:
        return "".join(p.read_text() for p in sorted(log_dir.glob("*.jsonl")))

    before = stored()
    for name, body in BODIES.items():
        r = send(probe, route, body, "whole bodies")
        assert r.status_code == 200 and r.json() == {"success": True}, f"{name}: {r.text[:200]}"
    assert stored() == before
    marker = "lenient-metrics-check"
    good = {"metrics": {"series": [{"type": "Counter", "metric": marker, "value": 1}]}}
    r = send(probe, route, json.dumps(good).encode(), "whole bodies")
    assert r.status_code == 200 and r.json() == {"success": True}, r.text
    assert marker in stored()[len(before) :]


def test_preferences_update_hostile(probe: Probe) -> None:
    """The preferences update parses its body after finding the subscriber: an unknown one is
    404 whatever the body, in JSON."""
    path = "/cdp/marketing-preferences/" + "0" * 32
    for name, body in {**BODIES, **FRAGMENTS}.items():
        r = probe.send("POST", path, "preferences", content=body, headers={"content-type": "x"})
        assert r.status_code == 404, f"{name}: {r.status_code} {r.text[:200]}"


def test_bodies_over_the_limits(probe: Probe) -> None:
    """413 in JSON: a body over 1 MB (declared, or chunked with no length), a call over 32 KB, a
    batch item over 32 KB, a batch whose context copied into its calls goes over the limits."""
    probe.rss.mark()
    big = b'{"userId":"u","event":"E","properties":{"pad":"' + b"x" * (1 << 20) + b'"}}'
    for route in ROUTES + [Route("preferences", "/cdp/marketing-preferences/x", bytes, "none")]:
        r = send(probe, route, big, "over the limits")
        expected = 413
        assert r.status_code == expected, f"{route.name}: {r.status_code} {r.text[:200]}"

        def chunks() -> Any:
            for i in range(0, len(big), 65536):
                yield big[i : i + 65536]

        r = probe.send(
            "POST", url(probe, route), "over the limits", content=chunks(),
            headers=headers(probe, route),
        )  # fmt: skip
        assert r.status_code == expected, f"{route.name} chunked: {r.status_code} {r.text[:200]}"
    server = ROUTES[1]
    call = server.wrap(many_keys())  # 10,000 keys: ~110 KB
    assert send(probe, server, call, "over the limits").status_code == 413
    batch = ROUTES[4]
    assert send(probe, batch, batch.wrap(many_keys()), "over the limits").status_code == 413
    # The context alone is 20,000 keys (330 KB): copied into 200 calls it made 60 MB of messages
    # and took the server from 190 to 498 MiB before the batch counted it into its limits.
    context = {f"k{i}": i for i in range(20_000)}
    calls = [{"type": "track", "userId": "u", "event": "e"}] * 200
    body = json.dumps({"context": context, "batch": calls}).encode()
    r = send(probe, batch, body, "over the limits")
    assert r.status_code == 413, r.text[:200]
    assert "context" in r.json()["message"]
    small = json.dumps({"context": {"k": 1}, "batch": calls}).encode()
    r = send(probe, batch, small, "over the limits")
    assert r.status_code == 200, r.text[:200]
    landed(probe, event_ids(r))
    assert probe.peak("over the limits") - probe.rss.start_mib < RSS_RISE_MIB
    probe.healthy()


def test_timestamps_and_event_types(probe: Probe) -> None:
    """Values that parse but broke stamping or landing: 400, and the server still starts."""
    route = ROUTES[1]
    bad = [
        {"timestamp": "0001-01-01T00:00:00+01:00"},  # before year 1 in UTC: was a 500
        {"timestamp": "9999-12-31T23:59:59-01:00"},
        {"timestamp": "0001-01-01", "sentAt": "9999-12-31"},  # skew past year 1: was a 500
    ]
    for extra in bad:
        body = json.dumps({"userId": "u", "event": "E", **extra}).encode()
        r = send(probe, route, body, "stamping")
        assert r.status_code == 400, f"{extra}: {r.status_code} {r.text[:200]}"
    # A non-string event was accepted by screen, page and the writeKey routes, then stopped
    # the landing of its whole log segment and every later start of the server.
    for route, body in [
        (ROUTES[3], {"userId": "u", "event": {"a": 1}, "name": "Home"}),
        (ROUTES[9], {"type": "identify", "userId": "u", "event": 123, "traits": {}}),
        (ROUTES[4], {"batch": [{"type": "page", "userId": "u", "event": [1]}]}),
    ]:
        r = send(probe, route, json.dumps(body).encode(), "stamping")
        assert r.status_code == 400, f"{route.name}: {r.status_code} {r.text[:200]}"
        assert "event" in r.json()["message"]


# --- generated -------------------------------------------------------------------------------

_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**40), max_value=10**40)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20)  # any code point: NULs, surrogates (encoded as escapes)
)
_json_values = st.recursive(
    _scalars,
    lambda children: (
        st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=8), children, max_size=5)
    ),
    max_leaves=30,
)


def _dumps(value: Any) -> bytes:
    return json.dumps(value, ensure_ascii=True).encode()


@st.composite
def hostile_bodies(draw: st.DrawFn) -> bytes:
    """A body of the route's shape around a generated value, then perhaps broken: bytes cut,
    flipped or inserted (invalid UTF-8, NULs), nesting deepened, keys duplicated, numbers
    blown up."""
    value = _dumps(draw(_json_values))
    how = draw(st.sampled_from(["plain", "deep", "dup", "huge", "bytes", "cut", "raw"]))
    if how == "deep":
        depth = draw(st.integers(1, 20_000))
        value = b"[" * depth + value + b"]" * depth
    elif how == "dup":
        value = b'{"k":' + value + b',"k":' + value + b"}"
    elif how == "huge":
        value = (
            draw(st.sampled_from([b"1e", b"-1e", b"9" * 400 + b"e"]))
            + str(draw(st.integers(300, 100_000))).encode()
        )
    elif how == "raw":
        return draw(st.binary(max_size=2_000))
    body = bytearray(value)
    if how == "bytes" and body:
        for _ in range(draw(st.integers(1, 4))):
            at = draw(st.integers(0, len(body)))
            body[at:at] = bytes([draw(st.sampled_from([0x00, 0x80, 0xC0, 0xFF, 0xED, 0xF4]))])
    elif how == "cut" and body:
        del body[draw(st.integers(0, len(body) - 1)) :]
    return bytes(body)


def test_generated_bodies(probe: Probe) -> None:
    """Generated values inside every route's body: no 5xx, errors JSON with a message, and
    every accepted call lands."""
    accepted: list[str] = []
    probe.rss.mark()

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(route=st.sampled_from(ROUTES), fragment=hostile_bodies())
    def check(route: Route, fragment: bytes) -> None:
        r = send(probe, route, route.wrap(fragment), "generated")
        assert r.status_code in (200, 400, 413), r.text[:200]
        if r.status_code == 200 and route.ingests:
            accepted.extend(event_ids(r))

    check()
    probe.healthy()
    landed(probe, accepted)
    FIGURES.notes.append(f"generated bodies: {EXAMPLES} examples, {len(accepted)} calls accepted")
    assert probe.peak("generated") - probe.rss.start_mib < RSS_RISE_MIB
