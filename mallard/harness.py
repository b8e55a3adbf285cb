"""Real Mallard processes for tests and benchmarks: the CLI and `mallard serve` on a free port.

Tests (tests/conftest.py) and benchmarks (bench/) both start the server this way, so both
exercise exactly what a user runs. The passes of a data dir (`pipeline_pass`, `Server.pipeline`)
run in one warm process, as `mallard pipeline run --watch` runs them: the same `mallard pipeline
run` code, a new pass each time, without each pass paying for starting Python, Dagster and dbt.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import gc
import io
import json
import os
import select
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from mallard.offline import TELEMETRY_OFF

REPO = Path(__file__).resolve().parents[1]
# The kind of pass `mallard pipeline run` runs (orchestration/window.py PassKind).
FULL = "full"


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
    full_env = {**os.environ, "MALLARD_DATA_DIR": str(data_dir), **TELEMETRY_OFF, **(env or {})}
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


class PassWorker:
    """`mallard pipeline run`, pass after pass, in one process (`python -m mallard.harness`):
    each `run` is `mallard.cli.main(["pipeline", "run"])` with its output captured, answered
    as the CompletedProcess the CLI would give. The process ends when closed, or when its
    parent goes (its stdin closes)."""

    def __init__(self, data_dir: Path, env: dict[str, str]) -> None:
        self.env = dict(env)
        self.lock = threading.Lock()
        self.log = data_dir / f"passes-{os.getpid()}-{id(self)}.log"
        read, write = os.pipe()
        full_env = {**os.environ, "MALLARD_DATA_DIR": str(data_dir), **TELEMETRY_OFF, **env}
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "mallard.harness", str(write)],
                cwd=REPO,
                env=full_env,
                stdin=subprocess.PIPE,
                stdout=log,
                stderr=subprocess.STDOUT,
                pass_fds=(write,),
            )
        os.close(write)
        self.answers = os.fdopen(read, "rb")

    def run(self, timeout: float = 600, kind: str = FULL) -> subprocess.CompletedProcess[str]:
        args = ["mallard", "pipeline", "run"]
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"pass {kind}\n".encode())
        self.proc.stdin.flush()
        ready, _, _ = select.select([self.answers], [], [], timeout)
        if not ready:
            self.close()
            raise subprocess.TimeoutExpired(args, timeout)
        line = self.answers.readline()
        if not line:  # the process died mid-pass
            code = self.proc.wait()
            return subprocess.CompletedProcess(args, code or 1, "", self.log.read_text())
        answer = json.loads(line)
        return subprocess.CompletedProcess(
            args, answer["returncode"], answer["stdout"], answer["stderr"]
        )

    def alive(self) -> bool:
        return self.proc.poll() is None

    def close(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(OSError):
                assert self.proc.stdin is not None
                self.proc.stdin.close()
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.answers.close()


_PASSES: dict[Path, PassWorker] = {}
_PASSES_LOCK = threading.Lock()


def pipeline_pass(
    data_dir: Path,
    env: dict[str, str] | None = None,
    check: bool = True,
    timeout: float = 600,
    kind: str = FULL,
) -> subprocess.CompletedProcess[str]:
    """One `mallard pipeline run` of the data dir with `env`, in the data dir's warm pass
    process (started on the first pass, again when `env` changed); a pass asked for while
    another of the data dir runs gets a process of its own, as two commands would. `kind`
    served: a pass of that kind, as the watcher runs them (`mallard.cli.run_pass`; the kind that
    can run, orchestration.pipeline.pass_kind), in the warm process only."""
    env, busy = dict(env or {}), False
    with _PASSES_LOCK:
        worker = _PASSES.get(data_dir.resolve())
        if worker is not None and worker.lock.acquire(blocking=False):
            if not worker.alive() or worker.env != env:
                worker.lock.release()
                worker.close()
                worker = None
        elif worker is not None:  # busy with a pass
            worker = None
            busy = True
        if worker is None and not busy:
            worker = _PASSES[data_dir.resolve()] = PassWorker(data_dir, env)
            worker.lock.acquire()
    if worker is None:
        assert kind == FULL, f"a {kind} pass runs in the data dir's pass process, which is busy"
        return mallard("pipeline", "run", data_dir=data_dir, env=env, check=check, timeout=timeout)
    try:
        out = worker.run(timeout, kind)
    finally:
        worker.lock.release()
    if check and out.returncode != 0:
        raise AssertionError(
            f"mallard pipeline run failed ({out.returncode}):\n{out.stdout}\n{out.stderr}"
        )
    return out


def close_passes(data_dir: Path | None = None) -> None:
    """Ends the warm pass process of the data dir (of every data dir with None)."""
    with _PASSES_LOCK:
        workers = [
            _PASSES.pop(d) for d in list(_PASSES) if data_dir is None or d == data_dir.resolve()
        ]
    for worker in workers:
        worker.close()


atexit.register(close_passes)


def _serve_passes(answer_fd: int) -> None:
    """The loop of a PassWorker's process: a pass per line on stdin, its answer a JSON line."""
    from mallard.cli import main, run_pass

    answers = os.fdopen(answer_fd, "w")
    for line in sys.stdin:
        _, kind = line.split()
        out = io.StringIO()
        # stderr at the descriptor, as a process's stderr is (faulthandler needs a real file).
        with tempfile.TemporaryFile() as err:
            saved = os.dup(2)
            os.dup2(err.fileno(), 2)
            try:
                with contextlib.redirect_stdout(out):
                    if kind == FULL:
                        code = main(["pipeline", "run"])
                    else:
                        code = run_pass(Path(os.environ["MALLARD_DATA_DIR"]), kind)
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else 1
            except BaseException:
                traceback.print_exc()
                code = 1
            finally:
                sys.stderr.flush()
                os.dup2(saved, 2)
                os.close(saved)
            err.seek(0)
            stderr = err.read().decode(errors="replace")
        gc.unfreeze()  # main freezes what a process leaves at exit; this one goes on
        answer = {"returncode": code, "stdout": out.getvalue(), "stderr": stderr}
        answers.write(json.dumps(answer) + "\n")
        answers.flush()


