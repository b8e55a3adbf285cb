"""The regulation routes and `mallard regulations` on a real server: filing (400 naming the field,
DELETE only under suppression), auth (account-wide: a brand-scoped token gets 403), reading back,
the collectors' lists in effect when POST answers (the userId and the anonymousIds the models tie
to it), the Access download (404 before, 410 after), and the run each filing starts.

Filing starts real runs (`mallard regulations run`); the module stops those still running, by
the PIDs they record, when it ends.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import time
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from mallard.paths import DataPaths
from mallard.regulation_runs import log_path, runs_dir
from mallard.regulations import RegulationStore
from tests.conftest import Server, free_port, init_data_dir, mallard, wait_landed

pytestmark = pytest.mark.integration

ISO = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")


def stop_runs(data_dir: Path) -> None:
    """Stop the regulation runs still live, each with its process group, by the PID it wrote."""
    pids = []
    for f in runs_dir(DataPaths(data_dir)).glob("*.pid"):
        try:
            pids.append(int(f.read_text()))
        except (OSError, ValueError):
            continue
    for pid in pids:
        try:
            os.killpg(pid, signal.SIGTERM)
        except ProcessLookupError:
            continue
    deadline = time.monotonic() + 20
    for pid in pids:
        while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        if Path(f"/proc/{pid}").exists():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)


def log_line(data_dir: Path, regulation_id: str, what: str, timeout: float) -> str:
    """The line of the runs' log saying `what` of a regulation, once it is there."""
    deadline = time.monotonic() + timeout
    while True:
        path = log_path(DataPaths(data_dir))
        text = path.read_text() if path.exists() else ""
        for line in text.splitlines():
            if regulation_id in line and what in line:
                return line
        if time.monotonic() > deadline:
            raise AssertionError(f"no {what!r} for {regulation_id} in the runs' log:\n{text}")
        time.sleep(0.1)


def zombies_of(pid: int) -> list[int]:
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid and fields[0] == "Z":
            out.append(int(stat.parent.name))
    return out


@dataclass
class Env:
    server: Server
    tokens: dict[str, str]

    @property
    def paths(self) -> DataPaths:
        return DataPaths(self.server.data_dir)

    def url(self, path: str = "", tenant: str = "demo/demo/DEMO") -> str:
        return f"{self.server.url}/track/{tenant}/v1/regulations{path}"

    def headers(self, token: str = "client") -> dict[str, str]:
        return {"auth-token": self.tokens[token], "content-type": "application/json"}

    def file(self, kind: str, *ids: str, token: str = "client") -> httpx.Response:
        body = {"regulationType": kind, "subject": {"type": "USER_ID", "ids": list(ids)}}
        return httpx.post(self.url(), json=body, headers=self.headers(token), timeout=60)

    def get(self, path: str = "", token: str = "client") -> httpx.Response:
        return httpx.get(self.url(path), headers=self.headers(token), timeout=30)


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    d = tmp_path_factory.mktemp("regulations") / "data"
    creds = init_data_dir(d)
    mallard("accounts", "add", "demo", "other", data_dir=d)
    tokens = {"client": creds["token"]}
    for kind, scope in [
        ("account", "account:demo/demo"),
        ("brands", "brands:demo/demo"),
        ("brand", "brand:demo/demo/DEMO"),
    ]:
        out = mallard("tokens", "create", "--scope", scope, "--json", data_dir=d).stdout
        tokens[kind] = json.loads(out)["token"]
    server = Server(
        d,
        free_port(),
        creds,
        env={"MALLARD_ROLL_INTERVAL_S": "0.3", "MALLARD_RATE_BURST": "100000"},
    )
    server.start()
    try:
        # u-sub: an anonymous visit, identified later, then a second anonymousId of theirs.
        ids = [
            server.post("track", {"anonymousId": "anon-sub-1", "event": "Visited"}),
            server.post(
                "identify",
                {
                    "userId": "u-sub",
                    "anonymousId": "anon-sub-1",
                    "event": "identify",
                    "traits": {"email": "sub@example.com"},
                },
            ),
            server.post("track", {"userId": "u-sub", "anonymousId": "anon-sub-2", "event": "Paid"}),
            server.post(
                "track", {"userId": "u-other", "anonymousId": "anon-other", "event": "Paid"}
            ),
        ]
        assert all(r.status_code == 200 for r in ids), [r.text for r in ids]
        wait_landed(d, [r.json()["eventId"] for r in ids])
        server.pipeline()
        yield Env(server, tokens)
    finally:
        server.stop()
        stop_runs(d)


