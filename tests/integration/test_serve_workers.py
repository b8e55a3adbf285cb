"""`mallard serve --workers 2` (MALLARD_SERVE_WORKERS): two server processes on one port, each a
collector of its own. Connections reach both; messages accepted by either land under its own
collector id, a pass models them all, and any worker answers reads of them; the supervisor's
SIGTERM stops both, and a killed supervisor takes its workers with it (the port is free again).
A revoked token, a SUPPRESS and a SUPPRESS_WITH_DELETE hold on both workers, each checked on
connections whose worker is known."""

from __future__ import annotations

import json
import os
import signal
import socket
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from mallard.workers import collector_id
from tests.conftest import Server, free_port, init_data_dir, mallard, wait_landed

pytestmark = pytest.mark.integration

ENV = {"MALLARD_ROLL_INTERVAL_S": "0.3", "MALLARD_SERVE_WORKERS": "2"}


def _workers(srv: Server) -> list[int]:
    assert srv.proc is not None
    children = Path(f"/proc/{srv.proc.pid}/task/{srv.proc.pid}/children").read_text().split()
    return [int(pid) for pid in children]


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def _collectors_answering(srv: Server, tries: int = 200) -> Counter[str]:
    """Which collector answered /health, each on a new connection, until both have."""
    seen: Counter[str] = Counter()
    for _ in range(tries):
        seen[httpx.get(f"{srv.url}/health", timeout=10).json()["collectorId"]] += 1
        if len(seen) == 2:
            break
    return seen


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    data = tmp_path_factory.mktemp("workers") / "data"
    server = Server(data, free_port(), init_data_dir(data), env=ENV)
    server.start()
    try:
        yield server
    finally:
        server.stop()


def test_both_workers_take_connections_and_land_under_their_own_ids(srv: Server) -> None:
    assert len(_workers(srv)) == 2
    assert set(_collectors_answering(srv)) == {"c0", collector_id("c0", 1)} == {"c0", "c0-w1"}

    users = [f"w-user-{i}" for i in range(40)]
    ids = []
    for user in users:  # a connection each: the kernel spreads them over the workers
        r = httpx.post(
            f"{srv.base}/identify",
            json={"userId": user, "event": "identify", "traits": {"n": user}},
            headers=srv.headers,
            timeout=10,
        )
        assert r.status_code == 200, r.text
        ids.append(r.json()["eventId"])
    wait_landed(srv.data_dir, ids)
    landed = {p.name.rsplit("-", 1)[0] for p in srv.data_dir.glob("landing/date=*/*.parquet")}
    assert landed == {"c0", "c0-w1"}

    srv.pipeline()
    for user in users:
        r = srv.get(f"profiles/userId:{user}/traits")
        assert r.status_code == 200, r.text
        assert r.json()["n"] == user


def test_sigterm_to_the_supervisor_stops_every_worker(tmp_path: Path) -> None:
    data = tmp_path / "data"
    srv = Server(data, free_port(), init_data_dir(data), env=ENV)
    srv.start()
    workers = _workers(srv)
    assert srv.stop() == 0
    assert not [pid for pid in workers if _alive(pid)]


def test_a_killed_supervisor_takes_its_workers_and_frees_the_port(tmp_path: Path) -> None:
    data = tmp_path / "data"
    srv = Server(data, free_port(), init_data_dir(data), env=ENV)
    srv.start()
    workers = _workers(srv)
    assert srv.proc is not None
    os.kill(srv.proc.pid, signal.SIGKILL)
    srv.proc.wait(10)
    deadline = time.monotonic() + 30
    while [pid for pid in workers if _alive(pid)] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [pid for pid in workers if _alive(pid)]
    with socket.socket() as s:  # no worker holds the port
        s.bind(("127.0.0.1", srv.port))


def test_zero_workers_is_refused(tmp_path: Path) -> None:
    data = tmp_path / "data"
    init_data_dir(data)
    out = mallard("serve", "--workers", "0", "--port", str(free_port()), data_dir=data, check=False)
    assert out.returncode == 2
    assert "--workers must be 1 or more" in out.stderr


def _per_worker(
    srv: Server, ask: Callable[[httpx.Client], httpx.Response], each: int = 6, tries: int = 400
) -> dict[str, list[httpx.Response]]:
    """`ask` on new connections until each worker has answered it `each` times: per worker, its
    answers. A connection's /health names the worker behind it (its collectorId); `ask` follows
    on that same kept-alive connection, so its answer is known to come from that worker."""
    answers: dict[str, list[httpx.Response]] = {}
    for _ in range(tries):
        with httpx.Client(timeout=60) as http:
            worker = http.get(f"{srv.url}/health").json()["collectorId"]
            if len(answers.get(worker, [])) < each:
                answers.setdefault(worker, []).append(ask(http))
        if len(answers) == 2 and all(len(a) >= each for a in answers.values()):
            return answers
    raise AssertionError(f"both workers did not answer {each} times: {answers}")


