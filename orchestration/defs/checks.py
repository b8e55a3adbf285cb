"""The marts' health checks (events against stored messages, freshness against the landing files,
duplicates rate) and the marts' freshness policy: what the asset pages of the UI show.

The checks are one step reading one snapshot (orchestration/mart_checks.py) and run in every pass
after the models (pass_subset selects them), in the daemon's runs, `mallard pipeline run` and the
watcher alike; a failed one is recorded in the Dagster instance as the asset's check result.
"""
# No `from __future__ import annotations`: Dagster reads the context type hints at runtime.

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import dagster as dg

from orchestration.mart_checks import MAX_DUPLICATES_RATE, MAX_LAG_S, marts_health
from orchestration.resources import LakeResource, LakeWriterResource

# dagster-dbt keys a model by its schema and name.
EVENTS = dg.AssetKey(["marts", "events"])
FRESHNESS = dg.AssetKey(["marts", "freshness"])
DUPLICATES = dg.AssetKey(["marts", "duplicates"])

EVENTS_MATCH = dg.AssetCheckSpec(
    "events_match_stored_messages",
    asset=EVENTS,
    description="Every stored message the last pass took is an event or an extra copy counted "
    "in duplicates: events = stored messages - sum(duplicates.duplicate_count).",
)
LANDING_LAG = dg.AssetCheckSpec(
    "marts_reflect_landing_files",
    asset=FRESHNESS,
    description=f"No landing file has waited more than {MAX_LAG_S // 60} minutes to reach the "
    "marts (loaded and built by a pass).",
)
DUPLICATES_RATE = dg.AssetCheckSpec(
    "duplicates_rate",
    asset=DUPLICATES,
    description=f"At most {MAX_DUPLICATES_RATE:.0%} of the stored messages are extra copies "
    "(client retries); more warns of a client retrying in a loop.",
)
MART_CHECKS = [EVENTS_MATCH, LANDING_LAG, DUPLICATES_RATE]
MART_CHECK_KEYS = frozenset(spec.key for spec in MART_CHECKS)

# A pass builds these tables (views are built only when the project changes, so none is here):
# the policy says a pass finished within the window. The daemon evaluates it and the UI shows it
# as the asset's freshness. Passes run on new landing files and on the schedule
# pass_every_15_minutes; an install whose only passes are a watcher's and that receives nothing
# for an hour shows a warning though nothing waits (marts_reflect_landing_files says whether
# data does).
MARTS_FRESHNESS = dg.FreshnessPolicy.time_window(
    fail_window=timedelta(hours=24), warn_window=timedelta(hours=1)
)
FRESHNESS_POLICY_ON = frozenset({EVENTS, FRESHNESS, DUPLICATES})


def with_freshness_policy(spec: dg.AssetSpec) -> dg.AssetSpec:
    if spec.key in FRESHNESS_POLICY_ON:
        return dg.apply_freshness_policy(spec, MARTS_FRESHNESS)
    return spec


@dg.multi_asset_check(
    name="marts_health",
    specs=MART_CHECKS,
    description="The marts against the stored messages and the landing files, in one snapshot.",
)
def marts_health_checks(
    lake: LakeResource, writer: LakeWriterResource
) -> Iterator[dg.AssetCheckResult]:
    """The checks read what the pass's build wrote, in the same writer's turn."""
    health = marts_health(lake.paths)
    if health is None:  # no pass has built the marts: nothing to hold them to yet
        for spec in MART_CHECKS:
            yield dg.AssetCheckResult(
                asset_key=spec.asset_key,
                check_name=spec.name,
                passed=True,
                metadata={"built": False},
            )
        return
    built: dict[str, Any] = {"pass_id": health.pass_id, "built_at": str(health.built_at)}
    yield dg.AssetCheckResult(
        asset_key=EVENTS,
        check_name=EVENTS_MATCH.name,
        passed=health.events_match,
        severity=dg.AssetCheckSeverity.ERROR,
        description=None
        if health.events_match
        else f"{health.events} events, {health.expected_events} expected",
        metadata={
            **built,
            "events": health.events,
            "stored_messages": health.stored,
            "extra_copies": health.extra_copies,
            "expected_events": health.expected_events,
            "difference": health.events - health.expected_events,
        },
    )
    yield dg.AssetCheckResult(
        asset_key=FRESHNESS,
        check_name=LANDING_LAG.name,
        passed=health.fresh,
        severity=dg.AssetCheckSeverity.WARN,
        description=None
        if health.fresh
        else f"{health.waiting_files} landing files not in the marts, the oldest for "
        f"{health.oldest_waiting_s:.0f} s",
        metadata={
            **built,
            "data_through": str(health.data_through),
            "landing_files": health.landing_files,
            "waiting_files": health.waiting_files,
            "oldest_waiting_s": round(health.oldest_waiting_s, 1),
            "max_lag_s": MAX_LAG_S,
            "newest_landing_file": health.newest_landing or "",
        },
    )
    ok = health.duplicates_rate <= MAX_DUPLICATES_RATE
    yield dg.AssetCheckResult(
        asset_key=DUPLICATES,
        check_name=DUPLICATES_RATE.name,
        passed=ok,
        severity=dg.AssetCheckSeverity.WARN,
        description=None
        if ok
        else f"{health.duplicates_rate:.1%} of stored messages are extra copies",
        metadata={
            **built,
            "duplicates_rate": round(health.duplicates_rate, 6),
            "max_rate": MAX_DUPLICATES_RATE,
            "extra_copies": health.extra_copies,
            "stored_messages": health.stored,
        },
    )
