"""The Delete's search of the data dir's bytes: an identifier is found as a token, anywhere in
the data dir; in what dbt writes from the project (compiled unit tests carry their fixture rows)
only when the project's own source does not hold it."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest

from mallard.paths import DataPaths
from orchestration.context import DBT_DIR
from orchestration.regulations.verify import bytes_found

# A userId of the project's unit-test fixtures; a real user may have it too.
FIXTURE_USER = "u1"


def test_a_fixture_id_in_dbt_output_is_not_the_subject_but_elsewhere_it_is(tmp_path: Path) -> None:
    assert (
        f"user_id: {FIXTURE_USER}"
        in (DBT_DIR / "models/intermediate/_intermediate.yml").read_text()
    )
    paths = DataPaths(tmp_path / "data")
    compiled = paths.dbt_target / "compiled" / "mallard" / "int_identity_map.sql"
    compiled.parent.mkdir(parents=True)
    compiled.write_text(f"select '{FIXTURE_USER}' as user_id union all select 'subj-7f3a'")
    (paths.dbt_target.parent / "logs").mkdir()
    (paths.dbt_target.parent / "logs" / "dbt.log").write_text(f"given {FIXTURE_USER}")
    (paths.root / "notes.txt").write_text(f"{FIXTURE_USER} and subj-7f3a, not u12 or xsubj-7f3a")

    found = bytes_found(paths, [FIXTURE_USER, "subj-7f3a"])

    assert found == {"dbt/target/compiled/mallard/int_identity_map.sql": 1, "notes.txt": 2}
    assert bytes_found(paths, [FIXTURE_USER]) == {"notes.txt": 1}


def test_a_mailbox_message_is_searched_decoded_and_while_it_is_written(tmp_path: Path) -> None:
    paths = DataPaths(tmp_path / "data")
    paths.mailbox_dir.mkdir(parents=True)
    body = base64.encodebytes(b"Please forget subj-7f3a@example.test\n")
    raw = (
        b"To: support@example.test\r\nSubject: a request\r\nMIME-Version: 1.0\r\n"
        b"Content-Type: text/plain; charset=utf-8\r\nContent-Transfer-Encoding: base64\r\n\r\n"
    ) + body
    assert b"subj-7f3a" not in raw
    (paths.mailbox_dir / "00000000000000000001-1-000000.eml").write_bytes(raw)
    (paths.mailbox_dir / ".00000000000000000002-1-000001.eml.tmp").write_bytes(raw)

    found = bytes_found(paths, ["subj-7f3a@example.test"])

    assert found == {
        "mailbox/00000000000000000001-1-000000.eml": 1,
        "mailbox/.00000000000000000002-1-000001.eml.tmp": 1,
    }


def test_the_lake_search_reads_one_snapshot_while_a_pass_commits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """dbt makes and drops `__dbt_backup` tables as a pass runs beside a Delete's verification:
    a table listed must still be there when it is searched."""
    from orchestration.regulations import verify
    from orchestration.warehouse import lake_connection

    paths = DataPaths(tmp_path / "data")
    writer = lake_connection(paths)
    writer.execute("create schema if not exists lake.marts")
    writer.execute("create table lake.marts.events__dbt_backup as select 'subj-7f3a' as user_id")
    listing = verify.lake_tables

    def listed_then_dropped(conn: object) -> object:
        tables = listing(conn)
        writer.execute("drop table lake.marts.events__dbt_backup")  # the pass commits
        return tables

    monkeypatch.setattr(verify, "lake_tables", listed_then_dropped)
    reader = lake_connection(paths)
    try:
        assert verify.rows_remaining(reader, ["subj-7f3a"]) == {"marts.events__dbt_backup": 1}
    finally:
        reader.close()
        writer.close()
