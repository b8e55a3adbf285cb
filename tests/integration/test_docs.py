"""`mallard docs` on a lake a real pass built: every mart and every column of it described, and
the dbt docs site rendering in headless chromium with every request off loopback refused.

One module-scoped data dir (one server, one pass) and one `mallard docs` process serving it.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import httpx
import pytest

from mallard.harness import REPO
from tests.browser import chromium
from tests.conftest import Server, free_port, init_data_dir, wait_landed

pytestmark = pytest.mark.integration

MARTS = sorted(p.stem for p in (REPO / "dbt_project" / "models" / "marts").glob("*.sql"))
LOOPBACK = {"127.0.0.1", "localhost", "::1", "[::1]"}
# Any download would fail: dbt must not need the network to document the project.
OFFLINE = {"HTTP_PROXY": "http://127.0.0.1:9", "HTTPS_PROXY": "http://127.0.0.1:9"}


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("docs") / "data"
    srv = Server(d, free_port(), init_data_dir(d), env={"MALLARD_ROLL_INTERVAL_S": "0.2"})
    srv.start()
    try:
        ids = []
        for n in range(3):
            user = f"docs-user-{n}"
            traits = {"email": f"{user}@example.com"}
            for action, body in (
                ("identify", {"event": "identify", "userId": user, "traits": traits}),
                ("track", {"event": "Logged In", "userId": user, "messageId": f"m-{n}"}),
            ):
                r = srv.post(action, body)
                assert r.status_code == 200, r.text
                ids.append(r.json()["eventId"])
        wait_landed(d, ids)
        assert srv.pipeline().returncode == 0
    finally:
        srv.stop()
    return d


def start_docs(data_dir: Path, env: dict[str, str]) -> tuple[subprocess.Popen[str], str]:
    """`mallard docs --port P` (dbt docs generate, then the site) running: it and its URL."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "mallard.cli", "docs", "--port", str(port)],
        cwd=REPO,
        env={**os.environ, "MALLARD_DATA_DIR": str(data_dir), **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines: list[str] = []
    url: list[str] = []

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if m := re.match(r"dbt docs: (http://\S+)", line):
                url.append(m.group(1))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    for _ in range(1200):  # the URL is printed once the site is generated and bound
        if url or proc.poll() is not None:
            break
        reader.join(0.1)
    if not url:
        proc.terminate()
        proc.wait(30)
    assert url, f"mallard docs printed no URL (exit {proc.poll()}):\n{''.join(lines)}"
    assert url[0] == f"http://127.0.0.1:{port}/"
    return proc, url[0]


@pytest.fixture(scope="module")
def site(data_dir: Path) -> Iterator[str]:
    """`mallard docs --port P` running; its printed URL."""
    proc, url = start_docs(data_dir, OFFLINE)
    try:
        yield url
    finally:
        proc.terminate()
        proc.wait(30)


def test_every_mart_and_column_is_described(site: str) -> None:
    manifest = httpx.get(site + "manifest.json", timeout=30).json()
    catalog = httpx.get(site + "catalog.json", timeout=30).json()
    for mart in MARTS:
        uid = f"model.mallard.{mart}"
        node = manifest["nodes"][uid]
        assert node["description"].strip(), f"{mart} has no description"
        # The columns as the warehouse has them: a column the yml misses still shows here.
        built = catalog["nodes"][uid]["columns"]
        assert built, f"{mart} is not in the warehouse's catalog"
        undescribed = [c for c in built if not node["columns"].get(c, {}).get("description")]
        assert undescribed == [], f"{mart}: columns without a description: {undescribed}"
        stale = [c for c in node["columns"] if c not in built]
        assert stale == [], f"{mart}: described columns the warehouse lacks: {stale}"


def test_only_the_site_is_served(site: str) -> None:
    assert httpx.get(site, timeout=30).status_code == 200
    for name in ("partial_parse.msgpack", "perf_info.json", "semantic_manifest.json"):
        assert httpx.get(site + name, timeout=30).status_code == 404, name


def test_the_site_lists_every_mart_offline(site: str) -> None:
    manifest = httpx.get(site + "manifest.json", timeout=30).json()
    catalog = httpx.get(site + "catalog.json", timeout=30).json()
    refused: list[str] = []
    loaded: dict[str, int] = {}

    def only_loopback(route: Any) -> None:
        if urlparse(route.request.url).hostname in LOOPBACK:
            route.continue_()
        else:
            refused.append(route.request.url)
            route.abort()

    pages: dict[str, str] = {}
    with chromium() as browser:
        page = browser.new_page()
        page.route("**/*", only_loopback)
        page.on("response", lambda r: loaded.__setitem__(urlparse(r.url).path, r.status))
        # A mart's page opens the project tree at models/marts: the folder lists every mart.
        page.goto(site + "#!/model/model.mallard.events")
        page.wait_for_selector("a.menu-node[data-nav-unique-id='model.mallard.events']")
        nav = page.locator("a.menu-node[data-nav-unique-id^='model.mallard.']")
        listed = {
            nav.nth(i).get_attribute("title") for i in range(nav.count()) if nav.nth(i).is_visible()
        }
        for mart in MARTS:
            page.goto(f"{site}#!/model/model.mallard.{mart}")
            page.wait_for_selector(f"text=lake.marts.{mart}")
            page.wait_for_selector("text=Columns")
            pages[mart] = page.inner_text("body")

    assert refused == [], f"the docs site tried to load from outside: {refused}"
    # The app and the two documents it fetches. (dbt's page also asks for an icon's URL before
    # Angular fills it in, `/{{ getIcon(...) }}`, a 404 of its own on every dbt docs site.)
    assert {p: loaded.get(p) for p in ("/", "/manifest.json", "/catalog.json")} == {
        "/": 200,
        "/manifest.json": 200,
        "/catalog.json": 200,
    }, loaded
    assert set(MARTS) <= listed, sorted(set(MARTS) - listed)
    for mart, text in pages.items():
        # Each page shows the mart's columns (from the warehouse) and their descriptions.
        uid = f"model.mallard.{mart}"
        missing = [c for c in catalog["nodes"][uid]["columns"] if c not in text]
        assert missing == [], (mart, missing)
        for column in manifest["nodes"][uid]["columns"].values():
            # The column table shows each description as written (not rendered as markdown).
            words = " ".join(column["description"].split()[:3])
            assert words in " ".join(text.split()), (mart, column["name"], words)
