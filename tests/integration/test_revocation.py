"""Revocation on a running server by another process takes effect on its very next request.

The server answers lookups from a snapshot it reloads when the control store's generation
counter moves (mallard/tenancy.py); `pragma data_version` is asked besides only once a second.
Here the revoking process stays up and the request follows its commit within milliseconds, after
requests that had the lookups cached, so the once-a-second check cannot be what refuses it: with
the counter's check dropped this test fails.
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from mallard.harness import REPO, Server, free_port, init_data_dir, mallard

pytestmark = pytest.mark.integration

_REVOKER = """
import sys
from pathlib import Path
from mallard.tenancy import ControlStore
store = ControlStore(Path(sys.argv[1]))
print("ready", flush=True)
for line in sys.stdin:
    kind, value = line.split()
    ok = store.revoke_token(value) if kind == "token" else store.revoke_write_key(value)
    print(int(ok), flush=True)
"""


TRACK = {"userId": "rv", "event": "Revoked"}


def revocable_credentials(data_dir: Path) -> tuple[str, str, dict[str, str], dict[str, str]]:
    """A new token of the demo client (its id) and writeKey, with their request headers."""
    out = json.loads(
        mallard("tokens", "create", "--scope", "client:demo", "--json", data_dir=data_dir).stdout
    )
    wk = mallard("writekeys", "create", "demo", data_dir=data_dir).stdout.strip()
    basic = {"authorization": "Basic " + base64.b64encode(f"{wk}:".encode()).decode()}
    return out["tokenId"], wk, {"auth-token": out["token"]}, basic


def use_until_cached(http: Any, server: Server, h: dict[str, str], basic: dict[str, str]) -> None:
    """Requests with the token and the writeKey, so the server has their lookups cached."""
    for _ in range(3):
        assert http.post(f"{server.base}/track", json=TRACK, headers=h).status_code == 200
        assert http.get(f"{server.base}/events/", headers=h).status_code == 200
        assert http.post(f"{server.url}/v1/track", json=TRACK, headers=basic).status_code == 200


def test_a_revocation_by_another_process_refuses_the_next_request(tmp_path: Path) -> None:
    d = tmp_path / "data"
    creds = init_data_dir(d)
    server = Server(d, free_port(), creds, env={"MALLARD_RATE_BURST": "100000"})
    server.start()
    revoker = subprocess.Popen(
        [sys.executable, "-c", _REVOKER, str(d / "control.sqlite")],
        cwd=REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert revoker.stdin is not None and revoker.stdout is not None

    def revoke(kind: str, value: str) -> None:
        assert revoker.stdin is not None and revoker.stdout is not None
        revoker.stdin.write(f"{kind} {value}\n")
        revoker.stdin.flush()
        assert revoker.stdout.readline().strip() == "1"

    try:
        assert revoker.stdout.readline().strip() == "ready"
        token_id, wk, h, basic = revocable_credentials(d)
        track = TRACK
        with httpx.Client(timeout=10) as http:
            use_until_cached(http, server, h, basic)

            revoke("token", token_id)
            r = http.post(f"{server.base}/track", json=track, headers=h)
            assert r.status_code == 403 and r.json()["success"] is False, r.text
            r = http.get(f"{server.base}/events/", headers=h)
            assert r.status_code == 401 and r.json()["error"]["code"] == "authentication_error"

            assert http.post(f"{server.url}/v1/track", json=track, headers=basic).status_code == 200
            revoke("key", wk)
            r = http.post(f"{server.url}/v1/track", json=track, headers=basic)
            assert r.status_code == 403, r.text
            # The demo token is not affected.
            assert server.post("track", track).status_code == 200
    finally:
        revoker.stdin.close()
        revoker.wait(timeout=30)
        server.stop()
