"""JSON text of stored state (the dispatcher's rows, the warehouse's JSON columns), made and read
with msgspec, and with the json module where msgspec refuses a value (an integer beyond 64
bits): the same documents as json.dumps/json.loads, compact, several times faster on the
small documents the dispatcher writes and reads for every send and journey step."""

from __future__ import annotations

import json
from typing import Any

import msgspec

_decoder = msgspec.json.Decoder()
_encoder = msgspec.json.Encoder()
_sorted = msgspec.json.Encoder(order="sorted")


def loads(text: str | bytes) -> Any:
    try:
        return _decoder.decode(text)
    except msgspec.ValidationError:  # "Number out of range"
        return json.loads(text)


def dumps(value: Any, sort_keys: bool = False) -> str:
    try:
        return (_sorted if sort_keys else _encoder).encode(value).decode()
    except (OverflowError, TypeError):
        return json.dumps(value, sort_keys=sort_keys, separators=(",", ":"))
