"""The hostile-input suite's server, its probes and its figures.

One real `mallard serve` for the session (mallard.harness), rate limits lifted so fuzzing sees
the handlers rather than 429, the body deadline short so a slowloris test ends in seconds. A
thread samples the server process's VmRSS throughout; every request the suite sends goes
through `Probe.send`, which counts it and checks the rule every answer keeps: never a 5xx, and
every error JSON with a message. The figures print at the end of the run; httpx's log line
per request does not (`make test-reliability` runs with -s).
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from mallard.harness import REPO, Server, free_port, init_data_dir
from mallard.offline import TELEMETRY_OFF

BODY_TIMEOUT_S = 4.0
HEAD_TIMEOUT_S = 4.0
ENV = {
    "MALLARD_ROLL_INTERVAL_S": "0.3",
    "MALLARD_RATE_PER_SECOND": "1000000",
    "MALLARD_RATE_BURST": "1000000",
    "MALLARD_BODY_TIMEOUT_S": str(BODY_TIMEOUT_S),
    "MALLARD_HEAD_TIMEOUT_S": str(HEAD_TIMEOUT_S),
}


# Another client's latency while an attack runs is compared with the same client's, measured in
# the same run just before the attack: a multiple of that baseline, for the host's speed and
# load, and a floor, so a baseline of a few milliseconds and its jitter do not decide alone.
# The baseline's figure is its p90 after its first calls (a new connection, first use), so that
# one stall of a loaded host among a few dozen calls does not raise the bound tenfold.
LATENCY_FACTOR = 20
LATENCY_FLOOR_S = 1.0
WARMUP_CALLS = 5


def percentile(latencies: list[float], pct: int) -> float:
    """The pct-th percentile (nearest rank) of at least one latency."""
    ordered = sorted(latencies)
    return ordered[max(0, -(-len(ordered) * pct // 100) - 1)]


def check_latency(what: str, baseline: list[float], during: list[float]) -> str:
    """Fails when the p99 of `during` exceeds max(LATENCY_FLOOR_S, LATENCY_FACTOR x the p90 of
    `baseline` after its first WARMUP_CALLS); the figures, in words for FIGURES, either way."""
    settled = baseline[WARMUP_CALLS:]
    assert len(settled) >= 20 and during, f"{what}: {len(settled)} baseline, {len(during)} calls"
    base, under = percentile(settled, 90), percentile(during, 99)
    bound = max(LATENCY_FLOOR_S, LATENCY_FACTOR * base)
    words = (
        f"{what} p99 {under * 1000:.0f} ms during (max {max(during) * 1000:.0f} ms, {len(during)}"
        f" calls); before: p90 {base * 1000:.0f} ms, p99 {percentile(settled, 99) * 1000:.0f} ms"
        f" ({len(settled)} calls); bound {bound * 1000:.0f} ms"
    )
    print(words)
    assert under <= bound, words
    return words


def pytest_configure(config: pytest.Config) -> None:
    # test_isolation builds the app in-process, and Litestar then sets the root logger to INFO
    # with a handler on stderr: an httpx line per request (thousands, printed by -s) would
    # bury the figures.
    logging.getLogger("httpx").setLevel(logging.WARNING)


def start_loadgens(
    server: Server, outs: list[Path], seconds: float
) -> list[subprocess.Popen[bytes]]:
    """A tests/reliability/loadgen.py process per file of `outs`, posting to the server's demo
    tenant for `seconds` (or until `<out>.stop` exists), each ack appended to its file."""
    env = {**os.environ, **TELEMETRY_OFF}
    return [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.reliability.loadgen",
                server.base,
                server.creds["token"],
                str(out),
                str(seconds),
            ],
            cwd=REPO,
            env=env,
        )
        for out in outs
    ]


def rss_mib(pid: int) -> float:
    """VmRSS of a process, MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for {pid}")


