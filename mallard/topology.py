"""The distributed topology on one machine: PostgreSQL and an S3 server (mallard/cluster.py),
collectors and API replicas (`mallard serve` each, its own collector id and port), the
pipeline watcher and Dagster, every one a process of its own with its PID kept and its log in
<root>/run. What `mallard up --distributed`, tests/distributed and bench/distributed.py start.

The lake (catalog on PostgreSQL, files on S3), the landing files (S3, a prefix per collector)
and Dagster's instance (PostgreSQL) are shared through the servers. The data dir holds the
rest (control store, regulations, preferences journal, outbox, secret): the processes here
share it as a folder, as machines would share it over a network file system (docs/deploy.md).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from mallard.cluster import Cluster, free_port
from mallard.paths import DataPaths
from mallard.processes import stop_groups


def dagster_storage_yaml(existing: str) -> str:
    """dagster.yaml with the instance's storage on PostgreSQL (the URL from the environment
    variable MALLARD_DAGSTER_PG_URL, read by Dagster itself), anything else kept."""
    import yaml

    cfg: Any = yaml.safe_load(existing) if existing.strip() else {}
    if not isinstance(cfg, dict):
        cfg = {}
    cfg["storage"] = {"postgres": {"postgres_url": {"env": "MALLARD_DAGSTER_PG_URL"}}}
    return str(yaml.safe_dump(cfg, sort_keys=False))


@dataclass
class Served:
    name: str
    port: int
    collector_id: str
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@dataclass
class Deployment:
    """Everything under `root`: servers/ (PostgreSQL, S3), data/ (the shared data dir), run/."""

    root: Path
    collectors: int = 2
    replicas: int = 2
    extra_env: dict[str, str] = field(default_factory=dict)
    cluster: Cluster = field(init=False)
    served: dict[str, Served] = field(default_factory=dict)
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    creds: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.root = self.root.resolve()
        self.cluster = Cluster(self.root / "servers")

    @property
    def paths(self) -> DataPaths:
        return DataPaths(self.root / "data")

    @property
    def run_dir(self) -> Path:
        return self.root / "run"

    def env(self) -> dict[str, str]:
        from mallard.offline import TELEMETRY_OFF

        return {
            **os.environ,
            **self.cluster.env(),
            "MALLARD_DATA_DIR": str(self.paths.root),
            "DAGSTER_HOME": str(self.paths.dagster_home),
            **TELEMETRY_OFF,
            **self.extra_env,
        }

    def mallard(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """A mallard command in the deployment's environment, waited for."""
        out = subprocess.run(
            [sys.executable, "-m", "mallard.cli", *args],
            env=self.env(),
            capture_output=True,
            text=True,
        )
        if check and out.returncode:
            raise RuntimeError(f"mallard {' '.join(args)}: {out.returncode}\n{out.stderr[-3000:]}")
        return out

    def start(self, watcher: bool = False, dagster_port: int | None = None) -> Deployment:
        """The servers, the data dir, the collectors and replicas; with `watcher` the pipeline
        watcher, with `dagster_port` the Dagster UI (there) and daemon."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        try:
            self.cluster.start()
            self.paths.dagster_home.mkdir(parents=True, exist_ok=True)
            cfg = self.paths.dagster_home / "dagster.yaml"
            cfg.write_text(dagster_storage_yaml(cfg.read_text() if cfg.exists() else ""))
            self.creds = json.loads(self.mallard("init", "--json").stdout)
            for i in range(1, self.collectors + 1):
                self.served[f"collector-{i}"] = Served(f"collector-{i}", free_port(), f"c{i}")
            for i in range(1, self.replicas + 1):
                self.served[f"api-{i}"] = Served(f"api-{i}", free_port(), f"a{i}")
            for name in self.served:
                self.start_served(name, wait=False)
            for name in self.served:
                self.wait_served(name)
            if watcher:
                self.spawn("pipeline-watch", ["pipeline", "run", "--watch"])
            if dagster_port is not None:
                self.start_dagster(dagster_port)
        except BaseException:
            self.stop()
            raise
        return self

    def spawn(self, name: str, args: list[str], extra: dict[str, str] | None = None) -> Any:
        log = open(self.run_dir / f"{name}.log", "ab")  # noqa: SIM115 - owned by the child
        cmd = args if args[0].startswith("/") else [sys.executable, "-m", "mallard.cli", *args]
        proc = subprocess.Popen(
            cmd,
            env={**self.env(), **(extra or {})},
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        (self.run_dir / f"{name}.pid").write_text(str(proc.pid))
        self.procs[name] = proc
        return proc

    def start_served(self, name: str, wait: bool = True) -> Served:
        s = self.served[name]
        s.proc = self.spawn(
            name,
            ["serve", "--port", str(s.port)],
            {"MALLARD_COLLECTOR_ID": s.collector_id, "MALLARD_PORT": str(s.port)},
        )
        if wait:
            self.wait_served(name)
        return s

    def wait_served(self, name: str, timeout: float = 120) -> None:
        s = self.served[name]
        assert s.proc is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if s.proc.poll() is not None:
                log = (self.run_dir / f"{name}.log").read_text()[-3000:]
                raise RuntimeError(f"{name} exited with {s.proc.returncode}: {log}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{s.url}/health", timeout=2).status_code == 200:
                    return
            time.sleep(0.2)
        raise RuntimeError(f"{name} did not answer within {timeout:.0f} s")

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        """Signal one process's group (a served process's roller worker too), and wait."""
        proc = self.procs[name]
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        proc.wait(60)

    def start_dagster(self, port: int) -> None:
        bin_dir = Path(sys.executable).parent
        defs = ["-m", "orchestration.definitions"]
        self.spawn(
            "dagster-webserver",
            [str(bin_dir / "dagster-webserver"), *defs, "-h", "127.0.0.1", "-p", str(port)],
        )
        self.spawn("dagster-daemon", [str(bin_dir / "dagster-daemon"), "run", *defs])
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"http://127.0.0.1:{port}/server_info", timeout=2).is_success:
                    return
            if self.procs["dagster-webserver"].poll() is not None:
                raise RuntimeError("dagster-webserver exited; see run/dagster-webserver.log")
            time.sleep(0.5)
        raise RuntimeError("dagster-webserver did not answer within 180 s")

    def stop(self) -> None:
        stop_groups(list(reversed(self.procs.values())), 30)
        for name in self.procs:
            (self.run_dir / f"{name}.pid").unlink(missing_ok=True)
        self.procs.clear()
        self.cluster.stop()
