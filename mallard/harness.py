"""Real Mallard processes for tests and benchmarks: the CLI and `mallard serve` on a free port.

Tests (tests/conftest.py) and benchmarks (bench/) both start the server this way, so both
exercise exactly what a user runs.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

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


def init_data_dir(data_dir: Path) -> dict[str, str]:
    """`mallard init --json`: the demo tenant's ids, token and writeKey."""
    out = mallard("init", "--json", data_dir=data_dir)
    return dict(json.loads(out.stdout))


def wait_http(url: str, proc: subprocess.Popen[bytes], log: Path, timeout: float) -> None:
    """Wait until `url` answers 200, failing early (with the log) if the process exits."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"process exited {proc.returncode}:\n{log.read_text()}")
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    raise AssertionError(f"{url} not ready in {timeout}s:\n{log.read_text()}")


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
    def base_path(self) -> str:
        return self.base[len(self.url) :]

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
        wait_http(f"{self.url}/health", self.proc, self.log, timeout)

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
        """One `mallard pipeline run` with the server's settings (config dir, SMTP, ...)."""
        return mallard("pipeline", "run", data_dir=self.data_dir, env=self.env)

    def post(self, action: str, body: Any, **kw: Any) -> httpx.Response:
        return httpx.post(
            f"{self.base}/{action}", json=body, headers=self.headers, timeout=30, **kw
        )

    def get(self, path: str, **kw: Any) -> httpx.Response:
        return httpx.get(f"{self.base}/{path}", headers=self.headers, timeout=30, **kw)
