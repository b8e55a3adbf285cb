"""Webhook providers on loopback, on real processes: an HTTP server in the test is the SMS and
push provider (`providers.toml` of a config dir of the test). A 500 then 200 is retried with
the same Idempotency-Key and a valid signature; a customer whose messages carried two device
tokens gets two pushes; a 410 for one token disables it, and a later push goes to the other."""

from __future__ import annotations

import hashlib
import hmac
import json
import shutil
import sqlite3
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from mallard.harness import pipeline_pass
from mallard.paths import DataPaths
from mallard.secret import derived_key
from orchestration.delivery.dispatch import SIGNATURE_PURPOSE
from tests.conftest import REPO, Server, free_port, init_data_dir, wait_landed

pytestmark = pytest.mark.integration


@dataclass
class Call:
    path: str
    headers: dict[str, str]
    body: bytes
    status: int

    @property
    def json(self) -> dict[str, Any]:
        out: dict[str, Any] = json.loads(self.body)
        return out


@dataclass
class Provider:
    calls: list[Call] = field(default_factory=list)
    sms_answers: list[int] = field(default_factory=lambda: [500])  # then 200
    gone: set[str] = field(default_factory=set)  # push tokens answered 410
    lock: threading.Lock = field(default_factory=threading.Lock)

    def answer(self, path: str, body: bytes) -> int:
        with self.lock:
            if path == "/sms" and self.sms_answers:
                return self.sms_answers.pop(0)
            if path == "/push" and json.loads(body)["to"] in self.gone:
                return 410
            return 200


def _handler(provider: Provider) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802
            body = self.rfile.read(int(self.headers.get("content-length", "0")))
            status = provider.answer(self.path, body)
            with provider.lock:
                provider.calls.append(
                    Call(self.path, {k.lower(): v for k, v in self.headers.items()}, body, status)
                )
            out = b'{"ok":true}' if status == 200 else b'{"error":"x"}'
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)

        def log_message(self, *args: Any) -> None:
            pass

    return Handler


@dataclass
class Env:
    server: Server
    provider: Provider
    config: Path

    def run_pass(self) -> None:
        pipeline_pass(self.server.data_dir, {"MALLARD_CONFIG_DIR": str(self.config)})

    def track(self, body: dict[str, Any]) -> str:
        r = self.server.post("track", body)
        assert r.status_code == 200, r.text
        return str(r.json()["eventId"])

    def calls(self, path: str, command: str) -> list[Call]:
        return [
            c for c in self.provider.calls if c.path == path and c.json["commandEventId"] == command
        ]


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    root = tmp_path_factory.mktemp("webhooks")
    provider = Provider()
    http = ThreadingHTTPServer(("127.0.0.1", free_port()), _handler(provider))
    thread = threading.Thread(target=http.serve_forever, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{http.server_address[1]}"
    config = root / "config"
    shutil.copytree(REPO / "config", config)
    (config / "providers.toml").write_text(
        f'[sms]\nurl = "{url}/sms"\n\n[push]\nurl = "{url}/push"\n'
    )
    data = root / "data"
    server = Server(
        data,
        free_port(),
        init_data_dir(data),
        env={"MALLARD_ROLL_INTERVAL_S": "0.3", "MALLARD_CONFIG_DIR": str(config)},
    )
    server.start()
    try:
        yield Env(server, provider, config)
    finally:
        server.stop()
        http.shutdown()
        thread.join(10)


def test_retries_reuse_the_key_and_each_device_token_gets_its_push(env: Env) -> None:
    srv = env.server
    r = srv.post(
        "identify",
        {
            "userId": "u1",
            "event": "identify",
            "traits": {"phone": "+15555550123", "firstName": "Ann"},
        },
    )
    assert r.status_code == 200, r.text
    ids = [str(r.json()["eventId"])]
    for token in ("tok-a", "tok-b"):
        ids.append(
            env.track(
                {"userId": "u1", "event": "app_opened", "context": {"device": {"token": token}}}
            )
        )
    wait_landed(srv.data_dir, ids)
    env.run_pass()
    sid = srv.get("profiles/userId:u1/meta").json()["_subscriptionId"]
    r = httpx.post(
        f"{srv.url}/cdp/marketing-preferences/{sid}",
        json={"channels": [{"channel": "push", "subscribed": True}]},
        timeout=30,
    )
    assert r.status_code == 200, r.text
    sms = env.track({"userId": "u1", "event": "send_sms", "assetId": "reset_code", "code": "4821"})
    push1 = env.track({"userId": "u1", "event": "send_push", "assetId": "offer_push"})
    wait_landed(srv.data_dir, [sms, push1])
    env.run_pass()

    # Two tokens, two pushes.
    assert sorted(c.json["to"] for c in env.calls("/push", push1)) == ["tok-a", "tok-b"]
    [first] = env.calls("/sms", sms)
    assert first.status == 500 and first.json["to"] == "+15555550123"
    assert "4821" in first.json["text"]

    # The tried-again SMS is due after its backoff; tok-b is gone from now on.
    with sqlite3.connect(srv.data_dir / "outbox.sqlite") as conn:
        due = conn.execute(
            "select next_attempt_at from sends where command_event_id = ?", [sms]
        ).fetchone()[0]
    time.sleep(max(0.0, due - time.time()) + 0.2)
    env.provider.gone.add("tok-b")
    push2 = env.track({"userId": "u1", "event": "send_push", "assetId": "offer_push"})
    wait_landed(srv.data_dir, [push2])
    env.run_pass()

    calls = env.calls("/sms", sms)
    assert [c.status for c in calls] == [500, 200]
    assert calls[0].body == calls[1].body
    keys = {c.headers["idempotency-key"] for c in calls}
    assert len(keys) == 1
    key = derived_key(DataPaths(srv.data_dir), SIGNATURE_PURPOSE).encode()
    for c in env.provider.calls:
        want = hmac.new(key, c.body, hashlib.sha256).hexdigest()
        assert c.headers["x-mallard-signature"] == f"sha256={want}"
        assert c.headers["idempotency-key"] == c.json["sendId"]
    assert keys == {calls[0].json["sendId"]}
    assert sorted((c.json["to"], c.status) for c in env.calls("/push", push2)) == [
        ("tok-a", 200),
        ("tok-b", 410),
    ]

    push3 = env.track({"userId": "u1", "event": "send_push", "assetId": "offer_push"})
    wait_landed(srv.data_dir, [push3])
    env.run_pass()
    assert [(c.json["to"], c.status) for c in env.calls("/push", push3)] == [("tok-a", 200)]

    events = srv.get("events/", params={"sort": "asc", "size": 100}).json()["data"]
    outcomes = sorted(
        (e["eventAction"], e["rawData"]["properties"].get("reason"))
        for e in events
        if e["eventAction"].startswith(("sms_", "push_"))
    )
    assert outcomes == [
        ("push_failed", "token_disabled"),
        ("push_sent", None),
        ("push_sent", None),
        ("push_sent", None),
        ("sms_sent", None),
    ]
