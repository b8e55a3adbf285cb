"""Audiences as code on real processes: a `mallard serve`, real passes, files in the config dir.

One server and data dir for the module; the tests run in order, each a step of one story: a pass
without audience files, then `pro.sql` (and a broken file) added and a pass later its members in
profile metadata and the audiences API, then a trait change and a suppression and a pass later
those customers out, with their stays closed in `marts.audience_members`.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from mallard.harness import REPO
from tests.conftest import Server, free_port, init_data_dir, mallard, wait_landed

OTHER_CLIENT = "rival"
PRO = ["u0", "u2", "u4", "u6"]  # plan pro in the demo account
FREE = ["u1", "u3", "u5"]
PRO_SQL = """-- Customers on the pro plan.
select customer_id from customers
where traits ->> 'plan' = 'pro';
"""


@dataclass
class Story:
    srv: Server
    config: Path
    other_token: str  # a token of another client
    other_base: str  # that client's base path

    def members(
        self, name: str, base: str | None = None, token: str | None = None, **params: Any
    ) -> httpx.Response:
        return httpx.get(
            f"{base or self.srv.base}/audiences/{name}/members",
            params=params,
            headers={"auth-token": token or self.srv.creds["token"]},
            timeout=30,
        )

    def sql(self, query: str) -> list[dict[str, Any]]:
        out = mallard("sql", "-c", query, "--format", "json", data_dir=self.srv.data_dir)
        return list(json.loads(out.stdout or "[]"))


def identify(base: str, token: str, user: str, traits: dict[str, Any]) -> str:
    r = httpx.post(
        f"{base}/identify",
        json={"type": "identify", "event": "identify", "userId": user, "traits": traits},
        headers={"auth-token": token},
        timeout=30,
    )
    assert r.status_code == 200, r.text
    return str(r.json()["eventId"])


def ok(r: httpx.Response) -> Any:
    assert r.status_code == 200, (r.request.url, r.status_code, r.text)
    return r.json()


def meta(srv: Server, user: str) -> dict[str, Any]:
    body: dict[str, Any] = ok(srv.get(f"profiles/userId:{user}/metadata"))
    return body


def all_members(story: Story, name: str, size: int) -> list[str]:
    """Every member's userId, page by page through scrollIds."""
    body = ok(story.members(name, size=size))
    users = [m["externalId"] for m in body["data"]]
    while body["data"]:
        assert len(body["data"]) <= size
        body = ok(story.members(name, scrollId=body["scrollId"]))
        users += [m["externalId"] for m in body["data"]]
    return users


@pytest.fixture(scope="module")
def story(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Story]:
    root = tmp_path_factory.mktemp("audiences")
    config = root / "config"
    shutil.copytree(REPO / "config", config)
    d = root / "data"
    creds = init_data_dir(d)
    mallard("accounts", "add", OTHER_CLIENT, data_dir=d)
    out = mallard("tokens", "create", "--scope", f"client:{OTHER_CLIENT}", "--json", data_dir=d)
    other_token = json.loads(out.stdout)["token"]
    env = {"MALLARD_ROLL_INTERVAL_S": "0.3", "MALLARD_CONFIG_DIR": str(config)}
    srv = Server(d, free_port(), creds, env=env)
    srv.start()
    try:
        other_base = f"{srv.url}/track/{OTHER_CLIENT}/{OTHER_CLIENT}/{OTHER_CLIENT.upper()}/v1"
        ids = [identify(srv.base, creds["token"], u, {"plan": "pro"}) for u in PRO]
        ids += [identify(srv.base, creds["token"], u, {"plan": "free"}) for u in FREE]
        ids.append(identify(other_base, other_token, "o0", {"plan": "pro"}))
        wait_landed(d, ids)
        srv.pipeline()
        yield Story(srv, config, other_token, other_base)
    finally:
        srv.stop()


def test_without_audience_files_there_are_none(story: Story) -> None:
    assert ok(story.srv.get("audiences")) == {"data": []}
    assert meta(story.srv, "u0")["audiencesStatic"] == []
    r = story.members("pro")
    assert r.status_code == 404, r.text
    assert story.sql("select count(*) as n from audience_members") == [{"n": 0}]