def init_data_dir(data_dir: Path) -> dict[str, str]:
    """`mallard init --json`: the demo tenant's ids, token and writeKey."""
    out = mallard("init", "--json", data_dir=data_dir)
    return dict(json.loads(out.stdout))


CREDENTIALS = "demo-credentials.json"


# The catalog tables that name files; each path must be relative to the lake's data path.
PATH_TABLES = (
    "ducklake_data_file",
    "ducklake_delete_file",
    "ducklake_schema",
    "ducklake_table",
    "ducklake_files_scheduled_for_deletion",
)


def relocate_catalog(src: Path, dst: Path) -> None:
    """Point the copied data dir `dst`'s catalog at its own files (DuckLake keeps the data path
    it was made with and refuses another; every file path in it is relative to that path), and
    its demo credentials at itself."""
    catalog = dst / "lake" / "catalog.sqlite"
    if catalog.exists():
        with contextlib.closing(sqlite3.connect(catalog)) as con, con:
            for table in PATH_TABLES:
                n = con.execute(f"select count(*) from {table} where not path_is_relative")
                if (found := n.fetchone()) and found[0]:
                    raise RuntimeError(f"{table} names {found[0]} files by absolute path")
            data_path = con.execute(
                "select value from ducklake_metadata where key = 'data_path'"
            ).fetchall()
            made_in = (src / "lake" / "files").resolve()
            if len(data_path) != 1 or Path(data_path[0][0]).resolve() != made_in:
                raise RuntimeError(f"unexpected data_path in the catalog: {data_path}")
            con.execute(
                "update ducklake_metadata set value = ? where key = 'data_path'",
                [f"{dst}/lake/files/"],
            )
    creds = dst / CREDENTIALS
    if creds.exists():
        doc = json.loads(creds.read_text())
        creds.write_text(json.dumps({**doc, "dataDir": str(dst)}))


def copy_data_dir(src: Path, dst: Path) -> dict[str, str]:
    """A copy of a data dir whose server and passes are stopped, answering its demo credentials
    as `init_data_dir` does (empty without them)."""
    shutil.copytree(src, dst, symlinks=True)
    relocate_catalog(src, dst)
    creds = dst / CREDENTIALS
    return dict(json.loads(creds.read_text())) if creds.exists() else {}


