"""The moving transaction's check that nothing moved an instance since it was read: an
instance as stored (by any earlier version's JSON spacing) is equal to itself."""

from __future__ import annotations

import sqlite3

from orchestration.delivery import journeys as jr


def test_an_unchanged_instance_reads_back_as_the_same_state() -> None:
    conn = sqlite3.connect(":memory:")
    jr.ensure_schema(conn)
    row = (
        "i1", "j", "a", "c", "B", "cust", "u", None, "cmd", "{}", "pause",
        '{"pause": 1}',  # spaced, as json.dumps wrote it before msgspec
        100.0, 100.0, 3700.0, "active", None, 100.0, 100.0, None,
    )  # fmt: skip
    conn.execute(f"insert into journey_instances values ({', '.join('?' * len(row))})", row)
    [inst] = jr.load(conn, ["i1"])
    assert jr.states(conn, ["i1"]) == {"i1": jr.state(inst)}
    conn.execute("update journey_instances set visits = '{\"pause\":2}' where instance_id = 'i1'")
    assert jr.states(conn, ["i1"]) != {"i1": jr.state(inst)}  # moved meanwhile
