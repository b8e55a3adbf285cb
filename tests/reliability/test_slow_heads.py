"""Slow heads: many clients sending their request headers a byte at a time, or nothing, or a head
without end, are cut off (mallard/head_deadline.py) while everyone else is served quickly.

uvicorn alone held such a connection for as long as the client liked (no timer before a
connection's first response; any byte cancels the keep-alive timer) and let a head grow without
bound. The session's server cuts a head at HEAD_TIMEOUT_S (4 s here, 20 s by default).
"""

from __future__ import annotations

import os
import select
import socket
import statistics
import threading
import time
from dataclasses import dataclass

import httpx
import pytest

from tests.conftest import wait_landed
from tests.reliability.conftest import FIGURES, HEAD_TIMEOUT_S, Probe, check_latency

pytestmark = [pytest.mark.reliability, pytest.mark.integration]

SLOW_CLIENTS = int(os.environ.get("MALLARD_SLOW_CLIENTS", "200"))
IDLE, STALLED = 10, 10  # of SLOW_CLIENTS: connections that send nothing / stall after a request
TRICKLE_S = 0.5  # a byte every half second on each trickling connection
# A connection is closed at the deadline; this much later fails (a loaded 2-core machine).
LATE_S = 3.0


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


@dataclass
class Slow:
    sock: socket.socket
    kind: str  # "trickle", "idle" or "stalled"
    since: float  # when the server's clock for this head started
    next_send: float = 0.0
    sent: int = 0
    answer: bytes = b""
    closed_after: float | None = None  # seconds after `since` the server closed it


