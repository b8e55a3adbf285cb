"""The regulations store: filing rules, the collectors' lists, forgetting a deleted user, and the
keyed hash the loader computes in SQL."""

from __future__ import annotations

import time
from pathlib import Path

import duckdb
import pytest

from mallard import regulations
from mallard.audiences import regulated_users
from mallard.paths import DataPaths
from mallard.regulations import (
    AdmissionLists,
    ListsUnavailable,
    RegulationError,
    RegulationStore,
    existing_store,
    identifier_hash,
    identifier_hash_sql,
    validate,
)
from orchestration.pipeline import regulations_step


@pytest.fixture
def paths(tmp_path: Path) -> DataPaths:
    return DataPaths(tmp_path)


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ([], "body"),
        ({"regulationType": "ERASE", "subject": {}}, "regulationType"),
        ({"regulationType": "DELETE"}, "subject"),
        ({"regulationType": "DELETE", "subject": {"type": "EMAIL", "ids": ["a"]}}, "subject.type"),
        ({"regulationType": "DELETE", "subject": {"type": "USER_ID", "ids": []}}, "subject.ids"),
        (
            {"regulationType": "DELETE", "subject": {"type": "USER_ID", "ids": ["a", 3]}},
            "subject.ids[1]",
        ),
        (
            {"regulationType": "DELETE", "subject": {"type": "USER_ID", "ids": ["a"] * 5001}},
            "subject.ids",
        ),
    ],
)
def test_a_bad_body_names_its_field(body: object, field: str) -> None:
    with pytest.raises(RegulationError) as e:
        validate(body)
    assert e.value.field == field


def test_delete_needs_an_active_suppression_and_unsuppress_ends_it(paths: DataPaths) -> None:
    store = RegulationStore(paths)
    with pytest.raises(RegulationError, match="not suppressed: u1"):
        store.file("c", "a", "A", "DELETE", ["u1"])
    store.file("c", "a", "A", "SUPPRESS", ["u1"], {"u1": ["anon1"]})
    store.file("c", "a", "A", "DELETE", ["u1"])
    lists = store.lists()["a"]["suppress"]
    assert {store.hash("a", "u1"), store.hash("a", "anon1")} == lists
    store.file("c", "a", "A", "UNSUPPRESS", ["u1"])
    assert store.lists() == {}
    with pytest.raises(RegulationError):
        store.file("c", "a", "A", "DELETE", ["u1"])


def test_collectors_see_a_filing_when_it_returns(paths: DataPaths) -> None:
    lists = AdmissionLists(paths)
    assert lists.current().suppress == {}
    RegulationStore(paths).file("c", "a", "A", "NO_TRACK", ["u1"])
    assert lists.current().no_track["a"] == {lists.hash("a", "u1")}


def test_a_lost_store_fails_closed(paths: DataPaths) -> None:
    store = RegulationStore(paths)
    store.file("c", "a", "A", "SUPPRESS", ["u1"])
    store.close()
    for f in paths.root.glob("regulations.sqlite*"):
        f.unlink()
    with pytest.raises(ListsUnavailable):
        AdmissionLists(paths, retry_s=0.1).current()
    # The pipeline's readers (the load's tombstones, the dispatch's regulated users, the
    # audiences' exclusions) open it the same way: lost is an error, never "no regulations".
    with pytest.raises(ListsUnavailable, match="restore it"):
        existing_store(paths)
    with pytest.raises(ListsUnavailable):
        regulated_users(paths.root)
    assert [s.ok for s in regulations_step(paths)] == [False]


def test_no_store_before_the_first_filing_is_no_regulations(paths: DataPaths) -> None:
    assert existing_store(paths) is None
    assert regulated_users(paths.root)[0] == []
    assert regulations_step(paths) == []
    RegulationStore(paths).file("c", "a", "A", "SUPPRESS", ["u1"])
    store = existing_store(paths)
    assert store is not None and store.lists()["a"]["suppress"] == {store.hash("a", "u1")}


def test_forget_leaves_only_hashes_in_the_file(paths: DataPaths) -> None:
    store = RegulationStore(paths)
    reg = store.file("c", "a", "A", "SUPPRESS_WITH_DELETE", ["forget-me-42"])
    store.save(reg.regulation_id, identifiers={"userIds": ["forget-me-42"]})
    store.finish(reg.regulation_id, outcome={})
    store.forget("a", ["forget-me-42"])
    after = store.get(reg.regulation_id)
    assert after is not None and after.subject_ids == [] and after.subject_hashes
    store.close()
    for f in paths.root.glob("regulations.sqlite*"):
        assert b"forget-me-42" not in f.read_bytes(), f


def test_the_sql_hash_is_the_python_hash() -> None:
    key = "k" * 64
    sql = identifier_hash_sql("$account", "$identifier")
    row = duckdb.sql(
        f"select {sql}", params={"key": key, "account": "acct", "identifier": "user-1"}
    )
    assert row.fetchone() == (identifier_hash(key, "acct", "user-1"),)


def test_dropped_events_are_kept_per_account_and_bounded(
    paths: DataPaths, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = RegulationStore(paths)
    now = time.time()
    old = now - (regulations.DROPPED_KEEP_DAYS * 86400 + 60)
    # A row kept twice (a segment rolled again) is one; rows past the days are forgotten.
    rows = [("acct", "e-old", "suppress", old), *[("acct", "e-1", "no_track", now)] * 2]
    assert store.record_dropped(rows) == 2
    assert store.dropped("acct", "e-old") is None
    assert store.dropped("acct", "e-1") == "no_track"
    assert store.dropped("other", "e-1") is None
    # At most DROPPED_MAX_ROWS: the oldest go first.
    monkeypatch.setattr(regulations, "DROPPED_MAX_ROWS", 2)
    store.record_dropped([("acct", f"e-{i}", "suppress", now) for i in (2, 3)])
    assert [store.dropped("acct", f"e-{i}") for i in (1, 2, 3)] == [None, "suppress", "suppress"]
    store.close()
