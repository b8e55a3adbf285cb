"""`mallard sql`: the DuckDB shell of the pinned version, with the warehouse attached read-only."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

from mallard.paths import DataPaths
from mallard.warehouse import duckdb_config, lake_attach_sql

# --format: the shell's output mode flag. Without --format the shell keeps its own default
# (duckbox in a terminal).
FORMATS = {"table": "-table", "csv": "-csv", "json": "-json"}
# Marts first: `select count(*) from customers` reads lake.marts.customers. Tables an analyst
# creates still go to the in-memory database, the shell's default, since the lake is read-only.
SEARCH_PATH = "lake.marts,lake.main"


def cli_binary() -> Path:
    """The duckdb executable of the `duckdb-cli` wheel (the same version as the duckdb pin).

    The wheel's `duckdb` script is a Python wrapper that adds its own extension directory;
    the binary itself is started instead, so only the settings below apply.
    """
    spec = importlib.util.find_spec("duckdb_cli")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("missing wheel duckdb-cli: run `make install`")
    binary = Path(next(iter(spec.submodule_search_locations))) / "duckdb"
    if not binary.is_file():
        raise RuntimeError(f"the duckdb-cli wheel has no binary at {binary}: run `make install`")
    return binary


def _quote(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def init_sql(paths: DataPaths) -> str:
    """What the shell runs before anything else: the process-wide settings every Mallard
    connection has (extensions from the wheels' directory, never installed from the network),
    the lake attached read-only and the marts first on the search path."""
    # duckdb_config lays the wheel-shipped extensions out first.
    lines = [f"SET {name} = {_quote(str(v))};" for name, v in duckdb_config(paths).items()]
    lines += [
        "LOAD ducklake;",
        "LOAD sqlite_scanner;",
        lake_attach_sql(paths, read_only=True) + ";",
        f"SET search_path = {_quote(SEARCH_PATH)};",
        # The marts' views (dbt's SQL) use the `x -> ...` lambda; the shell would print a
        # deprecation warning on stdout for each read of one, inside csv or json output.
        "SET lambda_syntax = 'ENABLE_SINGLE_ARROW';",
    ]
    return "\n".join(lines)


def shell_argv(paths: DataPaths, sql: str | None, fmt: str | None) -> list[str]:
    """The command line of the shell: an in-memory database, the init run with -cmd (an
    error there ends the shell, non-zero), then -c SQL when given."""
    argv = [str(cli_binary())]
    if fmt is not None:
        argv.append(FORMATS[fmt])
    argv += ["-cmd", init_sql(paths)]
    if sql is not None:
        argv += ["-c", sql]
    return argv


def run(paths: DataPaths, sql: str | None, fmt: str | None) -> int:
    """Replace this process with the shell: interactive, it owns the terminal; with SQL, its
    exit code (non-zero on an error, printed on stderr) is the command's."""
    if not paths.lake_catalog.exists():
        print(f"{paths.root} has no warehouse: run `mallard init` first", file=sys.stderr)
        return 2
    argv = shell_argv(paths, sql, fmt)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(argv[0], argv)
