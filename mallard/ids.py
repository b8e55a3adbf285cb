"""Time-ordered unique ids (UUIDv7 layout) for eventIds and generated messageIds.

uuid4() costs ~2.6 us per call; this takes the random part once per
process and a counter after it, so ids sort by creation time and never repeat.
"""

from __future__ import annotations

import itertools
import os
import threading
import time

_lock = threading.Lock()
_node = int.from_bytes(os.urandom(4), "big") & 0x3FFFFFFF  # 30 random bits per process
_counter = itertools.count(int.from_bytes(os.urandom(2), "big"))
_last_ms = 0


def _reseed() -> None:
    global _node
    _node = int.from_bytes(os.urandom(4), "big") & 0x3FFFFFFF


os.register_at_fork(after_in_child=_reseed)


def new_id() -> str:
    """A UUIDv7-shaped string: 48-bit ms time, then a per-process node and counter."""
    global _last_ms
    with _lock:
        ms = max(time.time_ns() // 1_000_000, _last_ms)
        _last_ms = ms
        seq = next(_counter)
    value = (
        (ms & 0xFFFFFFFFFFFF) << 80
        | 0x7 << 76
        | ((seq >> 32) & 0xFFF) << 64
        | 0b10 << 62
        | _node << 32
        | (seq & 0xFFFFFFFF)
    )
    h = f"{value:032x}"
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"