class RssSampler:
    """Samples a process's RSS every 20 ms on a thread: the peak since start or since mark()."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.start_mib = rss_mib(pid)
        self.peak_mib = self.start_mib
        self.end_mib = self.start_mib  # the last sample
        self._since_mark = self.start_mib
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="rss-sampler")
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            try:
                now = rss_mib(self.pid)
            except (OSError, AssertionError):
                return
            self.end_mib = now
            self.peak_mib = max(self.peak_mib, now)
            self._since_mark = max(self._since_mark, now)

    def mark(self) -> float:
        """Start a new window; returns the RSS now."""
        now = rss_mib(self.pid)
        self._since_mark = now
        return now

    def peak_since_mark(self) -> float:
        time.sleep(0.05)  # one more sample
        return max(self._since_mark, rss_mib(self.pid))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(2)


@dataclass
class Figures:
    requests: int = 0
    statuses: Counter[int] = field(default_factory=Counter)
    by_scenario: Counter[str] = field(default_factory=Counter)
    accepted: int = 0
    landed: int = 0
    peak_rss_mib: float = 0.0
    start_rss_mib: float = 0.0
    scenario_peaks: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    started: float = field(default_factory=time.monotonic)

    def lines(self) -> list[str]:
        if not self.requests:
            return self.notes
        statuses = ", ".join(f"{s}: {n}" for s, n in sorted(self.statuses.items()))
        out = [
            f"requests sent: {self.requests} in {time.monotonic() - self.started:.1f} s",
            f"statuses: {statuses}",
            f"accepted messages checked in landing files: {self.landed} of {self.accepted}",
            f"server RSS: {self.start_rss_mib:.0f} MiB at start, peak {self.peak_rss_mib:.0f} MiB",
        ]
        out += [f"  {name}: peak {mib:.0f} MiB" for name, mib in self.scenario_peaks.items()]
        out += [f"  {name}: {n} requests" for name, n in sorted(self.by_scenario.items())]
        return out + self.notes


FIGURES = Figures()


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if FIGURES.requests or FIGURES.notes:
        terminalreporter.section("reliability: figures")
        for line in FIGURES.lines():
            terminalreporter.write_line(line)


def error_problem(status: int, content_type: str, content: bytes) -> str | None:
    """Why an answer breaks the rule (a 5xx, or an error that is not JSON with a message)."""
    text = content[:300].decode(errors="replace")
    if status >= 500:
        return f"{status}: {text}"
    if status < 400:
        return None
    if not content_type.startswith("application/json"):
        return f"{status} with content-type {content_type!r}: {text!r}"
    try:
        body = json.loads(content)
    except ValueError:
        return f"{status} with a body that is not JSON: {text!r}"
    message = None
    if isinstance(body, dict):
        error = body.get("error")
        message = error.get("message") if isinstance(error, dict) else body.get("message")
    if not isinstance(message, str) or not message:
        return f"{status} without an error message: {text!r}"
    return None


@dataclass
class Probe:
    """The session's server, its credentials and the counted, checked way to send to it."""

    server: Server
    rss: RssSampler
    client: httpx.Client

    @property
    def pid(self) -> int:
        assert self.server.proc is not None
        return self.server.proc.pid

    @property
    def write_key(self) -> str:
        return self.server.creds["writeKey"]

    def send(
        self, method: str, path: str, scenario: str, *, content: bytes | None = None, **kw: Any
    ) -> httpx.Response:
        """One request, counted; fails on a 5xx or an error that is not JSON with a message."""
        url = path if path.startswith("http") else self.server.url + path
        r = self.client.request(method, url, content=content, **kw)
        FIGURES.requests += 1
        FIGURES.statuses[r.status_code] += 1
        FIGURES.by_scenario[scenario] += 1
        problem = error_problem(r.status_code, r.headers.get("content-type", ""), r.content)
        assert problem is None, f"{scenario}: {method} {path}: {problem}"
        return r

    def healthy(self, timeout: float = 2.0) -> float:
        """Seconds /health took; fails if it does not answer 200 within `timeout`."""
        t0 = time.monotonic()
        r = httpx.get(self.server.url + "/health", timeout=timeout)
        assert r.status_code == 200, r.text
        return time.monotonic() - t0

    def peak(self, scenario: str) -> float:
        mib = self.rss.peak_since_mark()
        FIGURES.scenario_peaks[scenario] = max(FIGURES.scenario_peaks.get(scenario, 0), mib)
        FIGURES.peak_rss_mib = max(FIGURES.peak_rss_mib, self.rss.peak_mib)
        return mib


@pytest.fixture(scope="session")
def probe(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Probe]:
    data_dir = tmp_path_factory.mktemp("hostile") / "data"
    creds = init_data_dir(data_dir)
    server = Server(data_dir, free_port(), creds, env=ENV)
    server.start()
    assert server.proc is not None
    rss = RssSampler(server.proc.pid)
    FIGURES.start_rss_mib = rss.start_mib
    client = httpx.Client(timeout=30)
    try:
        yield Probe(server, rss, client)
    finally:
        FIGURES.peak_rss_mib = max(FIGURES.peak_rss_mib, rss.peak_mib)
        rss.stop()
        client.close()
        server.stop()
