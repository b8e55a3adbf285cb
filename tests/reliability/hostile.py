"""Hostile JSON fragments and the routes that take JSON bodies, each wrapping a fragment into a
body of its own shape (a call's properties, a batch item's, a regulation's ids, a preferences
update's reason), so the fragment reaches the parser of every route."""

from __future__ import annotations

import base64
from collections.abc import Callable
from dataclasses import dataclass

DEPTH = 10_000


def deep_arrays(depth: int = DEPTH) -> bytes:
    return b"[" * depth + b"]" * depth


def deep_objects(depth: int) -> bytes:
    return b'{"a":' * depth + b"1" + b"}" * depth


def many_keys(n: int = 10_000) -> bytes:
    return b"{" + b",".join(b'"k%d":%d' % (i, i) for i in range(n)) + b"}"


# A value placed where a route expects free-form JSON. The comment says what the parser meets.
FRAGMENTS: dict[str, bytes] = {
    "deep arrays 10,000": deep_arrays(),  # RecursionError in msgspec (was a 500)
    "deep objects 3,000": deep_objects(3_000),
    "deep but allowed 100": deep_arrays(100),
    "float 1e400": b"1e400",
    "float -1e400": b"-1e400",
    "int of 5,000 digits": b"9" * 5_000,
    "int beyond 64 bits": b"18446744073709551616",
    "invalid UTF-8 in a string": b'"caf\xc3\x28"',  # UnicodeDecodeError (was a 500)
    "invalid UTF-8 in a key": b'{"\xff\xfe":1}',
    "overlong UTF-8": b'"\xc0\xaf"',
    "lone surrogate escape": b'"\\ud800"',
    "NUL escaped": b'{"a\\u0000b":"c\\u0000d"}',
    "raw NUL byte": b'"a\x00b"',
    "duplicate keys": b'{"a":1,"a":2,"a":{"a":3}}',
    "10,000-key object": many_keys(),
    "unterminated": b'{"a":[1,2',
}

# Whole bodies, whatever the route.
BODIES: dict[str, bytes] = {
    "empty body": b"",
    "not JSON": b"hello",
    "JSON array": b"[]",
    "JSON string": b'"x"',
    "JSON null": b"null",
    "bare number 1e400": b"1e400",
    "deep arrays 10,000 as the body": deep_arrays(),
    "invalid UTF-8 as the body": b"\xff\xfe\xfd",
    "raw NUL in the body": b'{"userId":"a\x00"}',
    "BOM then JSON": b'\xef\xbb\xbf{"userId":"u","event":"e"}',
}


def basic(write_key: str) -> dict[str, str]:
    token = base64.b64encode(f"{write_key}:".encode()).decode()
    return {"authorization": f"Basic {token}", "content-type": "application/json"}


@dataclass(frozen=True)
class Route:
    name: str
    path: str  # relative to the server's url; {base} is the demo tenant's /track/.../v1
    wrap: Callable[[bytes], bytes]
    auth: str  # "token", "writeKey" or "none"
    ingests: bool = True  # a 200 answer carries eventIds that must land


def _call(event: str) -> Callable[[bytes], bytes]:
    head = b'{"userId":"hostile-1","event":"' + event.encode() + b'","traits":{},"properties":'
    return lambda frag: head + frag + b"}"


def _client_call(kind: str) -> Callable[[bytes], bytes]:
    head = b'{"type":"' + kind.encode() + b'","userId":"hostile-1","event":"E","properties":'
    return lambda frag: head + frag + b"}"


def _batch(frag: bytes) -> bytes:
    return (
        b'{"batch":[{"type":"track","userId":"hostile-1","event":"E","properties":' + frag + b"}]}"
    )


def _regulation(frag: bytes) -> bytes:
    # An unknown type: parsed whole, then refused (400), so no regulation is filed or run.
    return b'{"regulationType":"HOSTILE","subject":{"type":"USER_ID","ids":[' + frag + b"]}}"


ROUTES = [
    Route("server identify", "{base}/identify", _call("identify"), "token"),
    Route("server track", "{base}/track", _call("Hostile"), "token"),
    Route("server page", "{base}/page", _call("page"), "token"),
    Route("server screen", "{base}/screen", _call("Home"), "token"),
    Route("server batch", "{base}/batch", _batch, "token"),
    Route("tag t", "/cdp/events/std/t", _client_call("track"), "writeKey"),
    Route("tag batch", "/cdp/events/std/b", _batch, "writeKey"),
    Route("mobile batch", "/cdp/events/std/mobile/batch", _batch, "writeKey"),
    Route("segment track", "/v1/track", _client_call("track"), "writeKey"),
    Route("segment identify", "/v1/identify", _client_call("identify"), "writeKey"),
    Route("segment batch", "/v1/batch", _batch, "writeKey"),
    Route("tag metrics", "/cdp/events/std/m", lambda f: b'{"metrics":' + f + b"}", "none", False),
    Route("regulations", "{base}/regulations", _regulation, "token", False),
]