# --- filing -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (
            {"regulationType": "ERASE", "subject": {"type": "USER_ID", "ids": ["u"]}},
            "regulationType",
        ),
        ({"subject": {"type": "USER_ID", "ids": ["u"]}}, "regulationType"),
        ({"regulationType": "SUPPRESS"}, "subject"),
        ({"regulationType": "SUPPRESS", "subject": ["u"]}, "subject"),
        (
            {"regulationType": "SUPPRESS", "subject": {"type": "EMAIL", "ids": ["u"]}},
            "subject.type",
        ),
        ({"regulationType": "SUPPRESS", "subject": {"type": "USER_ID", "ids": []}}, "subject.ids"),
        ({"regulationType": "SUPPRESS", "subject": {"type": "USER_ID", "ids": "u"}}, "subject.ids"),
        (
            {"regulationType": "SUPPRESS", "subject": {"type": "USER_ID", "ids": ["u"] * 5001}},
            "subject.ids",
        ),
        (
            {
                "regulationType": "SUPPRESS",
                "subject": {"type": "USER_ID", "ids": ["a", "b", "c", 4]},
            },
            "subject.ids[3]",
        ),
        (
            {"regulationType": "SUPPRESS", "subject": {"type": "USER_ID", "ids": ["a", " "]}},
            "subject.ids[1]",
        ),
    ],
)
def test_a_bad_body_gets_400_naming_its_field(env: Env, body: Any, field: str) -> None:
    r = httpx.post(env.url(), json=body, headers=env.headers(), timeout=30)
    assert r.status_code == 400, r.text
    message = r.json()["error"]["message"]
    assert r.json()["error"]["code"] == "validation_error"
    assert message.split(" ")[0].rstrip(":") == field, message


def test_a_body_that_is_not_json_or_too_big_is_refused(env: Env) -> None:
    r = httpx.post(env.url(), content=b"{nope", headers=env.headers(), timeout=30)
    assert r.status_code == 400 and "not valid JSON" in r.json()["error"]["message"], r.text
    big = b'{"regulationType":"SUPPRESS","subject":{"type":"USER_ID","ids":["' + b"x" * 1_100_000
    r = httpx.post(env.url(), content=big + b'"]}}', headers=env.headers(), timeout=30)
    assert r.status_code == 413, r.text
    assert r.json()["error"]["code"] == "invalid_request_error"
    assert env.get().json() == {"data": []}  # nothing was filed


def test_auth_is_the_read_apis_and_account_wide(env: Env) -> None:
    body = {"regulationType": "SUPPRESS", "subject": {"type": "USER_ID", "ids": ["u-auth"]}}
    for method, path in [("POST", ""), ("GET", ""), ("GET", "/r-1"), ("GET", "/r-1/download")]:
        send: dict[str, Any] = {"json": body} if method == "POST" else {}
        r = httpx.request(method, env.url(path), timeout=30, **send)
        assert r.status_code == 401, r.text
        assert r.json()["error"]["code"] == "authentication_error"
        bad = {"auth-token": "mlt_00000000_unknown"}
        r = httpx.request(method, env.url(path), headers=bad, timeout=30, **send)
        assert r.status_code == 401, r.text
        # A token of one brand is refused: a regulation covers every brand of the account.
        brand = {"auth-token": env.tokens["brand"]}
        r = httpx.request(method, env.url(path), headers=brand, timeout=30, **send)
        assert r.status_code == 403, r.text
        assert r.json()["error"]["code"] == "authentication_error"
        assert "whole account" in r.json()["error"]["message"]
        # Out of the token's scope: another account's path with an account-scoped token.
        other = {"auth-token": env.tokens["account"]}
        r = httpx.request(
            method, env.url(path, "demo/other/OTHER"), headers=other, timeout=30, **send
        )
        assert r.status_code == 403, r.text
    assert RegulationStore(env.paths).list("demo", "demo") == []  # nothing was filed
    for token in ("client", "account", "brands"):
        r = env.get(token=token)
        assert r.status_code == 200, r.text


