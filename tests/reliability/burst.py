"""A paced HTTP/1.1 request generator cheap enough on the client's side to offer 2,000 req/s.

Plain sockets with keep-alive and pipelining (uvicorn answers pipelined requests in order):
each connection writes its share of a tick's requests, then reads as many answers. Only the
status and Retry-After of each answer are kept.
"""

from __future__ import annotations

import socket
import threading
import time
from collections import Counter
from dataclasses import dataclass, field


@dataclass
class BurstResult:
    sent: int = 0
    seconds: float = 0.0
    statuses: Counter[int] = field(default_factory=Counter)
    retry_after: Counter[str] = field(default_factory=Counter)
    first_429_at: int | None = None  # index of the first 429 in answer order

    @property
    def offered_rate(self) -> float:
        return self.sent / self.seconds if self.seconds else 0.0


def _read_answer(f: object) -> tuple[int, str | None]:
    readline = f.readline  # type: ignore[attr-defined]
    status_line = readline()
    if not status_line:
        raise ConnectionError("connection closed")
    status = int(status_line.split()[1])
    length, retry = 0, None
    while True:
        line = readline()
        if line in (b"\r\n", b"\n", b""):
            break
        name, _, value = line.decode("latin-1").partition(":")
        name = name.strip().lower()
        if name == "content-length":
            length = int(value.strip())
        elif name == "retry-after":
            retry = value.strip()
    f.read(length)  # type: ignore[attr-defined]
    return status, retry


def burst(
    port: int,
    request: bytes,
    total: int,
    rate: float,
    connections: int = 4,
    tick_s: float = 0.02,
) -> BurstResult:
    """Send `request` (a whole HTTP/1.1 request) `total` times at about `rate` per second."""
    result = BurstResult()
    lock = threading.Lock()
    order: list[int] = []
    per_tick = max(1, round(rate * tick_s / connections))
    per_conn = total // connections
    start = time.monotonic()

    def run(n: int) -> None:
        sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        f = sock.makefile("rb")
        done, tick = 0, 0
        try:
            while done < n:
                k = min(per_tick, n - done)
                # Paced: tick t's requests go at start + t * tick_s, however late the last were.
                wait = start + tick * tick_s - time.monotonic()
                if wait > 0:
                    time.sleep(wait)
                sock.sendall(request * k)
                answers = [_read_answer(f) for _ in range(k)]
                with lock:
                    for status, retry in answers:
                        result.statuses[status] += 1
                        order.append(status)
                        if retry is not None:
                            result.retry_after[retry] += 1
                done += k
                tick += 1
        finally:
            f.close()
            sock.close()

    threads = [threading.Thread(target=run, args=(per_conn,)) for _ in range(connections)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    result.seconds = time.monotonic() - start
    result.sent = per_conn * connections
    result.first_429_at = order.index(429) if 429 in order else None
    return result


def post_request(path: str, headers: dict[str, str], body: bytes) -> bytes:
    head = f"POST {path} HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-length: {len(body)}\r\n"
    head += "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    return head.encode() + b"\r\n" + body
