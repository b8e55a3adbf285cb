"""Assets as code: loading config/assets, rendering, the collector's catalog of commands, and
`mallard assets check`."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mallard.assets import (
    Asset,
    AssetError,
    RenderError,
    load_assets,
    load_assets_and_errors,
    render,
)
from mallard.commands import COMMANDS, CommandCatalog, command_of
from mallard.config import REPO_CONFIG
from mallard.errors import InvalidRequest

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
def config(tmp_path: Path) -> Path:
    """A copy of the repository's config/."""
    dest = tmp_path / "config"
    shutil.copytree(REPO_CONFIG, dest)
    return dest


def sample(config: Path, asset_id: str) -> dict[str, object]:
    data: dict[str, object] = json.loads((config / "assets" / asset_id / "sample.json").read_text())
    return data


def test_repository_assets_load(config: Path) -> None:
    assets = load_assets(config)
    assert {"welcome", "newsletter", "reset_code", "offer_push", "letter", "reminder"} <= set(
        assets
    )
    assert (assets["reminder"].kind, assets["reminder"].category) == (
        "marketing",
        "product_updates",
    )
    welcome = assets["welcome"]
    assert (welcome.channel, welcome.kind, welcome.category) == ("email", "transactional", None)
    assert welcome.sender and welcome.subject
    assert set(welcome.templates) == {"body.html.ftl", "body.txt.ftl"}
    news = assets["newsletter"]
    assert (news.kind, news.category) == ("marketing", "weekly_news")
    assert set(assets["reset_code"].templates) == {"body.txt.ftl"}
    assert set(assets["offer_push"].templates) == {"body.txt.ftl"}
    assert set(assets["letter"].templates) == {"body.html.ftl"}
    assert {a.channel for a in assets.values()} == {"email", "sms", "push", "print"}


def test_render_newsletter(config: Path) -> None:
    news = load_assets(config)["newsletter"]
    out = render(news, sample(config, "newsletter"))
    assert out.subject == "This week at Mallard: No. 42"
    assert out.html is not None and out.text is not None
    assert "Ducks &amp; lakes" in out.html and "Why &lt;warehouses&gt; float" in out.html
    assert "Ducks & lakes" in out.text
    assert out.links == [
        "https://example.com/news/ducks?a=1&b=2",
        "https://example.com/news/release",
    ]
    quiet = render(news, {"customer": {}})
    assert "A quiet week" in (quiet.html or "")
    assert "Hi there" in (quiet.text or "")
    assert quiet.subject == "This week at Mallard"


def test_render_each_channel(config: Path) -> None:
    assets = load_assets(config)
    page = "http://127.0.0.1:8000/content?s=sub_1"
    welcome = render(
        assets["welcome"], {"customer": {"firstName": "<Ada>"}, "preferencesUrl": page}
    )
    assert welcome.subject == "Welcome, <Ada>"
    assert "Hi &lt;Ada&gt;," in (welcome.html or "")
    assert (welcome.text or "").startswith("Hi <Ada>,")
    assert welcome.links[-1] == page and f"Your preferences: {page}" in (welcome.text or "")
    sms = render(assets["reset_code"], {"code": "123", "customer": {}})
    assert sms.text == "Hi there, your reset code is 123. It expires in 10 minutes.\n"
    assert (sms.html, sms.links) == (None, [])
    with pytest.raises(RenderError) as e:
        render(assets["reset_code"], {"customer": {}})
    assert (e.value.variable, e.value.line, e.value.template) == (
        "code",
        2,
        "reset_code/body.txt.ftl",
    )
    push = render(assets["offer_push"], {"customer": {}})
    assert (push.subject, push.text) == ("10% off for you", "Hey, take 10% off until Sunday.\n")
    letter = render(assets["letter"], {"customer": {"firstName": "Ada"}})
    assert letter.text is None and "Dear Ada" in (letter.html or "")