def test_unknown_or_other_accounts_regulations_are_404(env: Env) -> None:
    out = mallard(
        "regulations",
        "file",
        "--client",
        "demo",
        "--account",
        "other",
        "--type",
        "TRACK",
        "u-elsewhere",
        data_dir=env.server.data_dir,
    ).stdout
    elsewhere = json.loads(out)["regulationId"]
    for path in (f"/{elsewhere}", f"/{elsewhere}/download", "/nope", "/nope/download"):
        r = env.get(path)
        assert r.status_code == 404, (path, r.text)
        assert r.json()["error"]["code"] == "not_found"
    assert all(r["regulationId"] != elsewhere for r in env.get().json()["data"])
    # The other account's own path shows it (client token: both accounts).
    r = httpx.get(env.url(f"/{elsewhere}", "demo/other/OTHER"), headers=env.headers(), timeout=30)
    assert r.status_code == 200 and r.json()["regulationId"] == elsewhere, r.text


@pytest.fixture(scope="module")
def suppressed(env: Env) -> tuple[str, dict[str, Any], frozenset[str]]:
    """SUPPRESS of u-sub: its id, the answer, and the suppress list right after the answer."""
    r = env.file("SUPPRESS", "u-sub")
    lists = RegulationStore(env.paths).lists()
    assert r.status_code == 200, r.text
    return r.json()["regulationId"], r.json(), lists.get("demo", {}).get("suppress", frozenset())


def test_post_answers_the_id_and_status(suppressed: tuple[str, dict[str, Any], Any]) -> None:
    reg_id, answer, _ = suppressed
    assert answer == {"regulationId": reg_id, "status": "pending"}


def test_suppression_holds_the_user_and_their_anonymous_ids_when_post_answers(
    env: Env, suppressed: tuple[str, dict[str, Any], frozenset[str]]
) -> None:
    _, _, listed = suppressed
    store = RegulationStore(env.paths)
    # What the lake ties to u-sub, read as the read API serves it.
    r = httpx.get(
        f"{env.server.base}/profiles/userId:u-sub/external_ids", headers=env.headers(), timeout=30
    )
    anonymous = {i["id"] for i in r.json()["data"] if i["type"] == "anonymousId"}
    assert anonymous == {"anon-sub-1", "anon-sub-2"}, r.text
    wanted = {store.hash("demo", v) for v in ["u-sub", *anonymous]}
    assert wanted <= listed
    assert store.hash("demo", "anon-other") not in listed
    assert store.hash("demo", "u-other") not in listed


def test_post_starts_the_regulations_run(
    env: Env, suppressed: tuple[str, dict[str, Any], Any]
) -> None:
    reg_id, _, _ = suppressed
    line = log_line(env.server.data_dir, reg_id, "run started (pid ", timeout=60)
    pid = int(line.split("(pid ")[1].rstrip(")"))
    assert pid != env.server.proc.pid if env.server.proc else True


