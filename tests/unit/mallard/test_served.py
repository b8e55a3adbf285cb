"""The base of the links in messages: MALLARD_PUBLIC_URL, else the address the server listens on."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from mallard import served
from mallard.paths import DataPaths
from mallard.settings import Settings


def test_the_address_the_server_listens_on_is_the_default_link_base(tmp_path: Path) -> None:
    paths = DataPaths(tmp_path / "data")
    settings = Settings(data_dir=paths.root, port=8000)
    assert served.address(paths) is None
    assert served.link_base(settings, paths) == "http://127.0.0.1:8000"  # no server yet

    served.record(paths, "127.0.0.1", 41234)
    assert served.address(paths) == "http://127.0.0.1:41234"
    assert served.link_base(settings, paths) == "http://127.0.0.1:41234"

    public = replace(settings, public_url="https://crm.example.com/")
    assert served.link_base(public, paths) == "https://crm.example.com"


def test_a_wildcard_bind_is_linked_through_loopback() -> None:
    assert served.url("0.0.0.0", 8000) == "http://127.0.0.1:8000"
    assert served.url("::", 8000) == "http://[::1]:8000"
    assert served.url("::1", 9) == "http://[::1]:9"
    assert served.url("10.0.0.7", 80) == "http://10.0.0.7:80"
