"""Served and full passes, from real passes in this process against temporary lakes: a served
pass builds the marts the read API answers from (the same rows a full pass gives them) and leaves
the rest to the next full pass, which continues after the last full pass and ends with the marts
of a lake that only ever had full passes; after served passes it builds only the rest and leaves
the served models as the served passes built them (after a served part, when they lack
anything); the watcher runs a full pass first, served passes while files keep landing, and a
full pass once they stop."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import dagster as dg

from mallard.harness import copy_data_dir
from mallard.paths import DataPaths
from orchestration.defs.ingest import PIPELINE
from orchestration.load import load_new_files
from orchestration.pipeline import Part, StepResult, pass_parts, run_pipeline
from orchestration.window import PASS_KIND_TAG, PassKind
from tests.reliability.test_crashes import lake_rows, marts_state
from tests.unit.orchestration.test_load import write_landing
from tests.unit.orchestration.test_pass_in_dagster import watch_passes

SERVED_MARTS = ["marts.events", "marts.customer_profiles", "marts.customer_identifiers"]


def _ok(steps: list[StepResult]) -> list[StepResult]:
    assert all(step.ok for step in steps), steps
    return steps


def _manifest(paths: DataPaths) -> list[tuple[Any, ...]]:
    return lake_rows(
        paths.root,
        "select pass_id, kind, loaded_after, loaded_through from lake.state.pass_manifest"
        " order by pass_id",
    )


def test_a_served_pass_serves_and_the_next_full_pass_completes(tmp_path: Path) -> None:
    served, full = DataPaths(tmp_path / "served"), DataPaths(tmp_path / "full")
    write_landing(served, events=300, seed=1)
    _ok(run_pipeline(served.root))  # the first pass: full, every test
    copy_data_dir(served.root, full.root)  # the same secret: the same subscription ids
    for paths in (served, full):
        write_landing(paths, events=300, seed=2)

    steps = _ok(run_pipeline(served.root, kind=PassKind.SERVED))
    names = [step.name for step in steps]
    assert names[0] == "served" and "marts health" not in names and "dispatch" not in names
    dbt = next(step.summary for step in steps if step.name == "dbt build")
    assert "data tests" not in dbt, dbt  # no test runs in a served pass
    _ok(run_pipeline(full.root))
    after_served, after_full = marts_state(served.root), marts_state(full.root)
    # What the read API answers from: the same as after a full pass of the same messages.
    for table in SERVED_MARTS:
        assert after_served[table] == after_full[table], table
    # The rest waits for the next full pass: the new client retries are not in duplicates yet.
    assert after_served["marts.duplicates"] != after_full["marts.duplicates"]
    (first, _, _, first_through), (second, kind, _, _) = _manifest(served)
    assert kind == "served"
    assert lake_rows(served.root, "select pass_id, full_pass_id from lake.marts.freshness") == [
        (second, first)
    ]

    _ok(run_pipeline(served.root))
    *_, (third, kind, after, _) = _manifest(served)
    assert (kind, after) == ("full", first_through)  # after the last full pass, not the served
    assert lake_rows(served.root, "select pass_id, full_pass_id from lake.marts.freshness") == [
        (third, third)
    ]
    assert marts_state(served.root) == marts_state(full.root)


def _materialized(paths: DataPaths) -> set[str]:
    """The assets the newest pipeline run materialized."""
    with dg.DagsterInstance.from_config(str(paths.dagster_home)) as instance:
        (run,) = instance.get_runs(dg.RunsFilter(job_name=PIPELINE), limit=1)
        return {
            "/".join(e.dagster_event.asset_key.path)  # type: ignore[union-attr]
            for e in instance.all_logs(run.run_id)
            if e.dagster_event and e.dagster_event.is_step_materialization
        }


def test_a_full_pass_after_served_passes_builds_the_rest(tmp_path: Path) -> None:
    served, full = DataPaths(tmp_path / "served"), DataPaths(tmp_path / "full")
    write_landing(served, events=300, seed=1)
    _ok(run_pipeline(served.root))
    copy_data_dir(served.root, full.root)
    for paths in (served, full):
        write_landing(paths, events=200, seed=2)
    _ok(run_pipeline(served.root, kind=PassKind.SERVED))
    for paths in (served, full):
        write_landing(paths, events=200, seed=3)
    _ok(run_pipeline(served.root, kind=PassKind.SERVED))
    before = marts_state(served.root)
    _ok(run_pipeline(full.root))

    assert pass_parts(served, PassKind.FULL) == [Part(PassKind.FULL, rest=True)]
    steps = _ok(run_pipeline(served.root))
    names = [step.name for step in steps]
    assert names[0] == "full" and "load" not in names, names
    assert "marts health" in names and "dispatch" in names, names  # what follows a full pass
    dbt = next(step.summary for step in steps if step.name == "dbt build")
    assert "data tests passed" in dbt, dbt
    built = _materialized(served)
    assert "marts/commands" in built and "intermediate/int_customers_changed" in built, built
    assert not {
        "marts/events",
        "marts/customer_profiles",
        "intermediate/int_messages_identified",
    } & (built), built
    (
        (first, _, _, first_through),
        *_,
        (served_pass, _, _, through),
        (rest, kind, after, rest_through),
    ) = _manifest(served)
    # After the last full pass, through the served passes' end: nothing loaded since.
    assert (kind, after, rest_through) == ("full", first_through, through)
    assert lake_rows(served.root, "select pass_id, full_pass_id from lake.marts.freshness") == [
        (rest, rest)
    ]
    after_rest = marts_state(served.root)
    for table in SERVED_MARTS:  # left as the served passes built them
        assert after_rest[table] == before[table], table
    assert before["marts.duplicates"] != after_rest["marts.duplicates"]
    # Every table as on the lake that only had full passes of the same messages, and the
    # customers the rest read as changed: every one since the last full pass, as a full pass
    # over the same messages gives (journeys fold or rebuild each of them). A served pass may
    # have seen a customer lose a message the full pass saw only in its new place: the rest
    # rebuilds it rather than folding (the same rows, the safe way), never the reverse.
    assert after_rest == marts_state(full.root)
    changed = "select customer_id, rebuild from lake.intermediate.int_customers_changed"
    rest_changed, full_changed = (dict(lake_rows(p.root, changed)) for p in (served, full))
    assert rest_changed.keys() == full_changed.keys()
    assert {c for c, rebuild in full_changed.items() if rebuild} <= {
        c for c, rebuild in rest_changed.items() if rebuild
    }

    # The next served pass continues after the rest pass; the next full one too.
    write_landing(served, events=50, seed=4)
    _ok(run_pipeline(served.root, kind=PassKind.SERVED))
    *_, (_, kind, after, _) = _manifest(served)
    assert (kind, after) == ("served", rest_through)
    assert served_pass < rest


def test_a_full_pass_first_serves_what_the_served_marts_lack(tmp_path: Path) -> None:
    paths = DataPaths(tmp_path)
    write_landing(paths, events=100, seed=1)
    _ok(run_pipeline(paths.root))
    assert pass_parts(paths, PassKind.FULL) == [Part(PassKind.FULL)]  # no served pass since
    write_landing(paths, events=50, seed=2)
    _ok(run_pipeline(paths.root, kind=PassKind.SERVED))
    rest = Part(PassKind.FULL, rest=True)
    assert pass_parts(paths, PassKind.FULL) == [rest]
    # Files that landed but are not loaded yet: a served part loads them first.
    write_landing(paths, events=50, seed=3)
    assert pass_parts(paths, PassKind.FULL) == [Part(PassKind.SERVED), rest]
    # Loaded by a pass that failed before its models: the served marts lack them, so a served
    # part takes them first too.
    assert load_new_files(paths).files
    assert pass_parts(paths, PassKind.FULL) == [Part(PassKind.SERVED), rest]
    steps = _ok(run_pipeline(paths.root))
    assert [s.name for s in steps if s.name in ("served", "full")] == ["served", "full"], steps
    *_, (_, served_kind, _, through), (_, kind, _, rest_through) = _manifest(paths)
    assert (served_kind, kind, rest_through) == ("served", "full", through)
    # Every model holds every loaded message: nothing is left for another part.
    assert pass_parts(paths, PassKind.FULL) == [Part(PassKind.FULL)]


def test_the_watcher_serves_between_full_passes(tmp_path: Path) -> None:
    paths = DataPaths(tmp_path)
    # After the second (served) pass nothing lands: the full pass comes once it is due, and
    # builds only the rest (the served pass took every loaded message).
    reports = watch_passes(paths, passes=3, full_every_s=2.0)
    assert [_ok(steps)[0].name for steps in reports][1:] == ["served", "full"]
    assert "load" not in [step.name for step in reports[2]]
    with dg.DagsterInstance.from_config(str(paths.dagster_home)) as instance:
        runs = list(reversed(instance.get_runs(dg.RunsFilter(job_name=PIPELINE))))
        assert [run.tags[PASS_KIND_TAG] for run in runs] == ["full", "served", "full"]
    assert [kind for _, kind, _, _ in _manifest(paths)] == ["full", "served", "full"]
