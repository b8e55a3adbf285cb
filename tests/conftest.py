"""Shared fixtures: a real `mallard serve` subprocess on a free loopback port, and the CLI."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def mallard(
    *args: str,
    data_dir: Path,
    check: bool = True,
    timeout: float = 600,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run the real CLI as a subprocess."""
    full_env = {**os.environ, "MALLARD_DATA_DIR": str(data_dir), "DO_NOT_TRACK": "1", **(env or {})}
    proc = subprocess.run(
        [sys.executable, "-m", "mallard.cli", *args],
        cwd=REPO,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if check and proc.returncode != 0:
        raise AssertionError(
            f"mallard {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
        )
    return proc


@dataclass
class Server:
    """A running `mallard serve` and the demo credentials of its data dir."""

    data_dir: Path
    port: int
    creds: dict[str, str]
    env: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen[bytes] | None = None
    log: Path | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def base(self) -> str:
        """`{base_url}/track/{clientId}/{accountId}/{BRANDID}/v1` of the demo tenant."""
        c = self.creds
        return f"{self.url}/track/{c['clientId']}/{c['accountId']}/{c['brandId']}/v1"

    @property
    def headers(self) -> dict[str, str]:
        return {"auth-token": self.creds["token"], "content-type": "application/json"}

    def start(self, timeout: float = 60) -> None:
        self.log = self.data_dir / f"serve-{self.port}.log"
        full_env = {**os.environ, "MALLARD_DATA_DIR": str(self.data_dir), **self.env}
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "mallard.cli", "serve", "--port", str(self.port)],
                cwd=REPO,
                env=full_env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(
                    f"server exited {self.proc.returncode}:\n{self.log.read_text()}"
                )
            try:
                if httpx.get(f"{self.url}/health", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        raise AssertionError(f"server not ready in {timeout}s:\n{self.log.read_text()}")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30) -> int | None:
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else None
        self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait(timeout)

    def kill(self) -> None:
        self.stop(signal.SIGKILL)

    def pipeline(self) -> subprocess.CompletedProcess[str]:
        return mallard("pipeline", "run", data_dir=self.data_dir)

    def post(self, action: str, body: Any, **kw: Any) -> httpx.Response:
        return httpx.post(
            f"{self.base}/{action}", json=body, headers=self.headers, timeout=30, **kw
        )

    def get(self, path: str, **kw: Any) -> httpx.Response:
        return httpx.get(f"{self.base}/{path}", headers=self.headers, timeout=30, **kw)


def init_data_dir(data_dir: Path) -> dict[str, str]:
    out = mallard("init", "--json", data_dir=data_dir)
    return json.loads(out.stdout)


@pytest.fixture
def server_factory(tmp_path: Path) -> Iterator[Any]:
    """Start (and always stop) one or more servers on fresh data dirs."""
    started: list[Server] = []

    def make(data_dir: Path | None = None, env: dict[str, str] | None = None) -> Server:
        env = {"MALLARD_ROLL_INTERVAL_S": "0.3", **(env or {})}
        d = data_dir or tmp_path / f"data{len(started)}"
        creds = init_data_dir(d)
        srv = Server(d, free_port(), creds, env=env)
        srv.start()
        started.append(srv)
        return srv

    yield make
    for srv in started:
        srv.stop()


@pytest.fixture
def server(server_factory: Any) -> Server:
    return server_factory()


def landed_event_ids(data_dir: Path) -> list[str]:
    """Every eventId in the landing files (duplicates kept, so tests can count them)."""
    import pyarrow.parquet as pq

    ids: list[str] = []
    for f in sorted((data_dir / "landing").glob("date=*/*.parquet")):
        ids += pq.read_table(f, columns=["event_id"]).column("event_id").to_pylist()
    return ids


def wait_landed(data_dir: Path, event_ids: list[str], timeout: float = 30) -> None:
    """Wait until the collector has rolled these acknowledged messages into landing files."""
    deadline = time.monotonic() + timeout
    want = set(event_ids)
    while time.monotonic() < deadline:
        if want <= set(landed_event_ids(data_dir)):
            return
        time.sleep(0.1)
    missing = want - set(landed_event_ids(data_dir))
    raise AssertionError(f"{len(missing)} acknowledged messages not landed after {timeout}s")
