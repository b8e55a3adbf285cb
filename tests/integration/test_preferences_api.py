"""Marketing preferences API against a real server and pipeline.

Two pipeline runs for the module: one to create the customers (subscription ids come from the
warehouse), one after the updates, to see them as events, traits and model state.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from orchestration.context import subscription_id
from tests.conftest import wait_landed
from tests.integration.prefs_support import PREFERENCES_TOML, PrefsEnv, start_prefs_env

pytestmark = pytest.mark.integration

USERS: dict[str, dict[str, Any]] = {
    "fresh": {"email": "fresh@example.com"},
    "errors": {"email": "errors@example.com"},
    "ryw": {"email": "ryw@example.com"},
    "unsub": {"email": "unsub@example.com"},
    "resub": {"email": "resub@example.com"},
    # Set by the identify path first; the API changes it later.
    "mix": {
        "email": "mix@example.com",
        "marketingPreferences": {"channels": [{"channel": "sms", "subscribed": True}]},
    },
    "late": {"email": "late@example.com"},
}
CHANNELS = [("email", "Email"), ("sms", "SMS"), ("push", "Push notifications")]
CATEGORIES = [
    ("Weekly News", "weekly_news"),
    ("Product Updates", "product_updates"),
    ("Offers & Deals", "offers"),
]


def _channels(on: set[str]) -> list[dict[str, Any]]:
    return [{"channel": c, "name": n, "subscribed": c in on} for c, n in CHANNELS]


def _categories(off: set[str]) -> list[dict[str, Any]]:
    return [{"category": d, "name": n, "subscribed": n not in off} for d, n in CATEGORIES]


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrefsEnv]:
    yield from start_prefs_env(tmp_path_factory.mktemp("prefs-api"), USERS)


@pytest.fixture(scope="module")
def updates(env: PrefsEnv) -> dict[str, Any]:
    """Every update of the module, with what the API answered before the next pipeline run,
    then one pipeline run."""
    seen: dict[str, Any] = {}
    p = env.post(
        "ryw",
        {
            "channels": [{"channel": "email", "subscribed": True}],
            "categories": [{"category": "offers", "subscribed": False}],
        },
        "CAMP-1",
    )
    seen["ryw_post1"], seen["ryw_get1"] = p, env.get("ryw")
    p = env.post("ryw", {"categories": [{"category": "weekly_news", "subscribed": False}]})
    seen["ryw_post2"], seen["ryw_get2"] = p, env.get("ryw")

    env.post("unsub", {"channels": [{"channel": "sms", "subscribed": True}]})
    seen["unsub_post"] = env.post(
        "unsub",
        {
            "categories": [],
            "channels": [],
            "unsubscribeAll": True,
            "unsubscribeReason": "Too many emails",
        },
        "CAMP-2",
    )
    seen["unsub_get"] = env.get("unsub")

    env.post("resub", {"categories": [], "channels": [], "unsubscribeAll": True})
    seen["resub_post"] = env.post("resub", {"channels": [{"channel": "push", "subscribed": True}]})

    # mix: the identify set sms on; the API turns it off and email on; a later identify's
    # channels array (replaced whole) turns email off and push on.
    seen["mix_get0"] = env.get("mix")
    seen["mix_post"] = env.post(
        "mix",
        {
            "channels": [
                {"channel": "sms", "subscribed": False},
                {"channel": "email", "subscribed": True},
            ]
        },
    )
    mix_id = env.identify(
        "mix",
        {
            "marketingPreferences": {
                "channels": [
                    {"channel": "email", "subscribed": False},
                    {"channel": "push", "subscribed": True},
                ]
            }
        },
    )

    # late: the API turns email on; an identify that arrives afterwards but is dated a day
    # earlier does not win, since the latest change by event time wins.
    seen["late_post"] = env.post("late", {"channels": [{"channel": "email", "subscribed": True}]})
    day_ago = (datetime.now(UTC) - timedelta(days=1)).isoformat().replace("+00:00", "Z")
    late_id = env.identify(
        "late",
        {
            "marketingPreferences": {
                "channels": [
                    {"channel": "email", "subscribed": False},
                    {"channel": "push", "subscribed": True},
                ]
            }
        },
        timestamp=day_ago,
    )
    wait_landed(env.server.data_dir, [mix_id, late_id])
    env.server.pipeline()
    return seen


def _error(r: httpx.Response, status: int, code: str, *needles: str) -> None:
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/json")
    err = r.json()["error"]
    assert err["code"] == code
    for needle in needles:
        assert needle in err["message"], (needle, err["message"])


def test_resource_has_every_field_and_the_defaults(env: PrefsEnv) -> None:
    r = env.get("fresh")
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("application/json")
    body = r.json()
    assert set(body) == {"writeKey", "customerId", "channels", "categories", "unsubscribeAll"}
    assert body["writeKey"] == env.server.creds["writeKey"]
    assert body["customerId"] == env.customer_ids["fresh"]
    # Channels are opt-in, categories opt-out, in the configured order.
    assert body["channels"] == _channels(set())
    assert body["categories"] == _categories(set())
    assert body["unsubscribeAll"] is False


def test_subscription_id_is_an_hmac_of_the_customer_and_never_listed(env: PrefsEnv) -> None:
    secret = (env.server.data_dir / "secret.key").read_text().strip()
    sid = env.sids["fresh"]
    assert sid == subscription_id(secret, env.customer_ids["fresh"])
    profiles = env.server.get("profiles").json()["data"]
    assert profiles and sid not in str(profiles)
    events = env.server.get("events/").json()["data"]
    assert sid not in str(events)


def test_identify_trait_sets_channels(env: PrefsEnv) -> None:
    # USERS["mix"] was identified with marketingPreferences.channels [sms on].
    assert env.get("mix").json()["channels"] == _channels({"sms"})


def test_hosted_page_link_takes_the_id_in_query_s_or_the_path(env: PrefsEnv) -> None:
    for url in (
        f"{env.server.url}/content?s={env.sids['fresh']}",
        f"{env.server.url}/content/{env.sids['fresh']}",
    ):
        r = httpx.get(url)
        assert r.status_code == 200, r.text
        assert r.headers["content-type"].startswith("text/html")
        assert 'id="ch-email"' in r.text and "Offers &amp; Deals" in r.text


def test_unknown_subscription_id_is_404(env: PrefsEnv) -> None:
    base = f"{env.server.url}/cdp/marketing-preferences"
    for sid in (secrets.token_hex(32), "not-an-id", env.sids["fresh"].upper()):
        _error(httpx.get(f"{base}/{sid}"), 404, "not_found")
        body = {"channels": [{"channel": "email", "subscribed": True}]}
        _error(httpx.post(f"{base}/{sid}", json=body), 404, "not_found")


@pytest.mark.parametrize(
    ("body", "needles"),
    [
        ({"categories": [{"category": "nope_cat", "subscribed": False}]}, ["nope_cat"]),
        ({"categories": [{"category": "Weekly News", "subscribed": False}]}, ["Weekly News"]),
        ({"channels": [{"channel": "fax", "subscribed": True}]}, ["fax"]),
        # An interface channel the account does not offer.
        ({"channels": [{"channel": "whatsapp", "subscribed": True}]}, ["whatsapp"]),
        ({"channels": {"email": True}}, ["channels"]),
        ({"channels": [{"channel": "email", "subscribed": "yes"}]}, ["subscribed"]),
        ({"channels": [{"channel": "email"}]}, ["subscribed"]),
        ({"channels": ["email"]}, ["channels[0]"]),
        ({"categories": "offers"}, ["categories"]),
        ({"unsubscribeAll": "true"}, ["unsubscribeAll"]),
        ({"unsubscribeAll": True, "unsubscribeReason": 5}, ["unsubscribeReason"]),
        (
            {"unsubscribeAll": True, "channels": [{"channel": "sms", "subscribed": True}]},
            ["unsubscribeAll"],
        ),
        ({"chanels": []}, ["chanels"]),
        ({}, ["nothing to update"]),
        ([], ["object"]),
        (
            {
                "channels": [
                    {"channel": "sms", "subscribed": True},
                    {"channel": "sms", "subscribed": False},
                ]
            },
            ["sms", "twice"],
        ),
    ],
)
def test_invalid_update_is_400_naming_the_problem(
    env: PrefsEnv, body: Any, needles: list[str]
) -> None:
    before = env.get("errors").json()
    _error(env.post("errors", body), 400, "invalid_request_error", *needles)
    assert env.get("errors").json() == before


def test_body_that_is_not_json_is_400(env: PrefsEnv) -> None:
    r = httpx.post(
        env.url("errors"), content=b"{nope", headers={"content-type": "application/json"}
    )
    _error(r, 400, "invalid_request_error", "JSON")


def test_rate_limited_like_the_other_endpoints(server_factory: Any) -> None:
    srv = server_factory(env={"MALLARD_RATE_PER_SECOND": "0.01", "MALLARD_RATE_BURST": "3"})
    url = f"{srv.url}/cdp/marketing-preferences/{secrets.token_hex(32)}"
    statuses = [httpx.get(url).status_code for _ in range(3)]
    assert statuses == [404, 404, 404]
    r = httpx.get(url)
    _error(r, 429, "rate_limit_error")
    assert int(r.headers["retry-after"]) >= 1
    # The hosted page shares the budget: guessing ids there is no cheaper.
    assert httpx.get(f"{srv.url}/content", params={"s": secrets.token_hex(32)}).status_code == 429


def test_update_answers_the_new_state_and_reads_it_back_before_any_pipeline_run(
    updates: dict[str, Any],
) -> None:
    post1 = updates["ryw_post1"]
    assert post1.status_code == 200, post1.text
    assert post1.json()["channels"] == _channels({"email"})
    assert post1.json()["categories"] == _categories({"offers"})
    assert updates["ryw_get1"].json() == post1.json()
    # Fields left out of an update keep their values.
    post2 = updates["ryw_post2"]
    assert post2.status_code == 200, post2.text
    assert post2.json()["channels"] == _channels({"email"})
    assert post2.json()["categories"] == _categories({"offers", "weekly_news"})
    assert updates["ryw_get2"].json() == post2.json()


def test_unsubscribe_from_everything(updates: dict[str, Any]) -> None:
    r = updates["unsub_post"]
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["unsubscribeAll"] is True
    assert body["channels"] == _channels(set())
    assert body["categories"] == _categories({n for _, n in CATEGORIES})
    assert updates["unsub_get"].json() == body
    # Opting in to something again ends unsubscribe-all; the rest stays off.
    resub = updates["resub_post"].json()
    assert resub["unsubscribeAll"] is False
    assert resub["channels"] == _channels({"push"})
    assert resub["categories"] == _categories({n for _, n in CATEGORIES})


def _events(env: PrefsEnv, user: str) -> list[dict[str, Any]]:
    r = env.server.get(f"profiles/userId:{user}/events", params={"sort": "asc", "size": 100})
    assert r.status_code == 200, r.text
    return list(r.json()["data"])


def test_updates_are_events_after_the_pipeline(env: PrefsEnv, updates: dict[str, Any]) -> None:
    ryw = [e for e in _events(env, "ryw") if e["eventAction"] == "preferences_updated"]
    assert len(ryw) == 2
    first = ryw[0]["rawData"]
    assert first["userId"] == "ryw"
    assert first["properties"]["assetId"] == "CAMP-1"
    assert first["properties"]["channels"] == [{"channel": "email", "subscribed": True}]
    assert first["properties"]["categories"] == [{"category": "offers", "subscribed": False}]
    assert "assetId" not in ryw[1]["rawData"]["properties"]

    unsub = env.server.get("events/", params={"include": "unsubscribed"}).json()["data"]
    assert [e["userId"] for e in unsub] == ["resub", "unsub"]
    props = next(e for e in unsub if e["userId"] == "unsub")["rawData"]["properties"]
    assert props["assetId"] == "CAMP-2"
    assert props["reason"] == "Too many emails"
    assert props["unsubscribeAll"] is True
    # Rejected updates left nothing behind.
    assert not [e for e in _events(env, "errors") if e["eventAction"] != "identify"]


def test_traits_and_metadata_show_marketing_preferences(
    env: PrefsEnv, updates: dict[str, Any]
) -> None:
    want = {
        "channels": [{"channel": "email", "subscribed": True}],
        "categories": [
            {"category": "offers", "subscribed": False},
            {"category": "weekly_news", "subscribed": False},
        ],
        "unsubscribeAll": False,
    }
    traits = env.server.get("profiles/userId:ryw/traits").json()
    assert traits["marketingPreferences"] == want
    meta = env.server.get("profiles/userId:ryw/meta").json()
    assert meta["marketingPreferences"] == want
    unsub = env.server.get("profiles/userId:unsub/traits").json()["marketingPreferences"]
    assert unsub["unsubscribeAll"] is True
    assert {c["channel"] for c in unsub["channels"] if not c["subscribed"]} >= {
        "email",
        "sms",
        "push",
    }
    assert env.server.get("profiles/userId:fresh/traits").json()["marketingPreferences"] == {
        "channels": [],
        "categories": [],
        "unsubscribeAll": False,
    }


def test_warehouse_state_after_the_pipeline_equals_what_was_read_before(
    env: PrefsEnv, updates: dict[str, Any]
) -> None:
    assert env.get("ryw").json() == updates["ryw_get2"].json()
    assert env.get("unsub").json() == updates["unsub_get"].json()
    assert env.get("resub").json() == updates["resub_post"].json()


def test_latest_change_by_event_time_wins_whichever_path(
    env: PrefsEnv, updates: dict[str, Any]
) -> None:
    # API after identify: the POST turned the identify's sms off, email on.
    assert updates["mix_get0"].json()["channels"] == _channels({"sms"})
    assert updates["mix_post"].json()["channels"] == _channels({"email"})
    # Identify after API: its array is the whole channel list, so email off, push on, sms off.
    mix = env.get("mix").json()
    assert mix["channels"] == _channels({"push"})
    traits = env.server.get("profiles/userId:mix/traits").json()["marketingPreferences"]
    assert {c["channel"]: c["subscribed"] for c in traits["channels"]} == {
        "email": False,
        "sms": False,
        "whatsapp": False,
        "facebook": False,
        "push": True,
    }
    # An identify dated before the API change loses on the keys both set, whatever the arrival
    # order, and still sets what the later change did not touch.
    assert updates["late_post"].json()["channels"] == _channels({"email"})
    assert env.get("late").json()["channels"] == _channels({"email", "push"})


def test_new_choices_apply_to_everyone_with_their_defaults(
    env: PrefsEnv, updates: dict[str, Any]
) -> None:
    path: Path = env.config_dir / "preferences.toml"
    added = PREFERENCES_TOML.replace('name = "offers" }]', 'name = "offers" }, "Flash Sales"]')
    added = added.replace(
        'channels = ["email", "sms", "push"]', 'channels = ["email", "sms", "push", "whatsapp"]'
    )
    assert added != PREFERENCES_TOML
    try:
        path.write_text(added)
        os.utime(path, ns=(1, 2))  # a distinct mtime even within the file system's resolution
        for user in ("fresh", "ryw"):
            body = env.get(user).json()
            assert body["categories"][-1] == {
                "category": "Flash Sales",
                "name": "flash_sales",
                "subscribed": True,
            }
            assert body["channels"][-1] == {
                "channel": "whatsapp",
                "name": "WhatsApp",
                "subscribed": False,
            }
        assert (
            env.post(
                "fresh", {"categories": [{"category": "flash_sales", "subscribed": False}]}
            ).status_code
            == 200
        )
    finally:
        path.write_text(PREFERENCES_TOML)
        os.utime(path, ns=(3, 4))