def test_a_file_added_gives_members_a_pass_later(story: Story) -> None:
    audiences = story.config / "audiences"
    audiences.mkdir()
    (audiences / "pro.sql").write_text(PRO_SQL)
    (audiences / "broken.sql").write_text("select customer_id from customers where nope = 1\n")
    out = mallard(
        "audiences",
        "check",
        "--config-dir",
        str(story.config),
        data_dir=story.srv.data_dir,
        check=False,
    )
    assert out.returncode == 1, out.stdout + out.stderr
    assert "ok   pro.sql" in out.stdout and "FAIL broken.sql" in out.stdout and "nope" in out.stdout
    story.srv.pipeline()  # the broken file fails alone: the pass succeeds

    for u in PRO:
        assert meta(story.srv, u)["audiencesStatic"] == ["pro"], u
    for u in FREE:
        assert meta(story.srv, u)["audiencesStatic"] == [], u
    listed = {a["name"]: a for a in ok(story.srv.get("audiences"))["data"]}
    assert listed["pro"] == {"name": "pro", "status": "ok", "error": None, "members": len(PRO)}
    assert listed["broken"]["status"] == "failed" and listed["broken"]["members"] == 0
    assert "nope" in listed["broken"]["error"]
    assert sorted(all_members(story, "pro", size=3)) == PRO
    first = ok(story.members("pro", size=2))
    assert set(first["data"][0]) == {"id", "externalId", "enteredAt"}
    assert first["data"][0]["enteredAt"].endswith("Z")
    assert story.members("nobody").status_code == 404


def test_pages_follow_one_another(story: Story) -> None:
    pages = [ok(story.members("pro", **{"from": i, "size": 1}))["data"] for i in range(len(PRO))]
    ids = [p[0]["id"] for p in pages]
    assert ids == sorted(ids) and len(set(ids)) == len(PRO)
    assert ok(story.members("pro", **{"from": len(PRO), "size": 1}))["data"] == []


def test_another_tenant_sees_only_its_own_members(story: Story) -> None:
    # Its token on the demo account's path: refused.
    r = story.members("pro", token=story.other_token)
    assert r.status_code == 403, r.text
    r = httpx.get(f"{story.srv.base}/audiences", headers={"auth-token": story.other_token})
    assert r.status_code == 403, r.text
    # On its own path: the same audience file, its own customers only.
    mine = ok(story.members("pro", base=story.other_base, token=story.other_token))
    assert [m["externalId"] for m in mine["data"]] == ["o0"]
    listed = httpx.get(
        f"{story.other_base}/audiences", headers={"auth-token": story.other_token}
    ).json()["data"]
    assert {a["name"]: a["members"] for a in listed} == {"broken": 0, "pro": 1}
    # A scrollId of one account's list is refused on another's.
    scroll = ok(story.members("pro", size=1))["scrollId"]
    r = story.members("pro", base=story.other_base, token=story.other_token, scrollId=scroll)
    assert r.status_code == 400, r.text


def test_members_leave_when_they_no_longer_match(story: Story) -> None:
    srv = story.srv
    ids = [identify(srv.base, srv.creds["token"], "u2", {"plan": "free"})]
    wait_landed(srv.data_dir, ids)
    r = srv.post(
        "regulations", {"regulationType": "SUPPRESS", "subject": {"type": "USER_ID", "ids": ["u4"]}}
    )
    assert r.status_code == 200, r.text
    done = srv.wait_regulation(r.json()["regulationId"])
    assert done["status"] == "finished", done
    srv.pipeline()

    assert sorted(all_members(story, "pro", size=100)) == ["u0", "u6"]
    assert meta(srv, "u2")["audiencesStatic"] == []
    assert meta(srv, "u0")["audiencesStatic"] == ["pro"]
    listed = {a["name"]: a["members"] for a in ok(srv.get("audiences"))["data"]}
    assert listed["pro"] == 2
    stays = story.sql(
        "select user_id, entered_at, left_at from audience_members"
        " where audience = 'pro' and account_id = 'demo' order by user_id"
    )
    by_user = {s["user_id"]: s for s in stays}
    assert sorted(by_user) == PRO and len(stays) == len(PRO)
    assert by_user["u0"]["left_at"] is None and by_user["u6"]["left_at"] is None
    # The trait change and the suppression: left, at one pass's time, after they entered.
    for u in ("u2", "u4"):
        assert by_user[u]["left_at"] is not None, by_user[u]
        assert by_user[u]["left_at"] > by_user[u]["entered_at"]
    # A suppressed customer is in no audience: not in the API, not a current member.
    assert "u4" not in all_members(story, "pro", size=100)
    current = story.sql(
        "select count(*) as n from audience_members where user_id = 'u4' and left_at is null"
    )
    assert current == [{"n": 0}]


def test_a_member_who_matches_again_gets_a_new_stay(story: Story) -> None:
    srv = story.srv
    ids = [identify(srv.base, srv.creds["token"], "u2", {"plan": "pro"})]
    wait_landed(srv.data_dir, ids)
    srv.pipeline()
    stays = story.sql(
        "select entered_at, left_at from audience_members"
        " where audience = 'pro' and user_id = 'u2' order by entered_at"
    )
    assert len(stays) == 2, stays
    assert stays[0]["left_at"] is not None and stays[1]["left_at"] is None
    assert stays[1]["entered_at"] > stays[0]["left_at"]
    assert meta(srv, "u2")["audiencesStatic"] == ["pro"]