def test_subject_is_one_line() -> None:
    asset = Asset("a", "email", "transactional", None, "Hi\r\n${x}", "f@example.com", {})
    assert render(asset, {"x": "Bcc: evil\r\nmore"}).subject == "Hi Bcc: evil more"


def write_asset(config: Path, asset_id: str, toml: str, files: dict[str, str]) -> Path:
    d = config / "assets" / asset_id
    d.mkdir(parents=True, exist_ok=True)
    (d / "asset.toml").write_text(toml)
    for name, body in files.items():
        (d / name).write_text(body)
    return d


EMAIL = {"body.html.ftl": "<p>${x!}</p>", "body.txt.ftl": "${x!}"}


@pytest.mark.parametrize(
    ("toml", "files", "message"),
    [
        ('channel = "fax"\nkind = "transactional"', {}, "channel must be one of"),
        ('channel = "sms"\nkind = "other"', {}, "kind must be one of"),
        ('channel = "sms"\nkind = "marketing"', {"body.txt.ftl": "x"}, "needs a category"),
        (
            'channel = "sms"\nkind = "marketing"\ncategory = "Nope"',
            {"body.txt.ftl": "x"},
            "'Nope' is not in preferences.toml",
        ),
        ('channel = "sms"\nkind = "transactional"', {}, "body.txt.ftl is missing"),
        ('channel = "email"\nkind = "transactional"\nfrom = "a@b"', EMAIL, "needs a subject"),
        (
            'channel = "email"\nkind = "transactional"\nsubject = "s"\nfrom = "a@b"',
            {"body.txt.ftl": "x"},
            "body.html.ftl is missing",
        ),
        ('channel = "sms"\nkind = "transactional"\ncolour = 1', {}, "unknown keys colour"),
        ("channel = ", {}, "asset.toml:"),
    ],
)
def test_bad_assets(config: Path, toml: str, files: dict[str, str], message: str) -> None:
    write_asset(config, "broken", toml, files)
    with pytest.raises(AssetError, match=message) as e:
        load_assets(config)
    assert e.value.asset_id == "broken"


def test_a_broken_asset_does_not_hide_the_others(config: Path) -> None:
    write_asset(config, "broken", 'channel = "sms"\nkind = "transactional"', {})
    assets, broken = load_assets_and_errors(config)
    assert "welcome" in assets and "broken" not in assets
    assert list(broken) == ["broken"] and "body.txt.ftl is missing" in str(broken["broken"])
    with pytest.raises(AssetError, match="body.txt.ftl is missing"):
        load_assets(config)


def test_marketing_category_by_display_or_name(config: Path) -> None:
    for i, category in enumerate(("Offers", "product_updates")):
        write_asset(
            config,
            f"m{i}",
            f'channel = "sms"\nkind = "marketing"\ncategory = "{category}"',
            {"body.txt.ftl": "x"},
        )
    assets = load_assets(config)
    assert (assets["m0"].category, assets["m1"].category) == ("offers", "product_updates")


def test_load_assets_follows_edits(config: Path) -> None:
    d = write_asset(
        config, "edited", 'channel = "sms"\nkind = "transactional"', {"body.txt.ftl": "one"}
    )
    assert load_assets(config)["edited"].templates["body.txt.ftl"] == "one"
    assert load_assets(config) == load_assets(config)
    (d / "body.txt.ftl").write_text("two, longer")
    assert load_assets(config)["edited"].templates["body.txt.ftl"] == "two, longer"
    shutil.rmtree(d)
    assert "edited" not in load_assets(config)


def test_no_assets_dir(tmp_path: Path) -> None:
    assert load_assets(tmp_path) == {}


def test_command_names() -> None:
    assert {"send_email", "send_sms", "send_print", "send_push", "start_journey"} == COMMANDS
    assert command_of("SEND_EMAIL") == "send_email"
    assert command_of("Start_Journey") == "start_journey"
    assert command_of("send email") is None
    assert command_of(None) is None


