"""Gzip bombs and slowloris bodies: refused without inflating or waiting forever, while the
server keeps answering everyone else."""

from __future__ import annotations

import contextlib
import select
import socket
import threading
import time
import zlib

import httpx
import pytest

from tests.conftest import wait_landed
from tests.reliability.conftest import BODY_TIMEOUT_S, FIGURES, Probe, check_latency
from tests.reliability.hostile import basic

pytestmark = [pytest.mark.reliability, pytest.mark.integration]

BOMB_MIB = 1000  # inflates to 1000 MiB; compressed it is just under the 1 MB body limit
GZIP_ROUTES = ["/cdp/events/std/t", "/cdp/events/std/mobile/batch", "/v1/batch", "/v1/track"]


@pytest.fixture(scope="module")
def bomb() -> bytes:
    z = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    zeros = b"\0" * (1 << 20)
    out = [z.compress(zeros) for _ in range(BOMB_MIB)]
    data = b"".join(out) + z.flush()
    assert len(data) < 1 << 20, len(data)
    return data


def test_gzip_bomb_refused_without_inflating(probe: Probe, bomb: bytes) -> None:
    start = probe.rss.mark()
    hdrs = {**basic(probe.write_key), "content-encoding": "gzip"}
    for path in GZIP_ROUTES:
        r = probe.send("POST", path, "gzip bomb", content=bomb, headers=hdrs)
        assert r.status_code == 413, f"{path}: {r.status_code} {r.text[:200]}"
        assert "decompressed" in r.json()["message"]
    # Metrics answer 200 whatever they get, and drop this.
    r = probe.send("POST", "/cdp/events/std/m", "gzip bomb", content=bomb, headers=hdrs)
    assert r.status_code == 200
    probe.healthy()
    rise = probe.peak("gzip bomb") - start
    FIGURES.notes.append(
        f"gzip bomb: {len(bomb):,} bytes inflating to {BOMB_MIB} MiB, x{len(GZIP_ROUTES) + 1}:"
        f" RSS rose {rise:.0f} MiB"
    )
    assert rise < 64, f"the server's RSS rose {rise:.0f} MiB on a gzip bomb"


def _slow_request(probe: Probe, path: str, hdrs: dict[str, str], length: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", probe.server.port), timeout=30)
    head = f"POST {path} HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-length: {length}\r\n"
    head += "".join(f"{k}: {v}\r\n" for k, v in hdrs.items()) + "\r\n"
    sock.sendall(head.encode())
    return sock


def _read_answer(sock: socket.socket) -> bytes:
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


def test_slowloris_bodies_time_out_and_others_are_served(probe: Probe) -> None:
    """Ten connections sending their bodies a byte a second: each answered 408 in JSON and closed
    once the body deadline passes; meanwhile /health and ingestion answer at once, and the
    calls accepted meanwhile land."""
    n, length = 10, 200
    # /health's own latency before the attack, on a client kept open throughout: the baseline
    # it is held to meanwhile.
    health_client = httpx.Client(base_url=probe.server.url, timeout=30)

    def timed_health() -> float:
        t0 = time.monotonic()
        r = health_client.get("/health")
        assert r.status_code == 200, r.text
        return time.monotonic() - t0

    baseline = [timed_health() for _ in range(30)]
    FIGURES.requests += len(baseline)
    FIGURES.statuses[200] += len(baseline)
    paths = [
        (probe.server.base_path + "/track", dict(probe.server.headers)),
        ("/cdp/events/std/t", basic(probe.write_key)),
        (probe.server.base_path + "/regulations", dict(probe.server.headers)),
    ]
    socks = [_slow_request(probe, *paths[i % len(paths)], length) for i in range(n)]
    answers: list[bytes] = [b""] * n
    stop = threading.Event()

    started = time.monotonic()

    def trickle(i: int) -> None:
        sock = socks[i]
        for _ in range(length):
            if stop.wait(1.0) or select.select([sock], [], [], 0)[0]:
                break  # the answer is in: sending on would make the server's close a reset
            if time.monotonic() - started > BODY_TIMEOUT_S - 1.0:
                # Still trickling when the server cuts the body, a byte crossing its close makes
                # the kernel answer with a reset, which drops the 408 unread (seen in one of two
                # full runs): stop sending just before the deadline, as a stalled sender would.
                break
            try:
                sock.sendall(b" ")
            except OSError:  # the server closed it: its answer is waiting
                break
        with contextlib.suppress(OSError):
            answers[i] = _read_answer(sock)

    threads = [threading.Thread(target=trickle, args=(i,), daemon=True) for i in range(n)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    accepted, health = [], []
    while time.monotonic() - t0 < BODY_TIMEOUT_S + 2:
        health.append(timed_health())
        r = probe.server.post("track", {"userId": "meanwhile", "event": "Served"})
        FIGURES.requests += 1
        FIGURES.statuses[r.status_code] += 1
        assert r.status_code == 200, r.text
        accepted.append(r.json()["eventId"])
        time.sleep(0.2)
    for t in threads:
        t.join(BODY_TIMEOUT_S + 10)
    stop.set()
    health_client.close()
    took = time.monotonic() - t0
    for sock in socks:
        sock.close()
    FIGURES.requests += n
    for i, answer in enumerate(answers):
        status = int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/1.1 ") else 0
        FIGURES.statuses[status] += 1
        assert status == 408, f"slow body {i}: {answer[:300]!r}"
        head, _, body = answer.partition(b"\r\n\r\n")
        assert b"content-type: application/json" in head.lower(), head
        assert b"did not arrive" in body, body
    wait_landed(probe.server.data_dir, accepted)
    FIGURES.accepted += len(accepted)
    FIGURES.landed += len(accepted)
    FIGURES.requests += len(health)
    FIGURES.statuses[200] += len(health)
    latency = check_latency("/health", baseline, health)
    FIGURES.notes.append(
        f"slowloris: {n} bodies at 1 byte/s cut after {took:.1f} s (deadline {BODY_TIMEOUT_S:g} s);"
        f" {latency}; {len(accepted)} calls accepted"
    )


def test_a_slow_but_steady_body_within_the_deadline_is_served(probe: Probe) -> None:
    """The deadline cuts a body still arriving after it, not a body sent in pieces in time."""
    body = b'{"userId":"slow-ok","event":"Steady"}'
    sock = _slow_request(probe, probe.server.base_path + "/track", probe.server.headers, len(body))
    for i in range(0, len(body), 8):
        sock.sendall(body[i : i + 8])
        time.sleep(0.1)
    sock.shutdown(socket.SHUT_WR)
    answer = _read_answer(sock)
    sock.close()
    assert answer.startswith(b"HTTP/1.1 200"), answer[:300]
    event_id = httpx.Response(200, content=answer.partition(b"\r\n\r\n")[2]).json()["eventId"]
    wait_landed(probe.server.data_dir, [event_id])
