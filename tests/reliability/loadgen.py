"""A load generator process for the crash tests: posts until told to stop, records every ack.

`python -m tests.reliability.loadgen URL TOKEN OUT SECONDS`: tracks and batches of 10 to the
demo tenant of URL with the token, one line per acknowledged eventId appended to OUT (flushed
at once, so what the test reads after a server kill is every ack this process got). Connection
errors and refused calls (the server being killed and restarted) are retried; statuses other
than 200 and 503 are counted as unexpected and written to OUT.unexpected.
"""

from __future__ import annotations

import sys
import time
from collections import Counter
from pathlib import Path

import httpx


def main(argv: list[str]) -> None:
    base, token, out, seconds = argv[0], argv[1], Path(argv[2]), float(argv[3])
    tag = out.stem
    headers = {"auth-token": token, "content-type": "application/json"}
    statuses: Counter[str] = Counter()
    deadline = time.monotonic() + seconds
    stop = out.with_suffix(".stop")
    n = 0
    with httpx.Client(headers=headers, timeout=10) as c, open(out, "a") as acks:
        while time.monotonic() < deadline and not stop.exists():
            n += 1
            track = {"userId": f"{tag}-u{n % 17}", "event": "Crash Load", "properties": {"n": n}}
            try:
                if n % 4 == 0:
                    batch = [
                        {**track, "type": "track", "properties": {"n": n, "i": i}}
                        for i in range(10)
                    ]
                    r = c.post(f"{base}/batch", json={"batch": batch})
                    ids = r.json()["eventIds"] if r.status_code == 200 else []
                else:
                    r = c.post(f"{base}/track", json=track)
                    ids = [r.json()["eventId"]] if r.status_code == 200 else []
            except (httpx.HTTPError, ValueError):
                statuses["connection error"] += 1
                time.sleep(0.02)
                continue
            statuses[str(r.status_code)] += 1
            if ids:
                acks.write("".join(f"{i}\n" for i in ids))
                acks.flush()
            elif r.status_code != 503:
                with open(out.with_suffix(".unexpected"), "a") as bad:
                    bad.write(f"{r.status_code} {r.text[:300]}\n")
    out.with_suffix(".statuses").write_text(
        "".join(f"{k} {v}\n" for k, v in sorted(statuses.items()))
    )


if __name__ == "__main__":
    main(sys.argv[1:])