def test_catalog_checks_commands(config: Path) -> None:
    (config / "journeys").mkdir(exist_ok=True)
    (config / "journeys" / "onboarding.toml").write_text('name = "Onboarding"\n')
    catalog = CommandCatalog(config)
    catalog.check("send_email", {"assetId": "welcome"})
    catalog.check("send_sms", {"assetId": "reset_code"})
    catalog.check("send_push", {"assetId": "offer_push"})
    catalog.check("send_print", {"assetId": "letter"})
    catalog.check("start_journey", {"properties": {"journeyIdToTrigger": "onboarding"}})
    cases = [
        ("send_email", {}, '"assetId" is required for send_email'),
        ("send_email", {"assetId": ""}, '"assetId" is required'),
        ("send_email", {"assetId": 3}, '"assetId" is required'),
        ("send_email", {"assetId": "nope"}, "unknown asset 'nope'"),
        (
            "send_sms",
            {"assetId": "welcome"},
            "'welcome' is an email asset; send_sms sends sms assets",
        ),
        ("start_journey", {}, '"properties.journeyIdToTrigger" is required'),
        ("start_journey", {"properties": {"journeyIdToTrigger": "x"}}, "unknown journey 'x'"),
    ]
    for command, msg, message in cases:
        with pytest.raises(InvalidRequest) as e:
            catalog.check(command, msg, "batch[2]: ")
        assert message in str(e.value) and str(e.value).startswith("batch[2]: ")


def test_catalog_reloads_at_most_once_a_second(config: Path) -> None:
    # The catalog's clock is the test's: "within the interval" and "after it" hold by
    # construction, however long the file writes and checks take on this host.
    now = [1000.0]
    catalog = CommandCatalog(config, recheck_s=0.3, clock=lambda: now[0])
    with pytest.raises(InvalidRequest):
        catalog.check("send_sms", {"assetId": "fresh"})
    write_asset(config, "fresh", 'channel = "sms"\nkind = "transactional"', {"body.txt.ftl": "x"})
    # Within the interval the files are not looked at.
    now[0] += 0.29
    with pytest.raises(InvalidRequest):
        catalog.check("send_sms", {"assetId": "fresh"})
    now[0] += 0.35
    catalog.check("send_sms", {"assetId": "fresh"})
    # A changed channel is seen too (the mtime moved on, so the stat signature differs even
    # where the file system's timestamps are coarse).
    toml = config / "assets" / "fresh" / "asset.toml"
    toml.write_text('channel = "push"\nkind = "transactional"\n')
    os.utime(toml, ns=(time.time_ns(), time.time_ns() + 10**9))
    now[0] += 0.35
    with pytest.raises(InvalidRequest, match="is a push asset"):
        catalog.check("send_sms", {"assetId": "fresh"})
    toml.write_text("broken =")
    os.utime(toml, ns=(time.time_ns(), time.time_ns() + 2 * 10**9))
    now[0] += 0.35
    with pytest.raises(InvalidRequest, match="does not load"):
        catalog.check("send_push", {"assetId": "fresh"})


def run_check(config: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mallard.cli", "assets", "check", "--config-dir", str(config)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )


def test_assets_check_cli(config: Path) -> None:
    done = run_check(config)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 6
    assert all(line.startswith("ok") for line in lines)
    assert any("newsletter" in line and "2 links" in line for line in lines)
    # No sample.json: the built-in sample customer is used.
    (config / "assets" / "welcome" / "sample.json").unlink()
    assert run_check(config).returncode == 0
    # A missing value and a bad asset fail, each on its own line; the others still pass.
    (config / "assets" / "reset_code" / "sample.json").write_text('{"customer": {}}')
    write_asset(config, "zz_bad", 'channel = "sms"\nkind = "transactional"', {})
    done = run_check(config)
    assert done.returncode == 1
    lines = done.stdout.splitlines()
    assert len(lines) == 7
    bad = [line for line in lines if line.startswith("FAIL")]
    assert len(bad) == 2
    assert "reset_code/body.txt.ftl line 2: code is missing" in bad[0]
    assert "zz_bad" in bad[1] and "body.txt.ftl is missing" in bad[1]
