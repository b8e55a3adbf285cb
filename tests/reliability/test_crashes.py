"""Crashes: the collector, the pipeline, the roller and the pages process SIGKILLed.

- The collector (`mallard serve`) is killed CRASH_KILLS times under load from three load
  generator processes (tests/reliability/loadgen.py), restarted on the same port each time;
  after a drain and a pipeline pass every acknowledged eventId is in the landing files and in
  raw.messages and marts.events exactly once.
- `mallard pipeline run` is killed CRASH_KILLS times at seeded random points of a pass; the next
  complete pass gives the same marts (and raw.messages) as an uninterrupted pass of a copy of
  the same data dir.
- The roller (the server's process-pool worker) and the pages process (api/pages.py) are
  killed on a running server: what is acknowledged afterwards still lands, and event pages
  answer as before.

`make test-reliability` kills 5 times each; `make soak` 20 (MALLARD_CRASH_KILLS).
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from mallard.harness import REPO, Server, copy_data_dir, free_port, init_data_dir, mallard
from mallard.offline import TELEMETRY_OFF
from mallard.paths import DataPaths
from mallard.processes import alive
from tests.conftest import landed_event_ids, wait_landed
from tests.reliability.conftest import FIGURES, start_loadgens

pytestmark = [pytest.mark.reliability, pytest.mark.integration]

KILLS = int(os.environ.get("MALLARD_CRASH_KILLS", "5"))
SEED = int(os.environ.get("MALLARD_CRASH_SEED", "37"))
LOADGENS = 3
SERVER_ENV = {
    "MALLARD_ROLL_INTERVAL_S": "0.3",
    "MALLARD_RATE_PER_SECOND": "1000000",
    "MALLARD_RATE_BURST": "1000000",
}


def children(pid: int) -> dict[int, str]:
    """pid -> command line of each child of a process."""
    out: dict[int, str] = {}
    for task in Path(f"/proc/{pid}/task").glob("*"):
        with contextlib.suppress(OSError):
            for c in (task / "children").read_text().split():
                with contextlib.suppress(OSError):
                    cmd = Path(f"/proc/{c}/cmdline").read_bytes().replace(b"\0", b" ")
                    out[int(c)] = cmd.decode(errors="replace")
    return out


def wait_gone(pids: list[int], timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(alive(p) for p in pids), f"still alive after {timeout}s: {pids}"


def roller_pid(server: Server, timeout: float = 20) -> int:
    assert server.proc is not None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = [
            p for p, cmd in children(server.proc.pid).items() if "multiprocessing.spawn" in cmd
        ]
        if found:
            return found[0]
        time.sleep(0.05)
    raise AssertionError(f"no roller process under {server.proc.pid}: {children(server.proc.pid)}")


def lake_rows(data: Path, sql: str) -> list[tuple[Any, ...]]:
    from orchestration.warehouse import lake_connection

    conn = lake_connection(DataPaths(data))
    try:
        return conn.execute(sql).fetchall()
    finally:
        conn.close()


def read_acks(files: list[Path]) -> list[str]:
    return [line for f in files if f.exists() for line in f.read_text().split()]


# --- the collector ----------------------------------------------------------------------------


@pytest.mark.timeout(600 + KILLS * 30)
def test_collector_killed_under_load_stores_every_ack_once(tmp_path: Path) -> None:
    rng = random.Random(SEED)
    data = tmp_path / "data"
    server = Server(data, free_port(), init_data_dir(data), env=SERVER_ENV)
    server.start()
    outs = [tmp_path / f"gen{i}.acks" for i in range(LOADGENS)]
    gens = start_loadgens(server, outs, 600)
    acked_at_kill: list[int] = []
    restart_s: list[float] = []
    try:
        for _ in range(KILLS):
            before = len(read_acks(outs))
            # Kill only once this round's load has been acknowledged (a kill of a server that
            # took nothing proves nothing), at a random point after that.
            deadline = time.monotonic() + 30
            while len(read_acks(outs)) < before + 50:
                assert time.monotonic() < deadline, "the load generators got no acks"
                time.sleep(0.02)
            time.sleep(rng.uniform(0.0, 1.0))
            assert server.proc is not None
            kids = list(children(server.proc.pid))
            server.kill()
            acked_at_kill.append(len(read_acks(outs)))
            wait_gone(kids)  # the roller does not live on as an orphan
            t0 = time.monotonic()
            server.start()  # same port: the load generators reconnect by themselves
            restart_s.append(time.monotonic() - t0)
        time.sleep(0.5)
    finally:
        for out in outs:
            out.with_suffix(".stop").touch()
        for g in gens:
            try:
                g.wait(30)
            except subprocess.TimeoutExpired:
                g.kill()
                g.wait()
    unexpected = [f.read_text() for f in tmp_path.glob("*.unexpected")]
    assert unexpected == [], f"answers other than 200/503: {unexpected}"
    assert server.stop() in (0, -signal.SIGTERM)
    acked = read_acks(outs)
    assert len(acked) == len(set(acked)), "an eventId was acknowledged twice"
    landed = Counter(landed_event_ids(data))
    lost = [i for i in acked if landed[i] == 0]
    doubled = [i for i in acked if landed[i] > 1]
    assert lost == [], f"{len(lost)} of {len(acked)} acknowledged messages not landed"
    assert doubled == [], f"{len(doubled)} acknowledged messages landed twice"
    assert [p for p in (data / "wal").rglob("*") if p.is_file()] == []
    assert mallard("pipeline", "run", data_dir=data, timeout=900).returncode == 0
    raw = Counter(
        dict(lake_rows(data, "select event_id, count(*) from lake.raw.messages group by 1"))
    )
    events = Counter(
        dict(lake_rows(data, "select event_id, count(*) from lake.marts.events group by 1"))
    )
    assert [i for i in acked if raw[i] != 1] == [], "an ack not exactly once in raw.messages"
    assert [i for i in acked if events[i] != 1] == [], "an ack not exactly once in marts.events"
    extra = sum(landed.values()) - len(acked)
    statuses = Counter[str]()
    for f in tmp_path.glob("*.statuses"):
        for line in f.read_text().splitlines():
            k, _, v = line.rpartition(" ")
            statuses[k] += int(v)
    FIGURES.notes.append(
        f"collector kill -9 x{KILLS} under {LOADGENS} load processes: {len(acked):,} acks,"
        f" each once in landing, raw.messages and marts.events; {extra} landed without an ack"
        f" (killed before answering); restart {max(restart_s):.1f} s at worst;"
        f" answers {dict(statuses)}"
    )


# --- the pipeline ----------------------------------------------------------------------------

# Columns a pass stamps with its own time or id: they differ between any two runs.
PASS_STAMPED = {"built_at", "pass_id", "loaded_at"}
TABLES = [
    "marts.events",
    "marts.customers",
    "marts.customer_profiles",
    "marts.customer_identifiers",
    "marts.customer_preferences",
    "marts.duplicates",
    "marts.commands",
    "marts.audience_members",
    "raw.messages",
    "raw.landing_files",
]


def marts_state(data: Path) -> dict[str, list[tuple[Any, ...]]]:
    out = {}
    for table in TABLES:
        schema, name = table.split(".")
        cols = [
            c
            for (c,) in lake_rows(
                data,
                "select column_name from information_schema.columns where table_catalog='lake'"
                f" and table_schema='{schema}' and table_name='{name}' order by ordinal_position",
            )
            if c not in PASS_STAMPED
        ]
        assert cols, table
        select = ", ".join(f'"{c}"::varchar' for c in cols)
        out[table] = sorted(lake_rows(data, f"select {select} from lake.{table}"), key=repr)
    return out


def make_input(server: Server) -> int:
    """Identities stitched, traits changed, duplicates and late events, in several files."""
    sent = 0
    for wave in range(4):
        batch: list[dict[str, Any]] = []
        for u in range(12):
            anon = f"anon-{u}"
            batch += [
                {"type": "page", "anonymousId": anon, "event": "page", "properties": {"w": wave}},
                {
                    "type": "identify",
                    "userId": f"user-{u}",
                    "anonymousId": anon,
                    "event": "identify",
                    "traits": {"plan": ["free", "pro"][(u + wave) % 2], "email": f"u{u}@x.test"},
                },
                {
                    "type": "track",
                    "userId": f"user-{u}",
                    "event": "Order Completed",
                    "properties": {"total": u * wave},
                    "messageId": f"m-{u}-{wave}",
                },
                # a duplicate of the previous wave's message, and a late event
                {
                    "type": "track",
                    "userId": f"user-{u}",
                    "event": "Order Completed",
                    "properties": {"total": u * (wave - 1)},
                    "messageId": f"m-{u}-{max(0, wave - 1)}",
                },
                {
                    "type": "track",
                    "userId": f"user-{u}",
                    "event": "Late",
                    "timestamp": f"2024-0{1 + wave}-01T00:00:00Z",
                },
            ]
        r = server.post("batch", {"batch": batch})
        assert r.status_code == 200, r.text
        wait_landed(server.data_dir, [i for i in r.json()["eventIds"] if i])
        sent += len(batch)
    return sent


def pass_killed_after(data: Path, delay: float) -> int | None:
    """`mallard pipeline run` in a session of its own, SIGKILLed (its whole process group) after
    `delay` s; its exit code if it ended before that."""
    env = {**os.environ, "MALLARD_DATA_DIR": str(data), **TELEMETRY_OFF}
    with open(data / "killed-passes.log", "ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "mallard.cli", "pipeline", "run"],
            cwd=REPO,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        return proc.wait(delay)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        return None


@pytest.fixture(scope="module")
def pipeline_input(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, int]]:
    data = tmp_path_factory.mktemp("pipeline-kill") / "data"
    server = Server(data, free_port(), init_data_dir(data), env=SERVER_ENV)
    server.start()
    try:
        sent = make_input(server)
    finally:
        server.stop()
    yield data, sent


@pytest.mark.timeout(600 + KILLS * 120)  # a pass is about a minute here, under load
def test_pipeline_killed_mid_pass_ends_with_the_same_marts(
    pipeline_input: tuple[Path, int], tmp_path: Path
) -> None:
    data, sent = pipeline_input
    calm, killed = tmp_path / "calm", tmp_path / "killed"
    copy_data_dir(data, calm)
    copy_data_dir(data, killed)
    t0 = time.monotonic()
    mallard("pipeline", "run", data_dir=calm, timeout=900)
    full_s = time.monotonic() - t0
    rng = random.Random(SEED)
    # Within the first 60% of a pass's time: a pass that ends before its kill has nothing left
    # for the next ones to do, whose kills then interrupt a pass with no work.
    delays = [rng.uniform(0.5, 0.6 * full_s) for _ in range(KILLS)]
    killed_n, finished = 0, 0
    for delay in delays:
        code = pass_killed_after(killed, delay)
        if code is None:
            killed_n += 1
        else:
            assert code == 0, (killed / "killed-passes.log").read_text()[-3000:]
            finished += 1
    out = mallard("pipeline", "run", data_dir=killed, timeout=900)
    assert out.returncode == 0
    want, got = marts_state(calm), marts_state(killed)
    assert got["raw.messages"], "nothing was loaded"
    for table in TABLES:
        assert got[table] == want[table], f"{table} differs after {killed_n} killed passes"
    assert killed_n >= max(1, KILLS // 2), f"only {killed_n} of {KILLS} passes were killed"
    FIGURES.notes.append(
        f"pipeline kill -9 x{killed_n} (+{finished} finished before their kill) at"
        f" {', '.join(f'{d:.1f}' for d in delays)} s of a {full_s:.1f} s pass: the next pass gave"
        f" the same {len(TABLES)} tables ({len(got['raw.messages'])} messages of {sent} sent,"
        f" {len(got['marts.events'])} events)"
    )


# --- the roller and the pages process ----------------------------------------------------------


def post_some(server: Server, n: int, tag: str) -> list[str]:
    ids = []
    with httpx.Client(headers=server.headers, timeout=30) as c:
        for i in range(n):
            r = c.post(f"{server.base}/track", json={"userId": f"{tag}-{i % 5}", "event": tag})
            assert r.status_code == 200, r.text
            ids.append(r.json()["eventId"])
    return ids


def test_roller_killed_comes_back_and_lands_everything(tmp_path: Path) -> None:
    data = tmp_path / "data"
    server = Server(data, free_port(), init_data_dir(data), env=SERVER_ENV)
    server.start()
    try:
        acked = post_some(server, 30, "before")
        wait_landed(data, acked)
        kills = 0
        for _ in range(min(KILLS, 5)):
            pid = roller_pid(server)
            stop, during = threading.Event(), list[str]()

            def load(stop: threading.Event = stop, during: list[str] = during) -> None:
                with httpx.Client(headers=server.headers, timeout=30) as c:
                    while not stop.is_set():
                        r = c.post(f"{server.base}/track", json={"userId": "r", "event": "R"})
                        assert r.status_code == 200, r.text
                        during.append(r.json()["eventId"])

            t = threading.Thread(target=load)
            t.start()
            time.sleep(0.4)
            os.kill(pid, signal.SIGKILL)
            kills += 1
            wait_gone([pid])
            time.sleep(0.8)
            stop.set()
            t.join()
            acked += during + post_some(server, 10, "after")
            # Lands without a restart of the server: the roller came back.
            wait_landed(data, acked, timeout=30)
            assert roller_pid(server) != pid
    finally:
        server.stop()
    landed = Counter(landed_event_ids(data))
    assert [i for i in acked if landed[i] != 1] == []
    FIGURES.notes.append(f"roller kill -9 x{kills}: {len(acked)} acks landed once, no restart")


def pages_pid(server: Server) -> int | None:
    assert server.proc is not None
    found = [p for p, cmd in children(server.proc.pid).items() if "api.pages" in cmd]
    return found[0] if found else None


def test_pages_process_killed_serves_the_same_pages(tmp_path: Path) -> None:
    data = tmp_path / "data"
    server = Server(data, free_port(), init_data_dir(data), env=SERVER_ENV)
    server.start()
    try:
        acked = post_some(server, 60, "paged")
        wait_landed(data, acked)
        mallard("pipeline", "run", data_dir=data, timeout=900)
        queries = [
            "events/?size=100",
            "events/?size=7&from=3&sort=asc",
            "events/?include=paged&size=50",
            "profiles/userId:paged-1/events?size=100",
        ]

        def pages() -> list[Any]:
            out = []
            for q in queries:
                r = server.get(q)
                assert r.status_code == 200, r.text
                out.append(r.json()["data"])
            return out

        deadline = time.monotonic() + 60
        want = pages()
        while len(want[0]) < 60 and time.monotonic() < deadline:
            time.sleep(0.5)
            want = pages()
        assert len(want[0]) == 60, "the pass's events are not served"
        deadline = time.monotonic() + 60
        while pages_pid(server) is None:
            assert time.monotonic() < deadline, "no pages process under the server"
            pages()
            time.sleep(0.2)
        kills = 0
        for _ in range(min(KILLS, 5)):
            pid = pages_pid(server)
            assert pid is not None
            os.kill(pid, signal.SIGKILL)
            kills += 1
            wait_gone([pid])
            # Right after the kill (answered from SQL while it comes back) and later.
            assert pages() == want
            deadline = time.monotonic() + 30
            while pages_pid(server) in (None, pid):
                assert time.monotonic() < deadline, "the pages process did not come back"
                assert pages() == want
                time.sleep(0.1)
            assert pages() == want
    finally:
        server.stop()
    FIGURES.notes.append(f"pages process kill -9 x{kills}: the same 4 pages served every time")