def built_data_dir(data_dir: Path, template: Path) -> dict[str, str]:
    """A data dir as `mallard init` and a first pass on its empty lake leave it: a copy of
    `template`, made here once (the first caller builds it under an exclusive lock; every other
    process waits for it, then copies). A first pass on a fresh lake creates every table and runs
    every dbt test once for the project's definition (orchestration/window.py full_tests_due); a
    copy's first pass continues from there, as every later pass of a data dir does. A data dir
    initialised already is left as it is."""
    if (data_dir / CREDENTIALS).exists():  # initialised already: as `mallard init` again
        return dict(json.loads((data_dir / CREDENTIALS).read_text()))
    ready = template / ".built"
    template.parent.mkdir(parents=True, exist_ok=True)
    with open(template.parent / f"{template.name}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not ready.exists():
            shutil.rmtree(template, ignore_errors=True)
            init_data_dir(template)
            mallard("pipeline", "run", data_dir=template)
            for log in template.glob("passes-*.log"):
                log.unlink()
            ready.touch()
    creds = copy_data_dir(template, data_dir)
    (data_dir / ".built").unlink()
    return creds


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


class Endpoint:
    """The demo tenant's addresses and headers on a server at `port` with the credentials
    `creds` (what `mallard init --json` prints), for whatever holds both."""

    port: int
    creds: dict[str, str]

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


@dataclass
class Server(Endpoint):
    """A running `mallard serve` and the demo credentials of its data dir."""

    data_dir: Path
    port: int
    creds: dict[str, str]
    env: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen[bytes] | None = None
    log: Path | None = None

    def start(self, timeout: float = 120) -> None:
        """Start `mallard serve` and wait until /health answers; a server not ready in time is
        stopped before the error is raised, so no caller is left with a stray process."""
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
        try:
            wait_http(f"{self.url}/health", self.proc, self.log, timeout)
        except BaseException:
            self.stop()
            raise

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30) -> int | None:
        close_passes(self.data_dir)
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
        return pipeline_pass(self.data_dir, self.env)

    def post(self, action: str, body: Any, **kw: Any) -> httpx.Response:
        return httpx.post(
            f"{self.base}/{action}", json=body, headers=self.headers, timeout=30, **kw
        )

    def get(self, path: str, **kw: Any) -> httpx.Response:
        return httpx.get(f"{self.base}/{path}", headers=self.headers, timeout=30, **kw)

    def dropped(self, event_id: str) -> str | None:
        """The list that dropped this acknowledged call (`suppress`, `no_track`), None for a
        call that was kept: what `GET events/{eventId}/status` tells a token holder."""
        r = self.get(f"events/{event_id}/status")
        assert r.status_code == 200, r.text
        body = r.json()
        return str(body["reason"]) if body["status"] == "dropped" else None

    def wait_regulation(self, regulation_id: str, timeout: float = 300) -> dict[str, Any]:
        """The regulation's resource once it is finished or failed. Not done in time: an error
        with the end of the data dir's run log (`run/regulations.log`), where every run of a
        regulation writes each step it finished and, asked here, the stacks of a run still
        live, so a stuck or slow step is named in the failure."""
        deadline = time.monotonic() + timeout
        body: dict[str, Any] = {"status": "not asked"}
        while time.monotonic() < deadline:
            r = self.get(f"regulations/{regulation_id}")
            assert r.status_code == 200, r.text
            body = r.json()
            if body["status"] in ("finished", "failed"):
                return body
            time.sleep(0.3)
        from mallard.paths import DataPaths
        from mallard.regulation_runs import log_path, pid_path

        paths = DataPaths(self.data_dir)
        with contextlib.suppress(OSError, ValueError):
            # Every mallard command dumps its threads' stacks to its log on SIGUSR1.
            os.kill(int(pid_path(paths, regulation_id).read_text()), signal.SIGUSR1)
            time.sleep(1)
        log = log_path(paths)
        tail = log.read_text(errors="replace")[-12000:] if log.exists() else "(no run log)"
        raise AssertionError(
            f"regulation {regulation_id} not done after {timeout:.0f} s ({body['status']});"
            f" the end of {log}:\n{tail}"
        )


if __name__ == "__main__":
    _serve_passes(int(sys.argv[1]))
