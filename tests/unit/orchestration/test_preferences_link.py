"""The link to the customer's hosted preferences page in messages: the page's query parameter is
the one the server reads (MALLARD_PREFS_QUERY_PARAM)."""

from __future__ import annotations

import pytest

from mallard.settings import get_settings
from orchestration.delivery.dispatch import preferences_url


def test_the_link_names_the_page_s_query_parameter(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MALLARD_PREFS_QUERY_PARAM", raising=False)
    get_settings.cache_clear()
    try:
        assert preferences_url("http://h:1", "ab c") == "http://h:1/content?s=ab%20c"
        monkeypatch.setenv("MALLARD_PREFS_QUERY_PARAM", "sub")
        get_settings.cache_clear()
        assert (
            preferences_url("http://h:1", "abc", "news")
            == "http://h:1/content?sub=abc&utm_campaign=news"
        )
    finally:
        get_settings.cache_clear()
