"""A full disk: 503 with Retry-After, never an ack without durability, back when space returns.

tests/integration/test_durability.py (make test) checks the 503s and what lands; this variant,
under load from several threads, also checks the Retry-After each 503 carries, that a client
honouring it is let in once space is back, and that every call answered 200 is in the landing
files after the drain while no call answered 503 is. Needs root for a small tmpfs: fails (not
skips) without it, as a skipped disk test proves nothing.
"""

from __future__ import annotations

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

from mallard.harness import Server, free_port, init_data_dir
from tests.conftest import landed_event_ids
from tests.reliability.conftest import FIGURES

pytestmark = [pytest.mark.reliability, pytest.mark.integration]

TRACK = {"type": "track", "userId": "full", "event": "Full", "properties": {"pad": "p" * 300}}


def test_full_disk_503_retry_after_no_ack_without_durability(tmp_path: Path) -> None:
    mnt = tmp_path / "small-disk"
    mnt.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=24m", "tmpfs", str(mnt)], capture_output=True
    )
    assert mounted.returncode == 0, f"cannot mount a tmpfs (root needed): {mounted.stderr!r}"
    server: Server | None = None
    try:
        d = mnt / "data"
        env = {
            "MALLARD_ROLL_INTERVAL_S": "60",
            "MALLARD_RATE_BURST": "1000000",
            "MALLARD_RATE_PER_SECOND": "1000000",
        }
        server = Server(d, free_port(), init_data_dir(d), env=env)
        server.start()
        filler = mnt / "filler"
        with open(filler, "wb") as f:
            f.write(b"\0" * max(0, shutil.disk_usage(mnt).free - 512 * 1024))
        acked: list[str] = []
        refused: list[list[dict[str, object]]] = []  # bodies answered 503
        codes: Counter[int] = Counter()
        retry_after: Counter[str] = Counter()
        lock, stop = threading.Lock(), threading.Event()

        def client(n: int) -> None:
            with httpx.Client(headers=server.headers, timeout=10) as c:
                i = 0
                while not stop.is_set():
                    i += 1
                    batch: list[dict[str, object]] = [
                        {**TRACK, "messageId": f"full-{n}-{i}-{k}"} for k in range(20)
                    ]
                    r = c.post(f"{server.base}/batch", json={"batch": batch})
                    with lock:
                        codes[r.status_code] += 1
                        if r.status_code == 200:
                            acked.extend(r.json()["eventIds"])
                        elif r.status_code == 503:
                            assert r.json()["success"] is False and r.json()["message"]
                            retry_after[r.headers.get("retry-after", "none")] += 1
                            refused.append(batch)

        threads = [threading.Thread(target=client, args=(n,)) for n in range(4)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 60
        while codes[503] < 20 and time.monotonic() < deadline:
            time.sleep(0.05)
        stop.set()
        for t in threads:
            t.join()
        assert set(codes) <= {200, 503}, codes
        assert codes[503] >= 20, f"the disk never filled: {codes}"
        assert retry_after == {"1": codes[503]}, retry_after
        # Still full: a retry after Retry-After is refused again, never acknowledged.
        r = server.post("track", TRACK)
        assert r.status_code == 503 and r.headers["retry-after"] == "1", r.text
        filler.unlink()  # space returns
        time.sleep(int(r.headers["retry-after"]))
        r = server.post("track", TRACK)
        assert r.status_code == 200, r.text
        acked.append(r.json()["eventId"])
        assert server.stop() in (0, -signal.SIGTERM)
        landed = Counter(landed_event_ids(d))
        assert [i for i in acked if landed[i] != 1] == [], "an ack lost or doubled"
        assert sum(landed.values()) == len(acked), "a call answered 503 was stored"
    finally:
        if server is not None:
            server.stop()
        subprocess.run(["umount", "-l", str(mnt)], check=False)
        os.sync()
    FIGURES.notes.append(
        f"disk full (24 MiB tmpfs, 4 clients): {codes[200]} x 200 ({len(acked) - 1} messages,"
        f" all landed once), {codes[503]} x 503 all with Retry-After 1, none stored; 200 again"
        f" 1 s after space returned"
    )
