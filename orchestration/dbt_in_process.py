"""dbt on a thread of the pipeline's own process, behind the subprocess that dagster-dbt starts.

dagster-dbt's `DbtCliResource.cli` runs `dbt` as a subprocess and reads its JSON log lines from
stdout. A new Python process pays for importing dbt again and for loading the project before the
first model runs: at 10M messages, ~4.4 s of every pass, where the Dagster process has most of
dbt imported already (dagster-dbt imports it). `DbtThread` stands in for that subprocess: same
arguments, and the same JSON lines, from dbt's programmatic runner (`dbtRunner`) on a thread, so
dagster-dbt's own parsing, asset events, errors and selection all stay as they are. In one
process (`mallard pipeline run`) the first model starts ~2.4 s sooner; a `--watch` process that
runs pass after pass keeps dbt imported, and later passes start ~3.8 s sooner.

`in_process_dbt()` swaps it in for the duration of one `cli()` call. This module is the one
that knows dagster-dbt's internals: `dagster_dbt.core.dbt_cli_invocation` calls
`subprocess.Popen` with the arguments `DbtThread` takes and reads its stdout, and
tests/unit/orchestration/test_dbt_in_process.py fails when that changes. MALLARD_DBT_IN_PROCESS=0
keeps the subprocess: the way around such a change until this module follows it.
"""

from __future__ import annotations

import contextlib
import json
import queue
import threading
from collections.abc import Iterator, Sequence
from types import SimpleNamespace
from typing import Any

from orchestration.context import yield_cpu_to_readers
from orchestration.environment import dbt_environment

# The dagster-dbt release whose `DbtCliInvocation.run` this module stands in for.
CHECKED_AGAINST_DAGSTER_DBT = "0.29.27"
_END = b""
# One cli() at a time swaps the module's subprocess (one build at a time: the writer's turn).
_SWAP = threading.Lock()


class _Lines:
    """The stdout of a `DbtThread`: the JSON log lines dbt writes to its console, in order."""

    def __init__(self) -> None:
        self._q: queue.SimpleQueue[bytes] = queue.SimpleQueue()
        self.closed = False

    def put(self, line: bytes) -> None:
        self._q.put(line)

    def __iter__(self) -> Iterator[bytes]:
        while (line := self._q.get()) != _END:
            yield line

    def __enter__(self) -> _Lines:
        return self

    def __exit__(self, *exc: object) -> None:
        self.closed = True


class DbtThread:
    """What dagster-dbt uses of a `subprocess.Popen` of `dbt` (args, stdout, wait, returncode,
    send_signal), running the command with dbtRunner on a thread of this process."""

    def __init__(
        self,
        args: Sequence[str],
        stdout: Any = None,
        stderr: Any = None,
        env: dict[str, str] | None = None,
        cwd: Any = None,
    ) -> None:
        self.args = list(args)
        self.stdout = _Lines()
        self.returncode: int | None = None
        self._thread = threading.Thread(
            target=self._run, args=(self.args[1:], dict(env or {})), name="dbt", daemon=True
        )
        self._thread.start()

    def _run(self, args: list[str], env: dict[str, str]) -> None:
        # What the subprocess would have had: dbt's own settings (log format, paths, profiles)
        # come in DBT_* variables. DBT_QUIET: dbt's console is the lines forwarded here, not
        # this process's stdout.
        try:
            with dbt_environment(extra={**env, "DBT_QUIET": "true"}):
                # This thread's priority is inherited by the DuckDB workers dbt starts on it.
                yield_cpu_to_readers()
                self.returncode = _invoke(args, self.stdout.put)
        except BaseException as e:  # reported like dbt's own fatal errors, never lost
            self.stdout.put(_error_line(f"{type(e).__name__}: {e}"))
            self.returncode = 2
        finally:
            self.stdout.put(_END)

    def wait(self, timeout: float | None = None) -> int | None:
        self._thread.join(timeout)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        """dbtRunner cannot be interrupted; the model under way finishes, and nothing it has not
        committed is kept (each model commits once)."""


def run_dbt(args: list[str], extra: dict[str, str]) -> None:
    """`dbt <args>` on this thread with `extra` set in the environment (dbt's settings and the
    project's variables), one in-process dbt command at a time; a failure raises `DbtFailed`
    with dbt's error lines. What `ensure_manifest` parses with and `mallard docs` generates
    the site with, where a `dbt` subprocess would first pay for starting Python and importing
    dbt again."""
    errors: list[str] = []

    def keep_errors(line: bytes) -> None:
        event = json.loads(line)
        if event["info"]["level"] == "error":
            errors.append(str(event["info"]["msg"]))

    with _SWAP, dbt_environment(extra={**extra, "DBT_QUIET": "true"}):
        code = _invoke(args, keep_errors)
    if code != 0:
        raise DbtFailed(f"dbt {' '.join(args[:1])} failed ({code}): " + " | ".join(errors))


class DbtFailed(RuntimeError):
    """A dbt command run by `run_dbt` did not succeed."""


def _invoke(args: list[str], emit: Any) -> int:
    from dbt.adapters.duckdb.connections import DuckDBConnectionManager
    from dbt.cli.main import dbtRunner
    from dbt_common.events.base_types import EventLevel
    from dbt_common.events.functions import msg_to_json

    def forward(msg: Any) -> None:
        # What the CLI prints to stdout: info and above (dbt's debug events go to dbt.log).
        if msg.info.level != EventLevel.DEBUG:
            emit(msg_to_json(msg).encode())

    try:
        result = dbtRunner(callbacks=[forward]).invoke(args)
    finally:
        # dbt-duckdb keeps its DuckDB instance in a class attribute across invocations; close it,
        # so a long-lived process holds no warehouse memory or DuckDB threads between passes.
        env = DuckDBConnectionManager._ENV
        DuckDBConnectionManager.close_all_connections()
        if env is not None:
            env.close()
    if result.exception is not None:
        emit(_error_line(f"{type(result.exception).__name__}: {result.exception}"))
        return 2
    return 0 if result.success else 1


def _error_line(msg: str) -> bytes:
    return json.dumps(
        {"info": {"name": "MainEncounteredError", "level": "error", "msg": msg}, "data": {}}
    ).encode()


@contextlib.contextmanager
def in_process_dbt() -> Iterator[None]:
    """dagster-dbt's `cli()` starts a `DbtThread` instead of a `dbt` subprocess meanwhile."""
    from dagster_dbt.core import dbt_cli_invocation

    with _SWAP:
        real = dbt_cli_invocation.subprocess
        dbt_cli_invocation.subprocess = SimpleNamespace(  # type: ignore[assignment]
            Popen=DbtThread, PIPE=real.PIPE, STDOUT=real.STDOUT
        )
        try:
            yield
        finally:
            dbt_cli_invocation.subprocess = real
