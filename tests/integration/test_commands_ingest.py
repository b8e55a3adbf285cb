"""Commands at ingestion on a real `mallard serve`: a send_* needs a known assetId of its
channel and start_journey a known journey (and a step of it when stepIdToTrigger names one), on
every route, in any case; the config dir is `$MALLARD_CONFIG_DIR` (a copy of the repository's
config/), re-read when it changes."""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from mallard.config import REPO_CONFIG
from tests.conftest import Server

pytestmark = pytest.mark.integration


@pytest.fixture
def config(tmp_path: Path) -> Path:
    dest = tmp_path / "config"
    shutil.copytree(REPO_CONFIG, dest)
    (dest / "journeys").mkdir(exist_ok=True)
    (dest / "journeys" / "onboarding.toml").write_text(
        'name = "Onboarding"\n[[steps]]\nid = "hello"\ntype = "send"\nasset = "welcome"\n'
    )
    return dest


@pytest.fixture
def srv(server_factory: Any, config: Path) -> Server:
    server: Server = server_factory(env={"MALLARD_CONFIG_DIR": str(config)})
    return server


def rejected(r: httpx.Response, *words: str) -> str:
    assert r.status_code == 400, r.text
    body = r.json()
    assert body["success"] is False
    for word in words:
        assert word in body["message"], body["message"]
    return str(body["message"])


USER = {"userId": "cmd-user"}


def test_valid_commands_are_accepted_in_any_case(srv: Server) -> None:
    for body in (
        {**USER, "event": "send_email", "assetId": "welcome", "plan": "pro"},
        {**USER, "event": "SEND_EMAIL", "assetId": "newsletter", "items": []},
        {**USER, "event": "Send_Sms", "assetId": "reset_code", "code": "123456"},
        {**USER, "event": "send_push", "assetId": "offer_push"},
        {**USER, "event": "SEND_PRINT", "assetId": "letter"},
        {**USER, "event": "start_journey", "properties": {"journeyIdToTrigger": "onboarding"}},
        {
            **USER,
            "event": "start_journey",
            "properties": {"journeyIdToTrigger": "welcome_series"},
        },
        {
            **USER,
            "event": "Start_Journey",
            "properties": {"journeyIdToTrigger": "welcome_series", "stepIdToTrigger": "nudge"},
        },
    ):
        r = srv.post("track", body)
        assert r.status_code == 200, (body, r.text)
        assert r.json()["success"] is True and r.json()["eventId"]
    # An ordinary track is untouched.
    assert srv.post("track", {**USER, "event": "Viewed send_email page"}).status_code == 200


def test_invalid_commands_get_400_naming_the_field(srv: Server) -> None:
    rejected(srv.post("track", {**USER, "event": "send_email"}), '"assetId"', "send_email")
    rejected(srv.post("track", {**USER, "event": "SEND_SMS", "assetId": ""}), '"assetId"')
    rejected(
        srv.post("track", {**USER, "event": "send_email", "assetId": "no_such"}),
        '"assetId"',
        "'no_such'",
    )
    rejected(
        srv.post("track", {**USER, "event": "send_sms", "assetId": "welcome"}),
        "'welcome' is an email asset",
        "send_sms",
    )
    rejected(
        srv.post("track", {**USER, "event": "send_push", "assetId": "letter"}),
        "print asset",
    )
    rejected(
        srv.post("track", {**USER, "event": "start_journey"}),
        '"properties.journeyIdToTrigger" is required',
    )
    rejected(
        srv.post(
            "track", {**USER, "event": "START_JOURNEY", "properties": {"journeyIdToTrigger": "x"}}
        ),
        '"properties.journeyIdToTrigger"',
        "unknown journey 'x'",
    )
    rejected(
        srv.post(
            "track",
            {
                **USER,
                "event": "start_journey",
                "properties": {"journeyIdToTrigger": "welcome_series", "stepIdToTrigger": "x"},
            },
        ),
        '"properties.stepIdToTrigger"',
        "unknown step 'x' of journey 'welcome_series'",
    )
    rejected(
        srv.post(
            "track",
            {
                **USER,
                "event": "start_journey",
                "properties": {"journeyIdToTrigger": "welcome_series", "stepIdToTrigger": 1},
            },
        ),
        '"properties.stepIdToTrigger"',
    )


def test_batch_names_the_item_and_accepts_nothing(srv: Server) -> None:
    batch = [
        {**USER, "type": "track", "event": "send_email", "assetId": "welcome"},
        {**USER, "type": "track", "event": "Viewed"},
        {**USER, "type": "track", "event": "send_print", "assetId": "nope"},
    ]
    rejected(srv.post("batch", {"batch": batch}), "batch[2]", '"assetId"', "'nope'")
    r = srv.post("batch", {"batch": batch[:2]})
    assert r.status_code == 200 and len(r.json()["eventIds"]) == 2


def test_client_routes_check_commands_too(srv: Server) -> None:
    key = srv.creds["writeKey"]
    r = httpx.post(
        f"{srv.url}/v1/track",
        json={"writeKey": key, **USER, "event": "send_email", "assetId": "nope"},
        timeout=30,
    )
    rejected(r, '"assetId"', "'nope'")
    r = httpx.post(
        f"{srv.url}/cdp/events/std/t",
        json={"writeKey": key, "type": "track", **USER, "event": "send_sms"},
        timeout=30,
    )
    rejected(r, '"assetId" is required')
    r = httpx.post(
        f"{srv.url}/v1/batch",
        json={
            "writeKey": key,
            "batch": [{"type": "track", **USER, "event": "start_journey", "properties": {}}],
        },
        timeout=30,
    )
    rejected(r, "batch[0]", '"properties.journeyIdToTrigger"')
    r = httpx.post(
        f"{srv.url}/v1/track",
        json={"writeKey": key, **USER, "event": "send_push", "assetId": "offer_push"},
        timeout=30,
    )
    assert r.status_code == 200, r.text


def test_assets_added_while_serving_are_seen(srv: Server, config: Path) -> None:
    body = {**USER, "event": "send_sms", "assetId": "late"}
    rejected(srv.post("track", body), "'late'")
    d = config / "assets" / "late"
    d.mkdir()
    (d / "asset.toml").write_text('channel = "sms"\nkind = "transactional"\n')
    (d / "body.txt.ftl").write_text("hi\n")
    (config / "journeys" / "later.toml").write_text('name = "Later"\n')
    journey = {**USER, "event": "start_journey", "properties": {"journeyIdToTrigger": "later"}}
    deadline = time.monotonic() + 10
    while srv.post("track", body).status_code != 200:
        assert time.monotonic() < deadline, "the new asset was not seen"
        time.sleep(0.2)
    assert srv.post("track", journey).status_code == 200
    shutil.rmtree(d)
    deadline = time.monotonic() + 10
    while srv.post("track", body).status_code != 400:
        assert time.monotonic() < deadline, "the removed asset was still accepted"
        time.sleep(0.2)
