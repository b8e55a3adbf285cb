"""The collector's rules for regulated subjects (Suppress, NoTrack) and its view of the lists."""

from __future__ import annotations

import asyncio
import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import msgspec
import pytest

from collector.admission import (
    Admission,
    Regulated,
    Snapshot,
    admit_regulated,
    is_dropped_record,
    metrics_admitted,
    records,
)
from collector.messages import Tenant, stamp
from mallard.errors import Unavailable
from mallard.paths import DataPaths
from mallard.regulations import (
    AdmissionLists,
    Generation,
    ListsUnavailable,
    RegulationStore,
    identifier_hash,
)

KEY = "k" * 64
ACCOUNT = "acct-adm"
TENANT = Tenant("client-adm", ACCOUNT, "BRAND-ADM")
SUPPRESSED_USER, SUPPRESSED_ANON = "adm-suppressed-user-7f3a", "adm-suppressed-anon-7f3a"
QUIET_USER, QUIET_ANON = "adm-notrack-user-1c9e", "adm-notrack-anon-1c9e"
OTHER_USER = "adm-other-user-55d0"


def _h(identifier: str, account: str = ACCOUNT) -> str:
    return identifier_hash(KEY, account, identifier)


SNAPSHOT = Snapshot(
    generation=1,
    key=KEY,
    accounts={
        ACCOUNT: Regulated(
            suppress=frozenset({_h(SUPPRESSED_USER), _h(SUPPRESSED_ANON)}),
            no_track=frozenset({_h(QUIET_USER), _h(QUIET_ANON)}),
        )
    },
)


def _kept(channel: str, *items: tuple[str, dict[str, Any]]) -> list[bool]:
    drops = admit_regulated(SNAPSHOT, TENANT, channel, list(items))
    assert drops is not None
    return [reason is None for reason in drops]


CALLS: list[tuple[str, dict[str, Any]]] = [
    ("identify", {"event": "identify", "traits": {"plan": "pro"}}),
    ("track", {"event": "Order Completed"}),
    ("track", {"event": "send_email", "assetId": "welcome"}),
    ("page", {"event": "page"}),
    ("screen", {"name": "Home"}),
    ("group", {"groupId": "g1"}),
    ("alias", {"previousId": "adm-prev-0"}),
]


@pytest.mark.parametrize("channel", ["server", "browser", "mobile"])
@pytest.mark.parametrize(
    "ids",
    [
        {"userId": SUPPRESSED_USER},
        {"anonymousId": SUPPRESSED_ANON},
        {"userId": "adm-new-login-of-suppressed", "anonymousId": SUPPRESSED_ANON},
        {"userId": SUPPRESSED_USER, "anonymousId": "adm-fresh-anon"},
    ],
)
def test_suppress_drops_every_call_on_every_channel(channel: str, ids: dict[str, str]) -> None:
    items = [(kind, {**msg, **ids}) for kind, msg in CALLS]
    assert _kept(channel, *items) == [False] * len(CALLS)


def test_an_alias_from_a_suppressed_anonymous_id_is_dropped() -> None:
    alias = ("alias", {"userId": "adm-someone-new", "previousId": SUPPRESSED_ANON})
    assert _kept("server", alias) == [False]


@pytest.mark.parametrize("ids", [{"userId": QUIET_USER}, {"anonymousId": QUIET_ANON}])
@pytest.mark.parametrize(
    ("channel", "expected"),
    [
        # identify, track, command, page, screen, group, alias
        ("server", [True, False, True, False, False, True, True]),
        ("mobile", [True, False, True, False, False, True, True]),
        ("browser", [False, False, True, False, False, True, True]),
    ],
)
def test_no_track(channel: str, expected: list[bool], ids: dict[str, str]) -> None:
    items = [(kind, {**msg, **ids}) for kind, msg in CALLS]
    assert _kept(channel, *items) == expected


@pytest.mark.parametrize(
    "event",
    ["send_email", "SEND_SMS", "Send_Print", "send_PUSH", "START_JOURNEY", "start_journey"],
)
def test_commands_pass_no_track_in_any_case(event: str) -> None:
    for channel in ("server", "browser", "mobile"):
        assert _kept(channel, ("track", {"userId": QUIET_USER, "event": event})) == [True]


