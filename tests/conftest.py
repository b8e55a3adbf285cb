"""Shared fixtures: a real `mallard serve` subprocess on a free loopback port, and the CLI."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mallard import harness
from mallard.cli import default_stop_signals
from mallard.harness import REPO, Server, free_port, mallard

__all__ = ["REPO", "Server", "free_port", "init_data_dir", "landed_event_ids", "mallard"]

# Unit tests run Dagster passes in this process, some on its main thread, some off it: with
# SIGTERM left ignored by the first (see default_stop_signals), each step of the others would
# wait 30 s for its log tail to stop.
default_stop_signals()


# Where this session's built data dir is made, once for every xdist worker of the session (their
# base temp dirs share this parent); set before any test's fixtures by _template_root.
_TEMPLATE: list[Path] = []


@pytest.fixture(scope="session", autouse=True)
def _template_root(tmp_path_factory: pytest.TempPathFactory) -> None:
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent
    _TEMPLATE[:] = [root / "built-data-dir"]


def init_data_dir(data_dir: Path) -> dict[str, str]:
    """A data dir as `mallard init` and a first pass on its empty lake leave it (a copy of the
    session's: mallard/harness.py built_data_dir), answering its demo credentials. A first pass
    on a fresh lake creates every table and runs every dbt test, about as long as the rest of
    a test that runs one pass; tests of `mallard init` itself and of a fresh lake's first pass
    call mallard.harness.init_data_dir."""
    return harness.built_data_dir(data_dir, _TEMPLATE[0])


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


# The longest files of the suite, in this order: the whole-system test (three minutes of every
# role at once, then its checks) and test_up (`mallard up` started twice and stopped).
FIRST = ("tests/system/test_system.py", "tests/integration/test_up.py")


def _order(item: pytest.Item) -> int:
    for i, first in enumerate(FIRST):
        if item.nodeid.startswith(first):
            return i
    return len(FIRST) if "tests/unit/" in item.nodeid else len(FIRST) + 1


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The longest files first, then the unit tests, each part in its file order: `make test`'s
    workers take files in this order, and the long files (the system test, test_up; the few
    unit files that build lakes) are then not left to the end, where one worker would run them
    while the other idles."""
    items.sort(key=_order)
