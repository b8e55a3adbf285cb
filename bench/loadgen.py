"""A small, fast HTTP/1.1 load generator on asyncio (uvloop when present) over keep-alive
connections: closed-loop throughput and open-loop latency at a fixed rate.

Plain asyncio streams instead of an HTTP client library, so that on a 2-core machine the
generator costs far less CPU than the server it measures. Open-loop latency is measured from
each request's *scheduled* send time, so a stalled server cannot hide its queueing delay
(no coordinated omission).
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field


def build_request(
    host: str, port: int, path: str, body: bytes, headers: dict[str, str], method: str = "POST"
) -> bytes:
    head = [f"{method} {path} HTTP/1.1", f"host: {host}:{port}", f"content-length: {len(body)}"]
    head += [f"{k}: {v}" for k, v in headers.items()]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


class Conn:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def open(cls, host: str, port: int) -> Conn:
        reader, writer = await asyncio.open_connection(host, port)
        return cls(reader, writer)

    async def send(self, request: bytes) -> int:
        """Send one request, read the whole response; returns the status code."""
        self.writer.write(request)
        status_line = await self.reader.readline()
        if not status_line:
            raise ConnectionError("server closed the connection")
        status = int(status_line.split(b" ", 2)[1])
        length = 0
        while True:
            line = await self.reader.readline()
            if line in (b"\r\n", b""):
                break
            if line[:15].lower() == b"content-length:":
                length = int(line[15:])
        if length:
            await self.reader.readexactly(length)
        return status

    def close(self) -> None:
        self.writer.close()


@dataclass
class Result:
    requests: int = 0
    errors: int = 0
    seconds: float = 0.0
    statuses: dict[int, int] = field(default_factory=dict)
    latencies_ms: list[float] = field(default_factory=list)

    @property
    def rate(self) -> float:
        return self.requests / self.seconds if self.seconds else 0.0

    def count(self, status: int) -> None:
        self.statuses[status] = self.statuses.get(status, 0) + 1
        if status == 200:
            self.requests += 1
        else:
            self.errors += 1


async def closed_loop(
    host: str, port: int, requests: Sequence[bytes], connections: int, seconds: float
) -> Result:
    """Each connection sends its next request as soon as the previous answer arrives."""
    res = Result()
    conns = [await Conn.open(host, port) for _ in range(connections)]
    pool = itertools.cycle(requests)
    end = time.perf_counter() + seconds

    async def run(conn: Conn) -> None:
        while time.perf_counter() < end:
            t0 = time.perf_counter()
            res.count(await conn.send(next(pool)))
            res.latencies_ms.append((time.perf_counter() - t0) * 1000)

    start = time.perf_counter()
    await asyncio.gather(*(run(c) for c in conns))
    res.seconds = time.perf_counter() - start
    for c in conns:
        c.close()
    return res


async def labeled_closed_loop(
    host: str,
    port: int,
    requests: Sequence[tuple[str, bytes]],
    connections: int,
    seconds: float,
    limit: int | None = None,
    until: Callable[[], bool] | None = None,
) -> dict[str, Result]:
    """A closed loop over labeled requests (taken in turn), with a Result per label. Stops after
    `seconds`, after `limit` requests in all, or as soon as `until()` is true."""
    results = {label: Result() for label, _ in requests}
    conns = [await Conn.open(host, port) for _ in range(connections)]
    pool = itertools.cycle(requests)
    end = time.perf_counter() + seconds
    sent = 0

    def more() -> bool:
        return (
            time.perf_counter() < end
            and (limit is None or sent < limit)
            and (until is None or not until())
        )

    async def run(conn: Conn) -> None:
        nonlocal sent
        while more():
            label, request = next(pool)
            sent += 1
            t0 = time.perf_counter()
            status = await conn.send(request)
            res = results[label]
            res.count(status)
            res.latencies_ms.append((time.perf_counter() - t0) * 1000)

    start = time.perf_counter()
    await asyncio.gather(*(run(c) for c in conns))
    elapsed = time.perf_counter() - start
    for res in results.values():
        res.seconds = elapsed
    for c in conns:
        c.close()
    return results


async def open_loop(
    host: str,
    port: int,
    requests: Sequence[bytes],
    rate: float,
    seconds: float,
    connections: int = 64,
) -> Result:
    """Send at a fixed rate whatever the server does; latency counts from the scheduled time."""
    res = Result()
    free: asyncio.Queue[Conn] = asyncio.Queue()
    for _ in range(connections):
        free.put_nowait(await Conn.open(host, port))
    pool = itertools.cycle(requests)
    tasks: set[asyncio.Task[None]] = set()

    async def one(scheduled: float, request: bytes) -> None:
        conn = await free.get()
        try:
            res.count(await conn.send(request))
        finally:
            free.put_nowait(conn)
        res.latencies_ms.append((time.perf_counter() - scheduled) * 1000)

    start = time.perf_counter()
    total = int(rate * seconds)
    for i in range(total):
        scheduled = start + i / rate
        delay = scheduled - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        t = asyncio.create_task(one(scheduled, next(pool)))
        tasks.add(t)
        t.add_done_callback(tasks.discard)
    await asyncio.gather(*tasks)
    res.seconds = time.perf_counter() - start
    while not free.empty():
        free.get_nowait().close()
    return res


def run(coro):  # type: ignore[no-untyped-def]
    """Run a coroutine on uvloop when installed (as uvicorn does), else asyncio."""
    try:
        import uvloop

        return uvloop.run(coro)
    except ImportError:
        return asyncio.run(coro)