@pytest.mark.parametrize("event", ["send_emails", "Send Email", "email_opened", "journey"])
def test_other_track_events_are_dropped_by_no_track(event: str) -> None:
    assert _kept("server", ("track", {"userId": QUIET_USER, "event": event})) == [False]


def test_identify_of_no_track_dropped_from_the_tag_kept_from_the_api() -> None:
    identify = ("identify", {"userId": QUIET_USER, "traits": {"plan": "pro"}})
    assert _kept("browser", identify) == [False]
    assert _kept("server", identify) == [True]
    assert _kept("mobile", identify) == [True]


def test_suppress_wins_over_a_command() -> None:
    command = ("track", {"userId": SUPPRESSED_USER, "event": "send_email", "assetId": "a"})
    assert _kept("server", command) == [False]


def test_other_users_and_accounts_pass() -> None:
    items = [(kind, {**msg, "userId": OTHER_USER}) for kind, msg in CALLS]
    assert _kept("browser", *items) == [True] * len(CALLS)
    # The hashes are keyed by account: the same userId in another account is not listed.
    other_account = Tenant("client-adm", "acct-adm-other", "BRAND")
    track = [("track", {"userId": SUPPRESSED_USER, "event": "E"})]
    assert admit_regulated(SNAPSHOT, other_account, "server", track) is None


def test_a_batch_logs_a_record_of_each_dropped_item_in_order() -> None:
    items: list[tuple[str, dict[str, Any]]] = [
        ("track", {"userId": OTHER_USER, "event": "A"}),
        ("track", {"userId": SUPPRESSED_USER, "event": "B"}),
        ("track", {"userId": OTHER_USER, "event": "C"}),
        ("page", {"anonymousId": QUIET_ANON}),
    ]
    drops = admit_regulated(SNAPSHOT, TENANT, "browser", items)
    assert drops == [None, "suppress", None, "no_track"]
    at = datetime(2026, 3, 1, 12, tzinfo=UTC)
    stamped = [
        stamp(k, m, TENANT, channel="browser", source="tag", received=at, request_ip=None)
        for k, m in items
    ]
    logged = records(stamped, drops)
    assert logged[0] is stamped[0] and logged[2] is stamped[2]
    # A dropped item's record: its eventId and time, the list, nothing of the call itself.
    assert logged[1] == [
        "dropped",
        "suppress",
        ACCOUNT,
        stamped[1]["eventId"],
        stamped[1]["receivedAt"],
    ]
    assert logged[3][:2] == ["dropped", "no_track"]
    encoded = [msgspec.json.encode(r) for r in logged]
    assert [is_dropped_record(r) for r in encoded] == [False, True, False, True]
    assert SUPPRESSED_USER.encode() not in encoded[1] and QUIET_ANON.encode() not in encoded[3]
    assert records(stamped, None) is stamped


def test_metrics_with_a_regulated_identifier_are_dropped() -> None:
    analytics_js = {
        "series": [
            {
                "type": "Counter",
                "metric": "analytics_js.invoke",
                "value": 1,
                "tags": {"method": "track", "library": "analytics.js"},
            }
        ]
    }
    assert metrics_admitted(SNAPSHOT, analytics_js)
    for carrier in (
        {"series": [{"tags": {"anonymousId": SUPPRESSED_ANON}}]},
        {"series": [{"tags": [f"anon:{SUPPRESSED_ANON}"]}]},
        {"note": f"https://shop.example/?uid={QUIET_USER}&x=1"},
        {SUPPRESSED_USER: 1},
    ):
        assert not metrics_admitted(SNAPSHOT, carrier), carrier
    assert metrics_admitted(SNAPSHOT, {"series": [{"tags": {"anonymousId": OTHER_USER}}]})
    assert metrics_admitted(Snapshot(1, "", {}), {"anonymousId": SUPPRESSED_ANON})


# --- the lists as the collector sees them -----------------------------------------------------


def _paths(tmp_path: Path) -> DataPaths:
    return DataPaths(tmp_path / "data")


def _admit(admission: Admission, msg: dict[str, Any]) -> list[bool] | None:
    return asyncio.run(admission.admit(TENANT, "server", [("track", msg)]))


