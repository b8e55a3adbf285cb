"""`mallard up`, what `make run` runs: server, demo data, a first pass, the pipeline watcher, the
Dagster UI and daemon, and Ctrl-C or SIGTERM stopping them all, saying so. After start-up the
watcher runs the passes in its warm process; the daemon's sensor sees files land and stands back.
A new user's first hour: no alarming warning in a pass's output, no pop-up in the Dagster UI, and
the demo email's preferences link opens the page on the port `mallard up` serves."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import dagster as dg
import httpx
import pytest
from playwright.sync_api import expect

from mallard import mailbox
from mallard.harness import REPO, free_port
from mallard.offline import TELEMETRY_OFF
from mallard.paths import DataPaths
from orchestration.locks import watcher_pid
from tests.browser import chromium

pytestmark = pytest.mark.integration


def _wait(what: str, ok: Callable[[], object], timeout: float, log: Callable[[], str]) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ok():
            return
        time.sleep(0.25)
    raise AssertionError(f"{what} did not happen within {timeout:.0f} s:\n{log()[-6000:]}")


def _sensor_skips(home: Path, sensor: str) -> list[str]:
    """The skip reasons of the daemon's ticks of one sensor."""
    with dg.DagsterInstance.from_config(str(home)) as instance:
        return [
            tick.skip_reason
            for state in instance.all_instigator_state()
            if state.name == sensor
            for tick in instance.get_ticks(state.instigator_origin_id, state.selector_id, limit=50)
            if tick.skip_reason
        ]


CHILDREN = ("mailbox", "server", "pipeline-watch", "dagster-webserver", "dagster-daemon")
# What a normal pass must not print: Python warnings of the components it runs.
WARNING_LINE = re.compile(r"^.*\b\w*(BetaWarning|DeprecationWarning|PreviewWarning)\b.*$", re.M)


def _start(data: Path) -> tuple[subprocess.Popen[str], list[str]]:
    """`mallard up` on free ports, its output collected line by line."""
    port, dagster_port = free_port(), free_port()
    lines: list[str] = []
    proc = subprocess.Popen(
        [sys.executable, "-m", "mallard.cli", "up", "--data-dir", str(data)]
        + ["--port", str(port), "--dagster-port", str(dagster_port)]
        + ["--mailbox-port", str(free_port())],
        cwd=REPO,
        env={
            **{k: v for k, v in os.environ.items() if k != "MALLARD_SMTP_URL"},
            **TELEMETRY_OFF,
            "MALLARD_ROLL_INTERVAL_S": "0.5",
        },
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert proc.stdout is not None
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout or []), daemon=True)
    reader.start()
    return proc, lines


def _stacks(proc: subprocess.Popen[str]) -> str:
    """What a process that does not stop is doing: its threads' stacks (the CLI dumps them on
    SIGUSR1 into its output) and the process tree."""
    proc.send_signal(signal.SIGUSR1)
    time.sleep(3)
    tree = subprocess.run(
        ["ps", "-eo", "pid,ppid,pgid,stat,etime,args", "--forest"], capture_output=True, text=True
    )
    return tree.stdout[-8000:]


def _stop(proc: subprocess.Popen[str], sig: int, paths: DataPaths, log: Callable[[], str]) -> str:
    """Send sig; `mallard up` must exit 0 having stopped every child, and say so. Its output."""
    children = {name: int((paths.run_dir / f"{name}.pid").read_text()) for name in CHILDREN}
    proc.send_signal(sig)
    # A pass under way finishes first; stop_all bounds each child's stop at 20 s.
    try:
        code = proc.wait(240)
    except subprocess.TimeoutExpired:
        raise AssertionError(
            f"mallard up still runs 240 s after {sig!r}:\n{_stacks(proc)}\n{log()}"
        ) from None
    assert code == 0, log()
    for name, pid in children.items():
        assert not Path(f"/proc/{pid}").exists(), f"{name} (pid {pid}) still runs"
    assert not [n for n in CHILDREN if (paths.run_dir / f"{n}.pid").exists()], log()
    assert watcher_pid(paths) is None
    # Its last lines reach `lines` through the reader thread, which may still be draining the
    # pipe when wait() returns.
    _wait("its last line", lambda: "Mallard stopped." in log(), 30, log)
    out = log()
    why = "SIGTERM" if sig == signal.SIGTERM else "Ctrl-C"
    assert f"{why}: stopping {', '.join(CHILDREN)}" in out, out
    return out


