"""The shared servers of the distributed topology, started on this machine for a laptop trial,
the tests and the bench: a real PostgreSQL (its own data dir, loopback only) and an
S3-compatible server (moto's server mode), each on a free port, stopped by PID.

PostgreSQL refuses to run as root: as root, the cluster belongs to the `mallard-pg` system user
(created when missing); otherwise it runs as the caller.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from mallard.processes import stop_groups, terminate_group

PG_USER = "mallard-pg"  # the system user that owns the cluster when Mallard runs as root
PG_ROLE = "mallard"  # the database role Mallard connects as (trust on loopback only)
S3_BUCKET = "mallard"
# moto keeps any key pair; a real deployment sets its own in the environment.
S3_KEYS = {"AWS_ACCESS_KEY_ID": "mallard-local", "AWS_SECRET_ACCESS_KEY": "mallard-local-secret"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _pg_bin() -> Path:
    for d in sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True):
        if (d / "postgres").exists():
            return d
    found = shutil.which("postgres")
    if found:
        return Path(found).parent
    raise RuntimeError("PostgreSQL is not installed: apt-get install postgresql")


def _as_pg_user() -> list[str]:
    if os.geteuid() != 0:
        return []
    try:
        pwd.getpwnam(PG_USER)
    except KeyError:
        subprocess.run(
            ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", PG_USER],
            check=True,
        )
    return ["runuser", "-u", PG_USER, "--"]


def _reachable(folder: Path) -> bool:
    """Whether the PostgreSQL user can pass through every folder above this one."""
    for parent in folder.resolve().parents:
        if parent.exists() and not parent.stat().st_mode & 0o001:
            return False
    return True


def _wait(
    ready: object, proc: subprocess.Popen[bytes], what: str, log: Path, timeout: float
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}: {log.read_text()[-2000:]}")
        if callable(ready) and ready():
            return
        time.sleep(0.1)
    raise RuntimeError(f"{what} not ready within {timeout:.0f} s: {log.read_text()[-2000:]}")


@dataclass
class Cluster:
    """PostgreSQL and the S3 server under `root`; `env()` is what every Mallard process of the
    deployment gets (keys included: they are moto's, good for nothing else)."""

    root: Path
    pg_port: int = 0
    s3_port: int = 0
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    @property
    def pg_dsn(self) -> str:
        return f"host=127.0.0.1 port={self.pg_port} user={PG_ROLE}"

    def env(self) -> dict[str, str]:
        return {
            "MALLARD_LAKE_CATALOG": f"postgres:dbname=lake {self.pg_dsn}",
            "MALLARD_LAKE_DATA_URL": f"s3://{S3_BUCKET}/lake/",
            "MALLARD_LANDING_URL": f"s3://{S3_BUCKET}/landing/",
            "AWS_ENDPOINT_URL": f"http://127.0.0.1:{self.s3_port}",
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_REGION": "us-east-1",
            "MALLARD_S3_URL_STYLE": "path",
            "MALLARD_DAGSTER_PG_URL": (
                f"postgresql+psycopg2://{PG_ROLE}@127.0.0.1:{self.pg_port}/dagster"
            ),
            **S3_KEYS,
        }

    def start(self) -> Cluster:
        self.root.mkdir(parents=True, exist_ok=True)
        try:
            self._start_postgres()
            self._start_s3()
        except BaseException:
            self.stop()
            raise
        return self

    @property
    def pg_dir(self) -> Path:
        """The cluster's folder: under root, unless root is where the PostgreSQL user cannot go
        (as root, a folder inside another user's private one, such as pytest's temp dirs): then
        a folder of its own in the system's temp dir, named after root."""
        own = self.root / "postgres"
        if os.geteuid() != 0 or _reachable(own):
            return own
        digest = hashlib.sha256(str(self.root).encode()).hexdigest()[:12]
        return Path(tempfile.gettempdir()) / f"mallard-pg-{digest}"

    def _start_postgres(self) -> None:
        runas = _as_pg_user()
        pg = self.pg_dir
        data, sock = pg / "data", pg / "socket"
        sock.mkdir(parents=True, exist_ok=True)
        if runas:
            subprocess.run(["chown", "-R", PG_USER, str(pg)], check=True)
            os.chmod(pg, 0o700)
        bin_dir = _pg_bin()
        if not (data / "PG_VERSION").exists():
            init = subprocess.run(
                [*runas, str(bin_dir / "initdb"), "-D", str(data), "-U", PG_ROLE]
                + ["--auth=trust", "-E", "UTF8", "--no-instructions"],
                capture_output=True,
                text=True,
            )
            if init.returncode:
                raise RuntimeError(f"initdb failed: {init.stderr[-2000:]}")
        self.pg_port = self.pg_port or free_port()
        log = pg / "postgres.log"
        with open(log, "ab") as out:
            proc = subprocess.Popen(
                [*runas, str(bin_dir / "postgres"), "-D", str(data), "-h", "127.0.0.1"]
                + ["-p", str(self.pg_port), "-k", str(sock), "-c", "max_connections=200"],
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.procs["postgres"] = proc

        def ready() -> bool:
            return (
                subprocess.run(
                    [str(bin_dir / "pg_isready"), "-h", "127.0.0.1", "-p", str(self.pg_port)],
                    capture_output=True,
                ).returncode
                == 0
            )

        _wait(ready, proc, "postgres", log, 60)
        for db in ("lake", "dagster"):
            self.psql(
                f"select 'create database {db}' where not exists"
                f" (select from pg_database where datname = '{db}') \\gexec"
            )

    def psql(self, sql: str, db: str = "postgres") -> str:
        out = subprocess.run(
            [str(_pg_bin() / "psql"), "-h", "127.0.0.1", "-p", str(self.pg_port), "-U", PG_ROLE]
            + ["-d", db, "-v", "ON_ERROR_STOP=1", "-At"],
            input=sql,
            capture_output=True,
            text=True,
            check=True,
        )
        return out.stdout

    def _start_s3(self) -> None:
        self.s3_port = self.s3_port or free_port()
        log = self.root / "s3.log"
        moto = Path(sys.executable).parent / "moto_server"
        with open(log, "ab") as out:
            proc = subprocess.Popen(
                [str(moto), "-H", "127.0.0.1", "-p", str(self.s3_port)],
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.procs["s3"] = proc

        def ready() -> bool:
            with (
                contextlib.suppress(OSError),
                socket.create_connection(("127.0.0.1", self.s3_port), timeout=0.5),
            ):
                return True
            return False

        _wait(ready, proc, "moto_server", log, 60)
        fs = self.s3()
        fs.create_dir(S3_BUCKET)

    def s3(self):  # type: ignore[no-untyped-def]
        from pyarrow import fs

        return fs.S3FileSystem(
            access_key=S3_KEYS["AWS_ACCESS_KEY_ID"],
            secret_key=S3_KEYS["AWS_SECRET_ACCESS_KEY"],
            scheme="http",
            endpoint_override=f"127.0.0.1:{self.s3_port}",
            region="us-east-1",
            allow_bucket_creation=True,
        )

    def s3_keys(self, prefix: str = "") -> list[str]:
        """Every object under `bucket/prefix`, as bucket-relative keys."""
        from pyarrow import fs

        sel = fs.FileSelector(
            f"{S3_BUCKET}/{prefix}".rstrip("/"), recursive=True, allow_not_found=True
        )
        return sorted(
            i.path.removeprefix(f"{S3_BUCKET}/")
            for i in self.s3().get_file_info(sel)
            if i.type == fs.FileType.File
        )

    def _postmaster_pid(self) -> int | None:
        with contextlib.suppress(OSError, ValueError, IndexError):
            pid_file = self.pg_dir / "data" / "postmaster.pid"
            return int(pid_file.read_text().split()[0])
        return None

    def _terminate(self, proc: subprocess.Popen[bytes]) -> None:
        # postgres: SIGINT to the postmaster is its fast shutdown (sessions ended, a
        # checkpoint, exit); runuser, when it runs it, exits with it.
        pid = self._postmaster_pid() if proc is self.procs.get("postgres") else None
        if pid is None:
            terminate_group(proc)
        else:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGINT)

    def stop(self) -> None:
        stop_groups(list(self.procs.values()), 30, self._terminate)
        self.procs.clear()
        # A cluster outside root (see pg_dir) goes with its servers: nothing else finds it.
        if self.root not in self.pg_dir.parents:
            shutil.rmtree(self.pg_dir, ignore_errors=True)