def test_a_regulation_reads_back_and_its_run_is_reaped(env: Env) -> None:
    r = env.file("TRACK", "u-track", "u-track-2")
    assert r.status_code == 200, r.text
    reg_id = r.json()["regulationId"]
    got = env.get(f"/{reg_id}")
    assert got.status_code == 200, got.text
    doc = got.json()
    assert doc["regulationId"] == reg_id and doc["regulationType"] == "TRACK"
    assert doc["status"] in ("pending", "running", "finished")
    assert (doc["clientId"], doc["accountId"], doc["brandId"]) == ("demo", "demo", "DEMO")
    assert ISO.match(doc["createdAt"]), doc["createdAt"]
    assert [s["id"] for s in doc["subjects"]] == ["u-track", "u-track-2"]
    store = RegulationStore(env.paths)
    assert [s["idHash"] for s in doc["subjects"]] == [
        store.hash("demo", "u-track"),
        store.hash("demo", "u-track-2"),
    ]
    assert doc["download"] is None and doc["error"] is None
    listed = env.get().json()["data"]
    assert listed[0]["regulationId"] == reg_id  # newest first
    assert listed[0]["subjectCount"] == 2
    created = [x["createdAt"] for x in listed]
    assert created == sorted(created, reverse=True)
    # The run finishes (TRACK needs no pass), and the server leaves no zombie behind.
    log_line(env.server.data_dir, reg_id, "run ended", timeout=180)
    doc = env.get(f"/{reg_id}").json()
    assert doc["status"] == "finished", doc
    assert ISO.match(doc["startedAt"]) and ISO.match(doc["finishedAt"]), doc
    # Each subject's outcome, as the run recorded it by the userId's hash.
    assert all(x["outcome"] for x in doc["subjects"]), doc
    # The run's process exits after its last line and the server reaps it: its PID is gone,
    # not left a zombie. (Waiting on the PID, not on "no zombie now": a check made while the
    # run is still exiting finds none, and one made an instant later may find it exited and
    # not yet reaped.)
    assert env.server.proc is not None
    started = log_line(env.server.data_dir, reg_id, "run started", timeout=10)
    found = re.search(r"\(pid (\d+)\)", started)
    assert found, started
    run = Path(f"/proc/{found[1]}")
    deadline = time.monotonic() + 30
    while run.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert int(found[1]) not in zombies_of(env.server.proc.pid), "the server never reaped its run"
    assert not run.exists(), f"the run {found[1]} has not exited"


def test_delete_needs_an_active_suppression(env: Env) -> None:
    r = env.file("DELETE", "u-never-suppressed")
    assert r.status_code == 400, r.text
    message = r.json()["error"]["message"]
    assert message.startswith("subject.ids") and "u-never-suppressed" in message
    assert env.file("SUPPRESS", "u-del").status_code == 200
    r = env.file("DELETE", "u-del")
    assert r.status_code == 200, r.text
    assert r.json()["status"] == "pending"
    stop_runs(env.server.data_dir)  # the purge is not under test here


# --- the Access download and the CLI ------------------------------------------------------------


def test_access_download_404_before_the_zip_and_410_after_it_expires(
    env: Env, tmp_path: Path
) -> None:
    d = env.server.data_dir
    store = RegulationStore(env.paths)
    # Filed in the store, not through the API: no run makes or replaces its zip meanwhile.
    reg = store.file("demo", "demo", "DEMO", "ACCESS", ["u-access"])
    rid = reg.regulation_id
    r = env.get(f"/{rid}/download")
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found", r.text
    assert mallard("regulations", "download", rid, data_dir=d, check=False).returncode == 1

    zip_path = env.paths.access_dir / f"{rid}.zip"
    zip_path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(zip_path, "w") as z:
        z.writestr("manifest.json", json.dumps({"regulationId": rid}))
    expires = time.time() + 3600
    store.save(rid, download_path=str(zip_path), download_expires_at=expires)
    r = env.get(f"/{rid}/download")
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "application/zip"
    assert r.content == zip_path.read_bytes()
    doc = env.get(f"/{rid}").json()
    assert doc["download"] == {
        "url": f"/track/demo/demo/DEMO/v1/regulations/{rid}/download",
        "expiresAt": doc["download"]["expiresAt"],
        "expired": False,
    }
    assert ISO.match(doc["download"]["expiresAt"])
    # The link is served on the path it names.
    assert httpx.get(env.server.url + doc["download"]["url"], headers=env.headers()).content == (
        r.content
    )
    out = tmp_path / "mine.zip"
    mallard("regulations", "download", rid, "-o", str(out), data_dir=d)
    assert out.read_bytes() == r.content

    # `show` and `list` print what the routes answer.
    shown = mallard("regulations", "show", rid, data_dir=d).stdout.strip()
    assert shown.encode() == env.get(f"/{rid}").content
    listed = mallard("regulations", "list", "--client", "demo", "--account", "demo", data_dir=d)
    assert json.loads(listed.stdout)["data"][0] == env.get().json()["data"][0]

    # Removed before it expires: gone.
    zip_path.rename(zip_path.with_suffix(".moved"))
    r = env.get(f"/{rid}/download")
    assert r.status_code == 410 and r.json()["error"]["code"] == "not_found", r.text
    zip_path.with_suffix(".moved").rename(zip_path)
    # Expired: gone, though the file is still there.
    store.save(rid, download_expires_at=time.time() - 1)
    r = env.get(f"/{rid}/download")
    assert r.status_code == 410, r.text
    assert "expired" in r.json()["error"]["message"]
    assert env.get(f"/{rid}").json()["download"]["expired"] is True
    cli = mallard("regulations", "download", rid, "-o", str(out), data_dir=d, check=False)
    assert cli.returncode == 1 and "expired" in cli.stderr


