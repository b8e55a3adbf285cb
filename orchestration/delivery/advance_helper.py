"""The second process of a large journey advance (dispatch.advance): it moves the instances it
is given as the dispatcher moves its own (dispatch.move_instances: batches, each one outbox
transaction), on the same data dir, config and clock.

    python -m orchestration.delivery.advance_helper   (stdin: {"root", "url", "ids"} as JSON)

It prints one JSON line, {"moved", "exited"}. Moving is CPU work (guards, templates, JSON,
SQLite statements); each process works out its batches outside the outbox's write lock and
takes the lock only to write one, so two use both cores of a 2-core machine.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mallard.paths import DataPaths
    from orchestration.delivery.dispatch import DispatchResult

log = logging.getLogger(__name__)

# The directory that holds the `orchestration` and `mallard` packages.
_ROOT = Path(__file__).resolve().parents[2]


def start(paths: DataPaths, url: str, ids: list[str]) -> subprocess.Popen[bytes]:
    """The helper, started on `ids` (a process of this interpreter, environment and config)."""
    from mallard.config import config_dir

    env = dict(os.environ)
    env["MALLARD_CONFIG_DIR"] = str(config_dir())
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(_ROOT), env.get("PYTHONPATH")]))
    proc = subprocess.Popen(
        [sys.executable, "-m", "orchestration.delivery.advance_helper"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=env,
    )
    assert proc.stdin is not None
    try:
        proc.stdin.write(json.dumps({"root": str(paths.root), "url": url, "ids": ids}).encode())
        proc.stdin.close()
    except BrokenPipeError:  # it died at start: join() says so
        pass
    return proc


def join(proc: subprocess.Popen[bytes], result: DispatchResult) -> None:
    """Waits for the helper and adds its moves to `result`; its failure is an error there."""
    assert proc.stdout is not None
    out = proc.stdout.read()
    proc.stdout.close()
    code = proc.wait()
    lines = out.decode(errors="replace").strip().splitlines()
    if code != 0 or not lines:
        message = f"journey advance helper exited with {code}: its instances stay due"
        log.error(message)
        result.errors.append(message)
        return
    done: dict[str, Any] = json.loads(lines[-1])
    result.moved += int(done["moved"])
    result.exited += int(done["exited"])


def main() -> int:
    # The ids first: the dispatcher's write to the pipe waits for this read, and the imports
    # below take 1.3-2.7 s on this machine.
    request = json.loads(sys.stdin.buffer.read())

    from mallard.paths import DataPaths
    from orchestration.delivery.dispatch import (
        DispatchResult,
        Planning,
        move_instances,
        outbox_path,
    )
    from orchestration.delivery.outbox import Outbox

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    paths = DataPaths(Path(request["root"]))
    result = DispatchResult()
    outbox = Outbox(outbox_path(paths))
    planning = Planning.load(paths, request["url"])
    try:
        move_instances(paths, outbox, result, planning, request["ids"])
    finally:
        planning.close()
        outbox.close()
    print(json.dumps({"moved": result.moved, "exited": result.exited}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
