"""The CLI contract: init is idempotent, tokens are shown once and revocable."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO, mallard


def test_init_is_idempotent_and_prints_json(tmp_path: Path) -> None:
    d = tmp_path / "data"
    first = json.loads(mallard("init", "--json", data_dir=d).stdout)
    assert set(first) == {"clientId", "accountId", "brandId", "token", "writeKey", "dataDir"}
    assert (first["clientId"], first["accountId"], first["brandId"]) == ("demo", "demo", "DEMO")
    assert first["dataDir"] == str(d.resolve())
    for sub in ("control.sqlite", "lake/catalog.sqlite", "wal", "landing"):
        assert (d / sub).exists(), sub
    before = sorted(p.name for p in d.iterdir())
    again = mallard("init", data_dir=d).stdout
    assert "nothing changed" in again
    assert json.loads(mallard("init", "--json", data_dir=d).stdout) == first
    assert sorted(p.name for p in d.iterdir()) == before
    tokens = json.loads(mallard("tokens", "list", "--json", data_dir=d).stdout)
    assert len(tokens) == 1


def test_tokens_create_list_revoke(tmp_path: Path) -> None:
    d = tmp_path / "data"
    mallard("init", data_dir=d)
    made = json.loads(
        mallard("tokens", "create", "--scope", "brand:demo/demo/DEMO", "--json", data_dir=d).stdout
    )
    assert made["token"].startswith("mlt_")
    listed = mallard("tokens", "list", data_dir=d).stdout
    assert made["tokenId"] in listed and made["token"] not in listed
    assert "brand:demo/demo/DEMO" in listed
    assert mallard("tokens", "revoke", made["tokenId"], data_dir=d).returncode == 0
    rows = json.loads(mallard("tokens", "list", "--json", data_dir=d).stdout)
    assert [r["revoked"] for r in rows if r["tokenId"] == made["tokenId"]] == [True]
    bad = mallard("tokens", "create", "--scope", "brand:demo/demo/NOPE", data_dir=d, check=False)
    assert bad.returncode == 2 and "unknown brand" in bad.stderr


def test_a_command_started_with_sigint_ignored_can_still_be_stopped() -> None:
    """A background job of a shell starts with SIGINT ignored; after a Dagster run on the main
    thread (as `mallard pipeline run` makes) SIGTERM must still stop the process and the
    processes it starts, not be ignored like SIGINT."""
    script = (
        "import signal\n"
        "from dagster._utils.interrupts import capture_interrupts\n"
        "from mallard.cli import default_stop_signals\n"
        "default_stop_signals()\n"
        "with capture_interrupts():\n"
        "    pass\n"
        "print(signal.getsignal(signal.SIGTERM) is signal.SIG_IGN,"
        " signal.getsignal(signal.SIGINT) is signal.SIG_IGN)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "False"]
