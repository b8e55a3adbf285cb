"""Nothing acknowledged is lost: SIGTERM drains, SIGKILL recovers, a full disk answers 503."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import threading
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest

from mallard.processes import alive
from tests.conftest import Server, free_port, init_data_dir, landed_event_ids

TRACK = {"userId": "d1", "event": "Durable", "properties": {"pad": "p" * 200}}


def load(
    server: Server, stop: threading.Event, acked: list[str], workers: int = 6, batch_every: int = 5
) -> list[threading.Thread]:
    """Concurrent clients posting until stopped; records every acknowledged eventId."""

    def client() -> None:
        with httpx.Client(headers=server.headers, timeout=10) as c:
            n = 0
            while not stop.is_set():
                n += 1
                try:
                    if n % batch_every == 0:
                        r = c.post(
                            f"{server.base}/batch",
                            json={"batch": [{**TRACK, "type": "track"}] * 10},
                        )
                        if r.status_code == 200:
                            acked.extend(r.json()["eventIds"])
                    else:
                        r = c.post(f"{server.base}/track", json=TRACK)
                        if r.status_code == 200:
                            acked.append(r.json()["eventId"])
                except httpx.HTTPError:
                    time.sleep(0.01)

    threads = [threading.Thread(target=client) for _ in range(workers)]
    for t in threads:
        t.start()
    return threads


def wait_acked(acked: list[str], n: int, what: str, timeout: float = 120) -> None:
    """Until `n` messages are acknowledged: the load is under way, however slow the host. The
    timeout only stops a hang."""
    deadline = time.monotonic() + timeout
    while len(acked) < n:
        assert time.monotonic() < deadline, f"{len(acked)} of {n} acknowledged {what}"
        time.sleep(0.05)


def segments(data_dir: Path) -> list[Path]:
    return [p for p in (data_dir / "wal").rglob("*") if p.is_file()]


def test_sigterm_drains_and_lands_everything(server: Server) -> None:
    stop, acked = threading.Event(), []
    threads = load(server, stop, acked)
    wait_acked(acked, 100, "before the SIGTERM")
    # uvicorn re-raises the captured SIGTERM after its graceful shutdown, so -15 is a clean exit.
    assert server.stop(signal.SIGTERM) in (0, -signal.SIGTERM)
    stop.set()
    for t in threads:
        t.join()
    landed = Counter(landed_event_ids(server.data_dir))
    assert all(landed[i] == 1 for i in acked), "an acknowledged message is missing or doubled"
    assert segments(server.data_dir) == []  # everything rolled before exit


def _children(pid: int) -> set[int]:
    out: set[int] = set()
    for task in Path(f"/proc/{pid}/task").glob("*"):
        with contextlib.suppress(OSError):
            out |= {int(c) for c in (task / "children").read_text().split()}
    return out


def test_sigkill_under_load_loses_nothing_acknowledged(tmp_path: Path) -> None:
    d = tmp_path / "data"
    server = Server(
        d,
        free_port(),
        init_data_dir(d),
        env={"MALLARD_ROLL_INTERVAL_S": "0.3", "MALLARD_RATE_BURST": "1000000"},
    )
    acked: list[str] = []
    for round_ in range(4):
        server.port = free_port()
        server.start()
        stop = threading.Event()
        threads = load(server, stop, acked)
        # Each round is killed at a different point of its load (more acknowledged each time).
        wait_acked(acked, len(acked) + 60 + 40 * round_, f"in round {round_}")
        assert server.proc is not None
        children = _children(server.proc.pid)
        assert children, "the roller runs in its own process"
        server.kill()
        stop.set()
        for t in threads:
            t.join()
        # The killed server's roller does not live on as an orphan.
        deadline = time.monotonic() + 10
        while any(alive(c) for c in children) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(alive(c) for c in children), "an orphaned roller outlived its server"
    # A last clean start recovers whatever the kills left in the log, then drains.
    server.port = free_port()
    server.start()
    assert server.stop() in (0, -signal.SIGTERM)
    landed = Counter(landed_event_ids(d))
    missing = [i for i in acked if landed[i] == 0]
    assert missing == [], f"{len(missing)} acknowledged messages lost"
    assert max(landed.values()) == 1, "a message landed twice"
    assert segments(d) == []


def test_full_disk_answers_503_and_keeps_what_was_acknowledged(tmp_path: Path) -> None:
    mnt = tmp_path / "small-disk"
    mnt.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=24m", "tmpfs", str(mnt)], capture_output=True
    )
    if mounted.returncode != 0:
        pytest.skip(
            "SKIPPED LOUDLY: cannot mount a small tmpfs here (needs root); the "
            "disk-full behaviour is NOT checked in this run"
        )
    try:
        d = mnt / "data"
        server = Server(
            d,
            free_port(),
            init_data_dir(d),
            env={"MALLARD_ROLL_INTERVAL_S": "60", "MALLARD_RATE_BURST": "1000000"},
        )
        server.start()
        free = shutil.disk_usage(mnt).free
        filler = mnt / "filler"
        with open(filler, "wb") as f:
            f.write(b"\0" * max(0, free - 256 * 1024))
        acked, codes = [], Counter()
        with httpx.Client(headers=server.headers, timeout=10) as c:
            for _ in range(2000):
                r = c.post(
                    f"{server.base}/batch", json={"batch": [{**TRACK, "type": "track"}] * 20}
                )
                codes[r.status_code] += 1
                if r.status_code == 200:
                    acked.extend(r.json()["eventIds"])
                else:
                    assert r.status_code == 503, r.text
                    assert r.json()["success"] is False
                if codes[503] >= 3:
                    break
        assert codes[503] >= 3 and acked
        filler.unlink()  # space comes back: the collector writes again ...
        # ... once it tries a fresh segment; until then each call is a 503 saying when to retry.
        deadline = time.monotonic() + 60
        while (
            r := httpx.post(f"{server.base}/track", json=TRACK, headers=server.headers)
        ).status_code == 503:
            assert time.monotonic() < deadline, "the collector did not write again"
            retry = r.headers.get("retry-after")
            assert retry is not None and retry.isdigit(), r.headers
            time.sleep(int(retry))
        assert r.status_code == 200, r.text
        acked.append(r.json()["eventId"])
        assert server.stop() in (0, -signal.SIGTERM)  # ... and drains everything into landing files
        landed = Counter(landed_event_ids(d))
        assert all(landed[i] == 1 for i in acked)
        assert len(landed) == len(acked)  # nothing that got a 503 was landed
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)
        os.sync()
