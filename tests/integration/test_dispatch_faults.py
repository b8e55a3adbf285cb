"""Exactly-once delivery on real processes: two dispatchers at once over the same outbox send
each command once, and a dispatcher killed (SIGKILL) between the provider's answer and the
outbox mark re-sends at most once, with the same Message-ID. Messages are counted at loopback
SMTP sinks (aiosmtpd), one per dispatcher, so each sink's count is what its dispatcher sent."""

from __future__ import annotations

import email
import email.policy
import os
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from aiosmtpd.controller import Controller

from tests.conftest import REPO, Server, free_port, init_data_dir, mallard, wait_landed

pytestmark = [pytest.mark.integration, pytest.mark.faults]

# Commands the two dispatchers share: several times the 100 sends one claim takes
# (Outbox.claim's limit in send_due, which has no setting), so each dispatcher claims again
# while the other still holds sends of its own.
N = 400
READY_TIMEOUT_S = 120

# A dispatcher of its own: imported, it writes its ready file, then waits for the go file (so
# two start together), then one dispatch.
DISPATCHER = """
import sys, time
from pathlib import Path
from mallard.paths import DataPaths
from orchestration.delivery.dispatch import dispatch
go, paths, ready = Path(sys.argv[1]), DataPaths(Path(sys.argv[2])), Path(sys.argv[3])
ready.touch()
while not go.exists():
    time.sleep(0.005)
print(dispatch(paths).summary(), flush=True)
"""


class Sink:
    def __init__(self) -> None:
        self.message_ids: list[str] = []

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:  # noqa: N802
        msg = email.message_from_bytes(envelope.content, policy=email.policy.default)
        self.message_ids.append(str(msg["Message-ID"]))
        return "250 OK"


@dataclass
class Env:
    server: Server
    sink: Sink
    smtp_url: str
    # A second mail server, for the second of two dispatchers at once.
    other_sink: Sink
    other_smtp_url: str

    def dispatcher(
        self, go: Path, ready: Path, smtp_url: str | None = None, **env: str
    ) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [sys.executable, "-c", DISPATCHER, str(go), str(self.server.data_dir), str(ready)],
            cwd=REPO,
            env={**os.environ, "MALLARD_SMTP_URL": smtp_url or self.smtp_url, **env},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def commands(self, prefix: str, n: int) -> list[str]:
        """n send_email commands for u1, in one batch call."""
        batch = [
            {
                "type": "track",
                "userId": "u1",
                "event": "send_email",
                "assetId": "welcome",
                "messageId": f"{prefix}-{i}",
            }
            for i in range(n)
        ]
        r = self.server.post("batch", {"batch": batch})
        assert r.status_code == 200, r.text
        ids = [str(i) for i in r.json()["eventIds"]]
        assert len(ids) == n
        return ids

    def plan_only(self, ids: list[str]) -> None:
        """A pass whose dispatcher finds no mail server: the sends are planned and wait for
        their retry; then wait until that retry is due."""
        wait_landed(self.server.data_dir, ids)
        dead = f"smtp://127.0.0.1:{free_port()}"
        mallard("pipeline", "run", data_dir=self.server.data_dir, env={"MALLARD_SMTP_URL": dead})
        rows = self.sends(ids)
        assert len(rows) == len(ids) and {r[1] for r in rows} == {"pending"}, rows
        with sqlite3.connect(self.server.data_dir / "outbox.sqlite") as conn:
            due = conn.execute("select max(next_attempt_at) from sends").fetchone()[0]
        time.sleep(max(0.0, due - time.time()) + 0.2)

    def sends(self, ids: list[str]) -> list[tuple[str, str, str]]:
        marks = ",".join("?" * len(ids))
        with sqlite3.connect(self.server.data_dir / "outbox.sqlite") as conn:
            return conn.execute(
                f"select send_id, status, command_event_id from sends"
                f" where command_event_id in ({marks})",
                ids,
            ).fetchall()


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    root = tmp_path_factory.mktemp("dispatch-faults")
    sink, port = Sink(), free_port()
    controller = Controller(sink, hostname="127.0.0.1", port=port)
    controller.start()
    other_sink, other_port = Sink(), free_port()
    other_controller = Controller(other_sink, hostname="127.0.0.1", port=other_port)
    other_controller.start()
    data = root / "data"
    creds = init_data_dir(data)
    server = Server(data, free_port(), creds, env={"MALLARD_ROLL_INTERVAL_S": "0.3"})
    server.start()
    try:
        r = server.post(
            "identify",
            {"userId": "u1", "event": "identify", "traits": {"email": "ann@example.com"}},
        )
        assert r.status_code == 200, r.text
        wait_landed(data, [str(r.json()["eventId"])])
        yield Env(
            server, sink, f"smtp://127.0.0.1:{port}", other_sink, f"smtp://127.0.0.1:{other_port}"
        )
    finally:
        server.stop()
        controller.stop()
        other_controller.stop()