# Two starts of everything, each step with its own bound (the waits below): the suite's default
# 600 s covers one step's bound, not the whole on a loaded host.
@pytest.mark.timeout(1800)
def test_make_run_starts_everything_and_the_watcher_runs_the_passes(tmp_path: Path) -> None:
    data = tmp_path / "data"
    proc, lines = _start(data)
    paths = DataPaths(data.resolve())

    def log() -> str:
        logs = sorted(paths.run_dir.glob("*.log")) if paths.run_dir.exists() else []
        return "".join(lines) + "".join(f"\n--- {p.name}\n{p.read_text()[-3000:]}" for p in logs)

    try:
        _wait("the start-up banner", lambda: "Press Ctrl-C to stop." in "".join(lines), 420, log)
        out = "".join(lines)
        token = re.search(r"auth-token: (\S+)", out)
        base = re.search(r"curl -s '(\S+)/events/", out)
        server = re.search(r"Server \(ingestion, read API, tag\): (http://\S+)", out)
        assert server, out
        assert token and base and re.search(r"writeKey:\s+\S+", out), out
        assert re.search(r"Dagster UI: +http://127\.0\.0\.1:\d+", out), out
        assert "pipeline run --watch" in out
        assert re.search(r"local mailbox smtp://127\.0\.0\.1:\d+; read it: mallard mailbox", out)
        client = httpx.Client(base_url=base[1], headers={"auth-token": token[1]}, timeout=10)

        # The first pass ran before the banner: the demo customers are served.
        demo = client.get("/profiles/userId:u-1001/traits")
        assert demo.status_code == 200 and demo.json()["plan"] == "pro", demo.text

        watcher = int((paths.run_dir / "pipeline-watch.pid").read_text())
        _wait("the watcher's claim", lambda: watcher_pid(paths) == watcher, 120, log)

        sent = client.post(
            "/identify", json={"userId": "up-1", "event": "identify", "traits": {"plan": "team"}}
        )
        assert sent.status_code == 200, sent.text
        # The demo's welcome email to a demo customer, sent after the watcher's pass.
        welcome = client.post(
            "/track", json={"userId": "u-1001", "event": "send_email", "assetId": "welcome"}
        )
        assert welcome.status_code == 200, welcome.text

        def served() -> bool:
            r = client.get("/profiles/userId:up-1/traits")
            return r.status_code == 200 and r.json().get("plan") == "team"

        _wait("the new identify to be served", served, 240, log)

        def watcher_ran_it() -> bool:
            # The API serves the pass's marts once dbt commits them; the watcher writes its
            # summary line after the rest of the pass (checks, dispatch).
            text = (paths.run_dir / "pipeline-watch.log").read_text()
            return "pass: new landing files" in text and "ok   dbt build" in text

        _wait("the watcher's log of that pass", watcher_ran_it, 120, log)
        # The first pass (its output is `mallard up`'s) and the watcher's: no warnings.
        assert not WARNING_LINE.findall(out), out
        assert not WARNING_LINE.findall((paths.run_dir / "pipeline-watch.log").read_text())

        # The welcome email links to the preferences page at the address the server listens on.
        _wait("the welcome email", lambda: mailbox.message_files(paths), 240, log)
        [received] = [mailbox.parse(p) for p in mailbox.message_files(paths)]
        text = received.get_body(preferencelist=("plain",))
        assert text is not None
        link = re.search(r"Your preferences: (\S+)", text.get_content())  # type: ignore[attr-defined]
        assert link and link[1].startswith(f"{server[1]}/content?s="), link
        page = httpx.get(link[1], timeout=30)
        assert page.status_code == 200 and "Your communication preferences" in page.text

        # The daemon's sensor saw the file land and left the pass to the watcher.
        _wait(
            "a sensor tick that names the watcher",
            lambda: any(
                f"pipeline watcher (pid {watcher})" in reason
                for reason in _sensor_skips(paths.dagster_home, "landing_files_sensor")
            ),
            120,
            log,
        )
        with dg.DagsterInstance.from_config(str(paths.dagster_home)) as instance:
            runs = instance.get_runs(filters=dg.RunsFilter(job_name="pipeline"))
        assert len(runs) >= 2  # the first pass and the watcher's, both shown in the UI
        assert not [r.run_id for r in runs if "dagster/sensor_name" in r.tags]

        # The operators' UI, in Chromium: it renders and asks no host but its own.
        ui = re.search(r"Dagster UI: +(http://127\.0\.0\.1:\d+)", out)
        assert ui
        # Its first-visit pop-up (an email address for Dagster's community) is off: the instance
        # setting, and the flag the UI reads.
        with dg.DagsterInstance.from_config(str(paths.dagster_home)) as instance:
            assert instance.nux_enabled is False
        nux = httpx.post(f"{ui[1]}/graphql", json={"query": "{ shouldShowNux }"}, timeout=30)
        assert nux.json() == {"data": {"shouldShowNux": False}}, nux.text
        with chromium() as browser:
            page = browser.new_page()
            foreign: list[str] = []
            page.on(
                "request",
                lambda r: (
                    None if r.url.startswith((ui[1], "data:", "blob:")) else foreign.append(r.url)
                ),
            )
            for view in ("/runs", "/assets"):
                page.goto(ui[1] + view, wait_until="networkidle", timeout=120_000)
            assert page.title() in ("Dagster", "Assets")  # the app's, or its asset page's
            expect(page.get_by_role("navigation")).to_be_visible(timeout=60_000)
            assert page.get_by_text("Join the Dagster community").count() == 0
        assert foreign == []

        _stop(proc, signal.SIGINT, paths, log)  # Ctrl-C

        # Again on the same data (no demo traffic this time), stopped as a service manager does.
        proc, lines = _start(data)
        _wait(
            "the start-up banner again", lambda: "Press Ctrl-C to stop." in "".join(lines), 420, log
        )
        _stop(proc, signal.SIGTERM, paths, log)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
