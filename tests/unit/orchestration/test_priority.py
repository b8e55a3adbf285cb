"""The pipeline's builds run niced, so the API's reads on the same machine come first."""

from __future__ import annotations

import os
import subprocess
import sys


def _nice_after(env: dict[str, str], calls: int) -> int:
    code = (
        "import os\n"
        "from orchestration.context import yield_cpu_to_readers\n"
        f"for _ in range({calls}): yield_cpu_to_readers()\n"
        "print(os.nice(0))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        check=True,
    )
    return int(out.stdout.strip())


def test_builds_run_at_the_configured_niceness_once() -> None:
    base = os.nice(0)
    assert _nice_after({"MALLARD_PIPELINE_NICE": str(base + 7)}, 1) == base + 7
    # Called by every asset of a run: the niceness does not climb.
    assert _nice_after({"MALLARD_PIPELINE_NICE": str(base + 7)}, 3) == base + 7
    # Never lowered (that would need privileges, and is not this setting's job).
    assert _nice_after({"MALLARD_PIPELINE_NICE": "0"}, 1) == base