def _full_request(sock: socket.socket, path: str) -> bytes:
    """One complete request on a raw socket; its answer (content-length bodies only)."""
    sock.sendall(f"GET {path} HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n".encode())
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(65536)
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":")[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    while len(body) < length:
        body += sock.recv(65536)
    return head


def _open_slow(probe: Probe, kind: str) -> Slow:
    sock = socket.create_connection(("127.0.0.1", probe.server.port), timeout=10)
    if kind == "stalled":  # a keep-alive connection: one request served, then half a head
        assert _full_request(sock, "/health").startswith(b"HTTP/1.1 200")
    since = time.monotonic()
    if kind != "idle":
        line = f"POST {probe.server.base_path}/track HTTP/1.1\r\nhost: 127.0.0.1\r\nx-slow: "
        sock.sendall(line.encode())
    sock.setblocking(False)
    return Slow(sock, kind, since, next_send=since + TRICKLE_S)


def _drive(slows: list[Slow], until: float) -> None:
    """Trickle a byte per TRICKLE_S on each trickling connection, and read what the server
    sends, until every connection is closed or `until`."""
    open_ = {s.sock.fileno(): s for s in slows}
    while open_ and time.monotonic() < until:
        now = time.monotonic()
        for s in open_.values():
            # Stop a second before the deadline: a byte crossing the server's close would make
            # the kernel answer with a reset, which drops the 408 unread (as in the body test).
            if s.kind == "trickle" and now >= s.next_send and now - s.since < HEAD_TIMEOUT_S - 1:
                try:
                    s.sock.send(b"a")
                    s.sent += 1
                except OSError:
                    pass
                s.next_send = now + TRICKLE_S
        readable, _, _ = select.select(list(open_), [], [], 0.02)
        for fd in readable:
            s = open_[fd]
            try:
                chunk = s.sock.recv(65536)
            except BlockingIOError:
                continue
            except OSError:
                chunk = b""
            if chunk:
                s.answer += chunk
            else:
                s.closed_after = time.monotonic() - s.since
                del open_[fd]


def _served(probe: Probe, client: httpx.Client, accepted: list[str]) -> list[float]:
    """A /health and a track by another client, each answered 200; their latencies, seconds."""
    t0 = time.monotonic()
    health = client.get("/health")
    t1 = time.monotonic()
    r = client.post(
        probe.server.base_path + "/track",
        json={"userId": "beside-slow-heads", "event": "Served"},
        headers=probe.server.headers,
    )
    t2 = time.monotonic()
    assert health.status_code == 200, health.text
    assert r.status_code == 200, r.text
    accepted.append(r.json()["eventId"])
    time.sleep(0.01)
    return [t1 - t0, t2 - t1]


def test_many_slow_heads_are_cut_and_others_are_served(probe: Probe) -> None:
    """SLOW_CLIENTS connections at once: most send their headers a byte every half second,
    some send nothing, some stall half-way through the head of their second request. Each is
    answered 408 in JSON (closed silently when it sent nothing) and closed at the deadline;
    meanwhile another client's /health and ingestion calls are answered quickly, what it sent
    lands, and the server's descriptors and memory come back down."""
    pid = probe.pid
    accepted: list[str] = []
    with httpx.Client(base_url=probe.server.url, timeout=30) as client:
        # The same client's calls before the attack: the baseline its latency is held to.
        baseline: list[float] = []
        for _ in range(15):
            baseline += _served(probe, client, accepted)
    fds_before = open_fds(pid)
    rss_before = probe.rss.mark()
    kinds = ["idle"] * IDLE + ["stalled"] * STALLED
    kinds += ["trickle"] * (SLOW_CLIENTS - len(kinds))
    slows = [_open_slow(probe, kind) for kind in kinds]
    opened = time.monotonic()
    driver = threading.Thread(
        target=_drive, args=(slows, opened + HEAD_TIMEOUT_S + LATE_S + 5), daemon=True
    )
    driver.start()

    latencies: list[float] = []
    fds_peak = fds_before
    with httpx.Client(base_url=probe.server.url, timeout=30) as client:
        while driver.is_alive():
            fds_peak = max(fds_peak, open_fds(pid))
            latencies += _served(probe, client, accepted)
    driver.join()
    for s in slows:
        s.sock.close()
    FIGURES.requests += len(baseline) + len(latencies) + len(slows)
    FIGURES.statuses[200] += len(baseline) + len(latencies)

    latency = check_latency("another client's", baseline, latencies)
    still_open = [s.kind for s in slows if s.closed_after is None]
    assert still_open == [], f"{len(still_open)} slow connections never closed: {still_open[:5]}"
    closed = sorted(s.closed_after for s in slows if s.closed_after is not None)
    late = [t for t in closed if t > HEAD_TIMEOUT_S + LATE_S]
    assert late == [], f"{len(late)} slow connections closed late: {late[:5]} s"
    early = [t for t in closed if t < HEAD_TIMEOUT_S - 0.5]
    assert early == [], f"{len(early)} slow connections closed before the deadline: {early[:5]}"
    for s in slows:
        if s.kind == "idle":
            assert s.answer == b"", s.answer[:300]
            continue
        FIGURES.statuses[408] += 1
        head, _, body = s.answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 408"), f"{s.kind}: {s.answer[:300]!r}"
        assert b"content-type: application/json" in head.lower(), head
        assert b"did not arrive" in body, body
    # Every slow connection was held at once (else the attack proved nothing), then let go.
    assert fds_peak - fds_before >= 0.9 * len(slows), f"descriptors {fds_before} -> {fds_peak}"
    deadline = time.monotonic() + 5
    while (fds_after := open_fds(pid)) > fds_before + 5 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert fds_after <= fds_before + 5, f"descriptors {fds_before} -> {fds_after} after"
    rise = probe.peak("slow heads") - rss_before
    assert rise < 32, f"the server's RSS rose {rise:.0f} MiB"
    wait_landed(probe.server.data_dir, accepted)
    FIGURES.accepted += len(accepted)
    FIGURES.landed += len(accepted)

    FIGURES.notes.append(
        f"slow heads: {len(slows)} connections at once ({IDLE} idle, {STALLED} stalled after a"
        f" request, the rest a header byte every {TRICKLE_S:g} s) closed {closed[0]:.1f}-"
        f"{closed[-1]:.1f} s after their head began (deadline {HEAD_TIMEOUT_S:g} s), 408 in JSON"
        f" to all but the idle; /health and track of {latency}, p50"
        f" {statistics.median(latencies) * 1000:.0f} ms, {len(accepted)} tracks landed; server"
        f" descriptors"
        f" {fds_before} -> peak {fds_peak} -> {fds_after}, RSS rose {rise:.0f} MiB"
    )


def test_a_head_without_end_is_refused_at_its_size_limit(probe: Probe) -> None:
    """Header lines streamed as fast as the client can: 431 in JSON and closed once the head
    passes 64 KiB, the server's memory untouched (300 MB of headers took it from 191 to 498
    MiB before)."""
    start = probe.rss.mark()
    sock = socket.create_connection(("127.0.0.1", probe.server.port), timeout=10)
    sock.sendall(f"POST {probe.server.base_path}/track HTTP/1.1\r\nhost: 127.0.0.1\r\n".encode())
    line = b"x-endless: " + b"v" * 8000 + b"\r\n"
    sent = 0
    try:
        while sent < 64 << 20:
            sock.sendall(line)
            sent += len(line)
    except OSError:  # closed by the server: its answer was sent before
        pass
    answer = b""
    try:
        while chunk := sock.recv(65536):
            answer += chunk
    except OSError:
        pass
    sock.close()
    FIGURES.requests += 1
    FIGURES.statuses[431] += 1
    assert sent < 64 << 20, "the server read 64 MiB of headers"
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 431"), answer[:300]
    assert b"content-type: application/json" in head.lower(), head
    assert b"exceed 64 KiB" in body, body
    rise = probe.peak("endless head") - start
    assert rise < 16, f"the server's RSS rose {rise:.0f} MiB"
    probe.healthy()
    FIGURES.notes.append(
        f"endless head: 431 after {sent / 2**20:.1f} MiB sent (limit 64 KiB; the rest in socket"
        f" buffers), RSS rose {rise:.0f} MiB"
    )


def test_a_slow_head_within_the_deadline_is_served(probe: Probe) -> None:
    """The deadline cuts a head still arriving after it, not one sent in pieces in time."""
    body = b'{"userId":"slow-head-ok","event":"Steady"}'
    head = f"POST {probe.server.base_path}/track HTTP/1.1\r\nhost: 127.0.0.1\r\n"
    head += "".join(f"{k}: {v}\r\n" for k, v in probe.server.headers.items())
    head += f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    sock = socket.create_connection(("127.0.0.1", probe.server.port), timeout=10)
    pieces = [head[i : i + 16].encode() for i in range(0, len(head), 16)]
    for piece in pieces:  # spread over about half the deadline
        sock.sendall(piece)
        time.sleep(HEAD_TIMEOUT_S / 2 / len(pieces))
    sock.sendall(body)
    answer = b""
    while chunk := sock.recv(65536):
        answer += chunk
    sock.close()
    assert answer.startswith(b"HTTP/1.1 200"), answer[:300]
    event_id = httpx.Response(200, content=answer.partition(b"\r\n\r\n")[2]).json()["eventId"]
    wait_landed(probe.server.data_dir, [event_id])