def test_admission_follows_the_store_from_the_moment_file_returns(tmp_path: Path) -> None:
    paths = _paths(tmp_path)
    store = RegulationStore(paths)
    admission = Admission(AdmissionLists(paths, retry_s=0.2))
    track = {"userId": SUPPRESSED_USER, "event": "E"}
    by_anon = {"anonymousId": SUPPRESSED_ANON, "event": "E"}
    assert _admit(admission, track) is None
    store.file("client-adm", ACCOUNT, "BRAND-ADM", "SUPPRESS", [SUPPRESSED_USER],
               {SUPPRESSED_USER: [SUPPRESSED_ANON]})  # fmt: skip
    assert _admit(admission, track) == ["suppress"]
    assert _admit(admission, by_anon) == ["suppress"]
    assert _admit(admission, {"userId": OTHER_USER, "event": "E"}) == [None]
    store.file("client-adm", ACCOUNT, "BRAND-ADM", "UNSUPPRESS", [SUPPRESSED_USER])
    assert _admit(admission, track) is None


def test_admission_fails_closed_while_the_lists_cannot_be_read(tmp_path: Path) -> None:
    paths = _paths(tmp_path)
    store = RegulationStore(paths)
    store.file("client-adm", ACCOUNT, "BRAND-ADM", "NO_TRACK", [QUIET_USER])
    admission = Admission(AdmissionLists(paths, retry_s=0.2))
    track = {"userId": OTHER_USER, "event": "E"}
    assert _admit(admission, track) == [None]
    store.compact()  # everything in the main file: a reader must read it
    good = paths.regulations_db.read_bytes()
    with open(paths.regulations_db, "r+b") as f:
        f.write(os.urandom(len(good)))
    Generation(paths.regulations_generation).bump()
    for _ in range(2):
        with pytest.raises(Unavailable) as e:
            _admit(admission, track)
        assert e.value.status == 503
    assert not asyncio.run(admission.admits_metrics({"series": []}))
    with open(paths.regulations_db, "r+b") as f:
        f.write(good)
    Generation(paths.regulations_generation).bump()
    assert _admit(admission, track) == [None]
    assert _admit(admission, {"userId": QUIET_USER, "event": "E"}) == ["no_track"]


def test_one_load_serves_every_call_waiting_for_it(tmp_path: Path) -> None:
    paths = _paths(tmp_path)
    RegulationStore(paths).file("client-adm", ACCOUNT, "BRAND-ADM", "SUPPRESS", [SUPPRESSED_USER])
    lists = AdmissionLists(paths)
    loads = 0
    load = lists.current

    def counting() -> Any:
        nonlocal loads
        loads += 1
        return load()

    lists.current = counting  # type: ignore[method-assign]
    admission = Admission(lists)

    async def many() -> list[list[bool] | None]:
        msg = {"userId": SUPPRESSED_USER, "event": "E"}
        return await asyncio.gather(
            *(admission.admit(TENANT, "server", [("track", msg)]) for _ in range(20))
        )

    assert asyncio.run(many()) == [["suppress"]] * 20
    assert loads == 1


def test_the_lists_load_again_on_the_same_thread_once_the_file_is_restored(
    tmp_path: Path,
) -> None:
    """A SQLite connection that read a broken file keeps failing after the file is restored;
    AdmissionLists opens the store anew after a failure."""
    paths = _paths(tmp_path)
    store = RegulationStore(paths)
    store.file("client-adm", ACCOUNT, "BRAND-ADM", "SUPPRESS", [SUPPRESSED_USER])
    lists = AdmissionLists(paths, retry_s=0.2)
    assert lists.current().suppress[ACCOUNT]
    store.compact()
    good = paths.regulations_db.read_bytes()
    with open(paths.regulations_db, "r+b") as f:
        f.write(os.urandom(len(good)))
    Generation(paths.regulations_generation).bump()
    with pytest.raises(ListsUnavailable):
        lists.current()
    with open(paths.regulations_db, "r+b") as f:
        f.write(good)
    Generation(paths.regulations_generation).bump()
    assert lists.current().suppress[ACCOUNT] == {lists.hash(ACCOUNT, SUPPRESSED_USER)}
