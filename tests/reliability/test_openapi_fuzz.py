"""Schemathesis over the OpenAPI document the server serves: every operation, with valid
credentials and the demo tenant in the path, valid (positive) and invalid (negative) data.
Checks: no 5xx, every error JSON with a message, status codes, content types, response bodies
and headers as documented, invalid data refused (but where a leniency is documented, each in
LENIENT with the test that checks it instead).

Bounded by examples per operation and mode (MALLARD_FUZZ_EXAMPLES, default 12; make soak: 100).
"""

from __future__ import annotations

import os
import time
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import (
    content_type_conformance,
    negative_data_rejection,
    not_a_server_error,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from tests.reliability.conftest import FIGURES, Probe, error_problem
from tests.reliability.hostile import basic

pytestmark = [pytest.mark.reliability, pytest.mark.integration]

EXAMPLES = int(os.environ.get("MALLARD_FUZZ_EXAMPLES", "12"))
# Filing a valid regulation starts a run (a process of its own): only the soak files them.
FILE_REGULATIONS = os.environ.get("MALLARD_FUZZ_FILE_REGULATIONS", "0") == "1"
# Operations that answer 200 to data the document calls invalid, by design; each is checked by
# a test of its own.
LENIENT = {
    # analytics.js must never retry or log a metrics call: any body is answered
    # {"success": true} and a bad one dropped, not stored
    # (test_hostile_bodies.py::test_tag_metrics_drop_bad_bodies_and_answer_200).
    "tagMetrics": "any body is answered 200",
}
ACTIONS = ("identify", "track", "page", "screen", "batch")
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
    response_headers_conformance,
]


def test_every_operation_fuzzed(probe: Probe) -> None:
    schema = schemathesis.openapi.from_url(probe.server.url + "/schema/openapi.json")
    c = probe.server.creds
    tenant = {"clientId": c["clientId"], "accountId": c["accountId"], "BRANDID": c["brandId"]}
    # Both credentials on every request: the auth-token for the tenant routes, the writeKey as
    # the Basic user for the tag, mobile and Segment routes.
    hdrs = {**probe.server.headers, "authorization": basic(probe.write_key)["authorization"]}
    failures: dict[str, str] = {}
    counts: dict[str, int] = {}
    t0 = time.monotonic()
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 30, [op.label for op in operations]
    for op in operations:
        variants: list[dict[str, Any]] = [{}]
        params = {p.name for p in op.path_parameters}
        if "action" in params:
            variants = [{"action": a} for a in ACTIONS]
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            operation_id = op.definition.raw.get("operationId")
            positive = mode is GenerationMode.POSITIVE
            if operation_id == "fileRegulation" and positive and not FILE_REGULATIONS:
                continue
            for extra in variants:
                path = {k: v for k, v in {**tenant, **extra}.items() if k in params}
                label = f"{op.label} {extra or ''} {mode.value}".replace(" {}", "")
                counts[label] = 0
                started = time.monotonic()
                try:
                    _fuzz(op, mode, path, hdrs, counts, label, operation_id)
                except Unsatisfiable:  # nothing in the operation can be made invalid
                    pass
                except BaseException as e:  # every operation's finding, not the first only
                    if isinstance(e, KeyboardInterrupt):
                        raise
                    failures[label] = f"{type(e).__name__}: {str(e)[:1500]}"
                took_one = time.monotonic() - started
                print(f"{label}: {counts[label]} requests, {took_one:.1f} s")
    probe.healthy()
    took = time.monotonic() - t0
    FIGURES.notes.append(
        f"schemathesis: {len(operations)} operations, {len(counts)} operation/mode runs,"
        f" {sum(counts.values())} requests in {took:.0f} s ({EXAMPLES} examples each)"
    )
    assert not failures, "\n\n".join(f"{k}:\n{v}" for k, v in failures.items())


def _fuzz(
    op: Any,
    mode: GenerationMode,
    path: dict[str, str],
    hdrs: dict[str, str],
    counts: dict[str, int],
    label: str,
    operation_id: str,
) -> None:
    strategy = op.as_strategy(generation_mode=mode, path_parameters=path or None)
    checks = CHECKS
    if mode is GenerationMode.NEGATIVE and operation_id not in LENIENT:
        checks = [*CHECKS, negative_data_rejection]

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(case=strategy)
    def run(case: Any) -> None:
        if isinstance(case.body, dict):
            case.body.pop("writeKey", None)  # the Basic user names the account instead
        case.headers = {**(case.headers or {}), **hdrs}
        response = case.call(timeout=30)
        counts[label] += 1
        FIGURES.requests += 1
        FIGURES.statuses[response.status_code] += 1
        FIGURES.by_scenario["schemathesis"] += 1
        ctype = (response.headers.get("content-type") or [""])[0]
        problem = error_problem(response.status_code, ctype, response.content)
        assert problem is None, f"{case.method} {case.formatted_path}: {problem}"
        case.validate_response(response, checks=checks)

    run()