def test_the_openapi_document_has_the_routes(env: Env) -> None:
    doc = httpx.get(f"{env.server.url}/schema/openapi.json", timeout=30).json()
    base = "/track/{clientId}/{accountId}/{BRANDID}/v1/regulations"
    ops = {
        (path, method): o["operationId"]
        for path, item in doc["paths"].items()
        if path.startswith(base)
        for method, o in item.items()
    }
    assert ops == {
        (base, "post"): "fileRegulation",
        (base, "get"): "listRegulations",
        (base + "/{regulationId}", "get"): "getRegulation",
        (base + "/{regulationId}/download", "get"): "downloadRegulation",
    }
    post = doc["paths"][base]["post"]
    assert {"400", "401", "403", "413", "429"} <= set(post["responses"])
    assert {"404", "410"} <= set(
        doc["paths"][base + "/{regulationId}/download"]["get"]["responses"]
    )
    examples = post["requestBody"]["content"]["application/json"]["schema"]["examples"]
    assert {e["regulationType"] for e in examples} == {"SUPPRESS_WITH_DELETE", "ACCESS"}


# --- runs started by the CLI and at server start -------------------------------------------------


def test_cli_files_lists_shows_and_runs(tmp_path: Path) -> None:
    d = tmp_path / "data"
    init_data_dir(d)
    try:
        body = tmp_path / "body.json"
        body.write_text(
            json.dumps(
                {"regulationType": "TRACK", "subject": {"type": "USER_ID", "ids": ["u-cli"]}}
            )
        )
        filed = json.loads(
            mallard(
                "regulations", "file", "--client", "demo", "--body", str(body), data_dir=d
            ).stdout
        )
        assert set(filed) == {"regulationId", "status"} and filed["status"] == "pending"
        rid = filed["regulationId"]
        log_line(d, rid, "run started (pid ", timeout=60)
        bad = mallard(
            "regulations",
            "file",
            "--client",
            "demo",
            "--type",
            "FORGET",
            "u",
            data_dir=d,
            check=False,
        )
        assert bad.returncode == 1 and "regulationType" in bad.stderr
        listed = json.loads(mallard("regulations", "list", "--client", "demo", data_dir=d).stdout)
        assert [r["regulationId"] for r in listed["data"]] == [rid]
        log_line(d, rid, "run ended", timeout=180)
        shown = json.loads(mallard("regulations", "show", rid, data_dir=d).stdout)
        assert shown["status"] == "finished" and shown["subjects"][0]["id"] == "u-cli"
        # Run again: the same end state.
        again = mallard("regulations", "run", rid, data_dir=d)
        assert "run ended: finished" in again.stdout
        missing = mallard("regulations", "show", "no-such", data_dir=d, check=False)
        assert missing.returncode == 1

        # `resume` starts what is left unfinished with no live run.
        left = RegulationStore(DataPaths(d)).file("demo", "demo", "DEMO", "UNSUPPRESS", ["u-x"])
        out = mallard("regulations", "resume", data_dir=d).stdout
        assert left.regulation_id in out and "run started" in out
        log_line(d, left.regulation_id, "run ended: finished", timeout=180)
    finally:
        stop_runs(d)


def test_server_start_runs_unfinished_regulations_again(
    server_factory: Any, tmp_path: Path
) -> None:
    d = tmp_path / "data"
    init_data_dir(d)
    # Left pending, as by a server killed before it started the run.
    left = RegulationStore(DataPaths(d)).file("demo", "demo", "DEMO", "TRACK", ["u-left"])
    try:
        server_factory(d)
        log_line(d, left.regulation_id, "run started (pid ", timeout=60)
    finally:
        stop_runs(d)
