"""The whole product with no network but loopback (`make test-airgap`: scripts/airgap.sh runs
this module as root inside `unshare --net`): `mallard init`, `mallard serve`, ingestion over
HTTP, `mallard pipeline run`, the read API, `mallard docs`, and every page Mallard serves in
headless Chromium. The processes get a user's environment that turns dbt's usage reporting on;
Mallard forces it off. Any packet meant for another host leaves through the namespace's sink
interface and is counted: the last test asserts none did.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest
from playwright.sync_api import expect

from tests.browser import chromium
from tests.conftest import Server, free_port, mallard, wait_landed
from tests.integration.prefs_support import prefs_config
from tests.integration.test_docs import start_docs
from tests.integration.test_tag_browser import LOOPBACK, PageServer, readme_snippet, wait_until

pytestmark = pytest.mark.airgap

# A user's environment with dbt's usage reporting turned on.
HOSTILE = {"DO_NOT_TRACK": "0", "DBT_SEND_ANONYMOUS_USAGE_STATS": "true"}


def _ip(*args: str) -> Any:
    return json.loads(subprocess.run(["ip", "-j", *args], capture_output=True, check=True).stdout)


def sent_off_machine(sink: str) -> int:
    """Packets the namespace sent toward any host but itself (all leave through the sink)."""
    return int(_ip("-s", "link", "show", sink)[0]["stats64"]["tx"]["packets"])


@pytest.fixture(scope="module")
def sink() -> str:
    name = os.environ.get("MALLARD_AIRGAP_SINK")
    if not name:
        pytest.fail(
            "not in the air-gapped namespace: run `make test-airgap` (root; scripts/airgap.sh "
            "runs these tests inside unshare --net)"
        )
    links = {link["ifname"] for link in _ip("link")}
    assert links == {"lo", name, "sink1"}, f"this namespace has other interfaces: {links}"
    routes = [r for r in _ip("route") if r.get("dst") == "default"]
    assert [r["dev"] for r in routes] == [name], routes
    return name


@pytest.fixture(scope="module")
def product(sink: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    root = tmp_path_factory.mktemp("airgap")
    config = prefs_config(root)
    data = root / "data"
    env = {"MALLARD_CONFIG_DIR": str(config), "MALLARD_ROLL_INTERVAL_S": "0.3", **HOSTILE}
    creds = json.loads(mallard("init", "--json", data_dir=data, env=env).stdout)
    server = Server(data, free_port(), creds, env=env)
    server.start()
    docs: subprocess.Popen[str] | None = None
    try:
        ids = []
        for action, body in (
            (
                "identify",
                {"event": "identify", "userId": "air-1", "traits": {"email": "air1@example.com"}},
            ),
            ("track", {"userId": "air-1", "event": "Went Offline", "properties": {"n": 1}}),
        ):
            r = server.post(action, body)
            assert r.status_code == 200, r.text
            ids.append(r.json()["eventId"])
        wait_landed(data, ids)
        mallard("pipeline", "run", data_dir=data, env=env)
        docs, docs_url = start_docs(data, env)
        yield {"server": server, "docs": docs_url, "data": data}
    finally:
        if docs is not None:
            docs.terminate()
            docs.wait(30)
        server.stop()


def test_ingestion_pipeline_and_reads_work(product: dict[str, Any]) -> None:
    server: Server = product["server"]
    events = server.get("events/", params={"size": 10, "sort": "asc"}).json()["data"]
    assert [e["eventAction"] for e in events] == ["identify", "went_offline"]
    traits = server.get("profiles/userId:air-1/traits")
    assert traits.status_code == 200 and traits.json()["email"] == "air1@example.com"
    meta = server.get("profiles/userId:air-1/meta")
    assert meta.status_code == 200 and meta.json()["_subscriptionId"]


def test_every_page_renders_from_loopback_only(product: dict[str, Any]) -> None:
    server: Server = product["server"]
    sid = server.get("profiles/userId:air-1/meta").json()["_subscriptionId"]
    requests: list[str] = []
    site = PageServer(
        "<!doctype html><html><head>"
        + readme_snippet(server.url, server.creds["writeKey"])
        + "</head><body>tag</body></html>"
    )
    try:
        with chromium() as browser:
            context = browser.new_context()
            context.on("request", lambda r: requests.append(r.url))
            page = context.new_page()

            page.goto(f"{server.url}/content?s={sid}")  # the hosted preferences page
            expect(page.get_by_role("heading", level=1)).to_have_text(
                "Your communication preferences"
            )
            page.get_by_role("button", name="Save preferences").click()
            expect(page.get_by_role("status")).to_have_text("Your preferences are saved.")

            page.goto(f"{server.url}/schema")  # the OpenAPI UI
            page.wait_for_selector(".opblock-summary", timeout=30_000)

            page.goto(product["docs"] + "#!/model/model.mallard.events")  # dbt docs
            page.wait_for_selector("text=lake.marts.events", timeout=30_000)

            page.goto(f"{site.url}/index.html")  # the tag on a site
            page.wait_for_function("window.analytics && window.analytics.initialized === true")
            page.evaluate("analytics.track('Tag Offline'); analytics.reset()")
            wait_until(page, lambda: any("/cdp/events/std/t" in u for u in requests), "track")
            context.close()
    finally:
        site.close()
    foreign = [u for u in requests if urlparse(u).hostname not in LOOPBACK]
    assert foreign == [], f"requests off loopback: {foreign}"
    assert any("/schema/assets/" in u for u in requests)
    assert any(u.startswith(product["docs"]) and "manifest.json" in u for u in requests)


def test_nothing_was_sent_off_the_machine(product: dict[str, Any], sink: str) -> None:
    # Last in the module: every process above (the CLI, the server, the pipeline, dbt, Dagster,
    # DuckDB, Chromium) ran in this namespace, whose only route off loopback is the sink.
    sent = Path(os.environ.get("MALLARD_AIRGAP_SENT", "/dev/null")).read_text().splitlines()
    assert sent_off_machine(sink) == 0, f"packets were sent toward other hosts: {sorted(set(sent))}"
