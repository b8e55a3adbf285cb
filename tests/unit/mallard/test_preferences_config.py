from __future__ import annotations

import os
from pathlib import Path

import pytest

from mallard.preferences import (
    CHANNELS,
    Category,
    PreferencesConfigError,
    PreferencesConfigFile,
    category_name,
    parse,
)


@pytest.mark.parametrize(
    ("display", "name"),
    [
        ("Weekly News", "weekly_news"),
        ("Offers & Deals", "offers_deals"),
        ("  New-Arrivals!! ", "new_arrivals"),
        ("Top10 Picks", "top10_picks"),
    ],
)
def test_category_name(display: str, name: str) -> None:
    assert category_name(display) == name


CONFIG = """
[defaults]
categories = ["Weekly News"]

[clients.acme.accounts.shop]
channels = ["email", "sms"]
categories = ["Offers", { display = "Big & Bold", name = "big" }]

[clients.acme.accounts.shop.brands.OUTLET]
channels = ["push"]
"""


def test_accounts_override_defaults_and_brands_override_accounts() -> None:
    cfg = parse(CONFIG)
    assert cfg.for_brand("other", "x", "X").channels == tuple(CHANNELS)
    assert cfg.for_brand("other", "x", "X").categories == (Category("weekly_news", "Weekly News"),)
    shop = cfg.for_brand("acme", "shop", "SHOP")
    assert shop.channels == ("email", "sms")
    assert shop.categories == (Category("offers", "Offers"), Category("big", "Big & Bold"))
    outlet = cfg.for_brand("acme", "shop", "OUTLET")
    assert outlet.channels == ("push",)
    assert outlet.categories == shop.categories  # not set for the brand: the account's


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ('[defaults]\nchannels = ["fax"]', "fax"),
        ('[defaults]\ncategories = ["A b", "a-b"]', "'a_b' twice"),
        ('[defaults]\ncategories = [{ display = "X", name = "Not Valid" }]', "Not Valid"),
        ("[defaults]\ncategories = [1]", "display name"),
        ("[defaults\n", "preferences.toml"),
    ],
)
def test_bad_config_is_refused_naming_the_problem(text: str, needle: str) -> None:
    with pytest.raises(PreferencesConfigError, match=None) as e:
        parse(text)
    assert needle in str(e.value)


def test_file_is_reread_when_it_changes_and_a_bad_edit_keeps_the_last_good(tmp_path: Path) -> None:
    path = tmp_path / "preferences.toml"
    path.write_text('[defaults]\ncategories = ["One"]')
    f = PreferencesConfigFile(path)
    assert [c.name for c in f.get().defaults.categories] == ["one"]
    path.write_text('[defaults]\ncategories = ["One", "Two"]')
    os.utime(path, ns=(1, 1))
    assert [c.name for c in f.get().defaults.categories] == ["one", "two"]
    path.write_text('[defaults]\nchannels = ["fax"]')
    os.utime(path, ns=(2, 2))
    assert [c.name for c in f.get().defaults.categories] == ["one", "two"]


def test_missing_file_means_every_channel_and_no_categories(tmp_path: Path) -> None:
    cfg = PreferencesConfigFile(tmp_path / "none.toml").get()
    assert cfg.defaults.channels == tuple(CHANNELS) and cfg.defaults.categories == ()


def test_repository_config_parses() -> None:
    from mallard.config import REPO_CONFIG

    cfg = PreferencesConfigFile(REPO_CONFIG / "preferences.toml").get()
    assert cfg.for_brand("demo", "demo", "DEMO").categories