def _file(srv: Server, kind: str, user: str) -> dict[str, Any]:
    body = {"regulationType": kind, "subject": {"type": "USER_ID", "ids": [user]}}
    r = srv.post("regulations", body)
    assert r.status_code == 200, r.text
    return srv.wait_regulation(r.json()["regulationId"])


def test_a_revocation_a_suppress_and_a_delete_hold_on_both_workers(srv: Server) -> None:
    assert set(_collectors_answering(srv)) == {"c0", "c0-w1"}

    # A token revoked by the CLI is refused by both workers, which had it cached.
    made = json.loads(
        mallard(
            "tokens", "create", "--scope", "client:demo", "--json", data_dir=srv.data_dir
        ).stdout
    )
    h = {"auth-token": made["token"]}

    def read(http: httpx.Client) -> httpx.Response:
        return http.get(f"{srv.base}/events/", headers=h)

    def track(http: httpx.Client) -> httpx.Response:
        return http.post(f"{srv.base}/track", json={"userId": "w-rv", "event": "E"}, headers=h)

    for answers in (_per_worker(srv, read), _per_worker(srv, track)):
        assert {w: {r.status_code for r in rs} for w, rs in answers.items()} == {
            "c0": {200},
            "c0-w1": {200},
        }
    mallard("tokens", "revoke", made["tokenId"], data_dir=srv.data_dir)
    for ask, refused in ((read, 401), (track, 403)):
        answers = _per_worker(srv, ask)
        assert {w: {r.status_code for r in rs} for w, rs in answers.items()} == {
            "c0": {refused},
            "c0-w1": {refused},
        }, {w: [r.text for r in rs] for w, rs in answers.items()}

    # The Delete's subject, and a neighbour, with calls taken by both workers and modelled.
    subject, neighbour = f"w-subj-{uuid.uuid4().hex[:8]}", f"w-nb-{uuid.uuid4().hex[:8]}"
    sent: list[str] = []

    def calls(user: str) -> Callable[[httpx.Client], httpx.Response]:
        def call(http: httpx.Client) -> httpx.Response:
            r = http.post(
                f"{srv.base}/identify",
                json={"userId": user, "event": "identify", "traits": {"email": f"{user}@x.test"}},
                headers=srv.headers,
            )
            assert r.status_code == 200, r.text
            sent.append(r.json()["eventId"])
            return r

        return call

    for user in (subject, neighbour):
        _per_worker(srv, calls(user), each=2)
    wait_landed(srv.data_dir, sent)
    srv.pipeline()

    def profile(user: str, what: str) -> Callable[[httpx.Client], httpx.Response]:
        def ask(http: httpx.Client) -> httpx.Response:
            return http.get(f"{srv.base}/profiles/userId:{user}/{what}", headers=srv.headers)

        return ask

    for what in ("traits", "events"):
        for user in (subject, neighbour):
            answers = _per_worker(srv, profile(user, what), each=2)
            assert {r.status_code for rs in answers.values() for r in rs} == {200}, (user, what)

    # A SUPPRESS filed through one worker: both drop the subject's calls from then on, and
    # keep the neighbour's.
    assert _file(srv, "SUPPRESS", subject)["status"] == "finished"
    for user, dropped in ((subject, "suppress"), (neighbour, None)):
        sent.clear()
        answers = _per_worker(srv, calls(user), each=3)
        by_worker = {w: {srv.dropped(r.json()["eventId"]) for r in rs} for w, rs in answers.items()}
        assert by_worker == {"c0": {dropped}, "c0-w1": {dropped}}, user

    # A SUPPRESS_WITH_DELETE finishes; then neither worker serves the subject's profile or its
    # events, while both serve the neighbour's.
    assert _file(srv, "SUPPRESS_WITH_DELETE", subject)["status"] == "finished"
    for what in ("traits", "events"):
        answers = _per_worker(srv, profile(subject, what), each=3)
        assert {w: {r.status_code for r in rs} for w, rs in answers.items()} == {
            "c0": {404},
            "c0-w1": {404},
        }, (what, {w: [r.text for r in rs] for w, rs in answers.items()})
        answers = _per_worker(srv, profile(neighbour, what), each=2)
        assert {r.status_code for rs in answers.values() for r in rs} == {200}, what

    def events(http: httpx.Client) -> httpx.Response:
        return http.get(f"{srv.base}/events/", params={"size": 100}, headers=srv.headers)

    for worker, rs in _per_worker(srv, events, each=2).items():
        for r in rs:
            assert r.status_code == 200, r.text
            users = {e.get("userId") for e in r.json()["data"]}
            assert subject not in users and neighbour in users, worker
