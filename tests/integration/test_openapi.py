"""The OpenAPI document at /schema/openapi.json: valid OpenAPI 3.1, typed bodies whose examples
the server accepts, and error answers whose real bodies match the documented schemas; and 413
naming the limit for a body over the server's request limit."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import pytest
from openapi_spec_validator import validate

from tests.conftest import Server, free_port, init_data_dir

pytestmark = pytest.mark.integration

MAX_BODY = 64 * 1024  # the server's request limit in this module
INGEST = "/track/{clientId}/{accountId}/{BRANDID}/v1/{action}"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    data = tmp_path_factory.mktemp("openapi") / "data"
    srv = Server(
        data,
        free_port(),
        init_data_dir(data),
        env={"MALLARD_MAX_BODY_BYTES": str(MAX_BODY), "MALLARD_ROLL_INTERVAL_S": "0.3"},
    )
    srv.start()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def doc(server: Server) -> dict[str, Any]:
    r = httpx.get(f"{server.url}/schema/openapi.json", timeout=30)
    assert r.status_code == 200, r.text
    return dict(r.json())


def op(doc: dict[str, Any], operation_id: str) -> dict[str, Any]:
    found = [
        o
        for item in doc["paths"].values()
        for o in item.values()
        if isinstance(o, dict) and o.get("operationId") == operation_id
    ]
    assert len(found) == 1, operation_id
    return found[0]


def resolve(doc: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    ref = schema.get("$ref")
    return dict(doc["components"]["schemas"][ref.rsplit("/", 1)[1]]) if ref else schema


def check(doc: dict[str, Any], schema: dict[str, Any], value: Any) -> None:
    """Validate a value against a schema of the document, its $refs resolved in the document."""
    jsonschema.Draft202012Validator({**schema, "components": doc["components"]}).validate(value)


def body_schema(doc: dict[str, Any], operation_id: str) -> dict[str, Any]:
    return dict(op(doc, operation_id)["requestBody"]["content"]["application/json"]["schema"])


def error_schema(doc: dict[str, Any], operation_id: str, status: int) -> dict[str, Any]:
    response = op(doc, operation_id)["responses"][str(status)]
    return dict(response["content"]["application/json"]["schema"])


def test_the_document_is_valid_openapi_3_1(doc: dict[str, Any]) -> None:
    assert doc["openapi"].startswith("3.1")
    validate(doc)  # raises on any violation of the OpenAPI 3.1 schema
    # Every operation says what it answers: no bare "string" where JSON is sent.
    for path, item in doc["paths"].items():
        for method, o in item.items():
            content = o["responses"]["200"].get("content", {})
            if "application/json" in content:
                assert content["application/json"]["schema"] != {"type": "string"}, (path, method)


def test_the_track_call_is_typed(doc: dict[str, Any]) -> None:
    schema = body_schema(doc, "ingest")
    # The action in the path picks the shape, and a body may fit several: anyOf, not oneOf.
    calls = {resolve(doc, s)["title"]: resolve(doc, s) for s in schema["anyOf"]}
    assert set(calls) == {"IdentifyCall", "TrackCall", "PageCall", "ScreenCall", "BatchCall"}
    track = calls["TrackCall"]
    assert track["required"] == ["event"]
    assert track["properties"]["event"]["type"] == "string"
    assert track["properties"]["event"]["minLength"] == 1
    assert {"type": "string"} in track["properties"]["userId"]["oneOf"]
    assert {"type": "object", "additionalProperties": {}} in track["properties"]["properties"][
        "oneOf"
    ]
    check(doc, schema, {"userId": "u-1", "event": "Clicked"})
    with pytest.raises(jsonschema.ValidationError):
        check(doc, {"$ref": "#/components/schemas/TrackCall"}, {"userId": "u-1"})
    identify = calls["IdentifyCall"]
    assert set(identify["required"]) == {"event", "traits"}
    assert identify["properties"]["event"]["const"] == "identify"


def test_error_answers_are_the_real_bodies(doc: dict[str, Any]) -> None:
    ingest_400 = resolve(doc, error_schema(doc, "ingest", 400))
    assert set(ingest_400["required"]) == {"success", "message"}
    assert ingest_400["properties"]["success"]["const"] is False
    read_401 = resolve(doc, error_schema(doc, "listEvents", 401))
    assert read_401["required"] == ["error"]
    for operation_id in ("ingest", "segmentTrack", "tagBatch", "mobileBatch"):
        assert {"400", "403", "413", "429"} <= set(op(doc, operation_id)["responses"])
    assert {"400", "404", "429"} <= set(op(doc, "updateMarketingPreferences")["responses"])


def _action(example: dict[str, Any]) -> str:
    if "batch" in example:
        return "batch"
    return (
        str(example["event"])
        if example.get("event") in ("identify", "page")
        else ("track" if "event" in example else "screen")
    )


def test_the_examples_are_accepted(server: Server, doc: dict[str, Any]) -> None:
    examples = body_schema(doc, "ingest")["examples"]
    assert sorted(_action(e) for e in examples) == sorted(
        ["identify", "track", "page", "screen", "batch"]
    )
    for example in examples:
        r = server.post(_action(example), example)
        assert r.status_code == 200, (example, r.text)
        check(
            doc,
            op(doc, "ingest")["responses"]["200"]["content"]["application/json"]["schema"],
            r.json(),
        )
    key = (server.creds["writeKey"], "")
    for example in body_schema(doc, "segmentTrack")["examples"]:
        r = httpx.post(f"{server.url}/v1/{example['type']}", json=example, auth=key, timeout=30)
        assert r.status_code == 200, (example, r.text)
    for example in body_schema(doc, "mobileBatch")["examples"]:
        example = {**example, "writeKey": server.creds["writeKey"]}
        r = httpx.post(f"{server.url}/cdp/events/std/mobile/batch", json=example, timeout=30)
        assert r.status_code == 200, (example, r.text)


def test_real_errors_match_their_documented_schemas(server: Server, doc: dict[str, Any]) -> None:
    url = server.base
    cases: list[tuple[str, int, httpx.Response]] = [
        ("ingest", 400, server.post("track", {"event": "no user"})),
        ("ingest", 403, httpx.post(f"{url}/track", json={"userId": "u", "event": "e"})),
        ("ingest", 404, server.post("trak", {"userId": "u", "event": "e"})),
        ("ingest", 413, server.post("track", {"userId": "u", "event": "e", "p": "x" * 40_000})),
        ("segmentTrack", 403, httpx.post(f"{server.url}/v1/track", json={"userId": "u"})),
        ("listEvents", 400, server.get("events", params={"sise": "1"})),
        ("listEvents", 401, httpx.get(f"{url}/events")),
        ("getProfileTraits", 400, server.get("profiles/nobody/traits")),
    ]
    for operation_id, status, r in cases:
        assert r.status_code == status, (operation_id, r.text)
        check(doc, error_schema(doc, operation_id, status), r.json())


# --- the server's request limit --------------------------------------------------------------


def _too_big(server: Server) -> bytes:
    return b'{"userId":"u","event":"e","p":"' + b"x" * MAX_BODY + b'"}'


def test_a_body_over_the_limit_gets_413_naming_it_on_ingestion(server: Server) -> None:
    body = _too_big(server)
    declared = httpx.post(f"{server.base}/track", content=body, headers=server.headers, timeout=30)

    def chunks() -> Iterator[bytes]:  # no content-length: Litestar counts while it reads
        for i in range(0, len(body), 8192):
            yield body[i : i + 8192]

    streamed = httpx.post(
        f"{server.base}/track", content=chunks(), headers=server.headers, timeout=30
    )
    for r in (declared, streamed):
        assert r.status_code == 413, r.text
        assert r.json() == {
            "success": False,
            "message": f"the request body exceeds the limit of {MAX_BODY} bytes",
        }


def test_a_body_over_the_limit_gets_413_naming_it_on_the_read_api(server: Server) -> None:
    r = httpx.request(
        "GET", f"{server.base}/events", content=_too_big(server), headers=server.headers, timeout=30
    )
    assert r.status_code == 413, r.text
    assert r.json() == {
        "error": {
            "code": "invalid_request_error",
            "message": f"the request body exceeds the limit of {MAX_BODY} bytes",
        }
    }
    r = httpx.post(
        f"{server.url}/cdp/marketing-preferences/some-id", content=_too_big(server), timeout=30
    )
    assert r.status_code == 413 and str(MAX_BODY) in r.json()["error"]["message"], r.text


def test_a_body_within_the_limit_is_not_refused(server: Server, tmp_path: Path) -> None:
    batch = {"batch": [{"type": "track", "userId": "u", "event": "e", "p": "x" * 20_000}] * 3}
    r = server.post("batch", batch)
    assert r.status_code == 200, r.text