def _wait_ready(procs: list[subprocess.Popen[str]], ready: list[Path]) -> None:
    """Until every dispatcher wrote its ready file (imported, waiting for the go file)."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    while not all(r.exists() for r in ready):
        for p in procs:
            if p.poll() is not None:
                raise AssertionError(f"a dispatcher exited before it was ready: {p.communicate()}")
        if time.monotonic() > deadline:
            raise AssertionError(f"not ready within {READY_TIMEOUT_S} s: {ready}")
        time.sleep(0.02)


def _outcomes(env: Env, action: str) -> list[dict[str, Any]]:
    """Every stored event of this action, a page at a time."""
    out: list[dict[str, Any]] = []
    while True:
        r = env.server.get(
            "events/",
            params={"include": action, "sort": "asc", "size": 100, "from": len(out)},
        )
        assert r.status_code == 200, r.text
        page = r.json()["data"]
        out.extend(page)
        if len(page) < 100:
            return out


def test_two_dispatchers_at_once_send_each_command_once(env: Env, tmp_path: Path) -> None:
    ids = env.commands("twice", N)
    env.plan_only(ids)
    first, second = len(env.sink.message_ids), len(env.other_sink.message_ids)
    go, ready = tmp_path / "go", [tmp_path / "ready-1", tmp_path / "ready-2"]
    procs = [
        env.dispatcher(go, ready[0]),
        env.dispatcher(go, ready[1], smtp_url=env.other_smtp_url),
    ]
    _wait_ready(procs, ready)
    go.touch()
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    by_one, by_other = env.sink.message_ids[first:], env.other_sink.message_ids[second:]
    # Both took part: each dispatcher's own mail server received some of the sends.
    assert by_one and by_other, (len(by_one), len(by_other), outs)
    rows = env.sends(ids)
    assert len(rows) == N and {r[1] for r in rows} == {"sent"}
    # Each send arrived once, at one of the two servers.
    assert sorted(by_one + by_other) == sorted(f"<{r[0]}@mallard>" for r in rows), (
        len(by_one),
        len(by_other),
    )

    # Each send's outcome is one event, whichever dispatcher recorded it.
    mallard("pipeline", "run", data_dir=env.server.data_dir, env={"MALLARD_SMTP_URL": env.smtp_url})
    sent = [e["rawData"]["properties"]["commandEventId"] for e in _outcomes(env, "email_sent")]
    assert sorted(c for c in sent if c in set(ids)) == sorted(ids)


def test_a_dispatcher_killed_after_the_provider_answered_resends_at_most_once(
    env: Env, tmp_path: Path
) -> None:
    ids = env.commands("killed", 1)
    env.plan_only(ids)
    before = len(env.sink.message_ids)
    go = tmp_path / "go"
    go.touch()
    killed = env.dispatcher(go, tmp_path / "ready", MALLARD_FAULT_KILL_AT="dispatch_after_send")
    out = killed.communicate(timeout=120)
    assert killed.returncode == -9, out
    [(sid, status, _)] = env.sends(ids)
    assert status == "sending"
    assert env.sink.message_ids[before:] == [f"<{sid}@mallard>"]  # the provider had it

    # The dead dispatcher's lease runs out (LEASE_S later; here: now).
    with sqlite3.connect(env.server.data_dir / "outbox.sqlite") as conn:
        conn.execute("update sends set lease_until = 0 where send_id = ?", [sid])
    again = env.dispatcher(go, tmp_path / "ready-again")
    out = again.communicate(timeout=120)
    assert again.returncode == 0, out
    got = env.sink.message_ids[before:]
    assert 1 <= len(got) <= 2
    assert set(got) == {f"<{sid}@mallard>"}  # a re-send carries the same Message-ID
    assert env.sends(ids) == [(sid, "sent", ids[0])]

    # Nothing more on a later pass; the outcome is recorded once.
    mallard("pipeline", "run", data_dir=env.server.data_dir, env={"MALLARD_SMTP_URL": env.smtp_url})
    assert len(env.sink.message_ids[before:]) == len(got)
    sent = [e for e in _outcomes(env, "email_sent") if e["rawData"]["properties"]["sendId"] == sid]
    assert len(sent) == 1
