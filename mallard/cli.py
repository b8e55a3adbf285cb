"""The `mallard` command line: init, serve, pipeline run, tokens, accounts, writekeys,
regulations, sql, docs, import, demo, up, mailbox.

With mallard/app.py, the composition root: the only modules of mallard/ that import api/,
collector/ and orchestration/ (each command imports what it runs, when it runs).
"""

from __future__ import annotations

import argparse
import faulthandler
import gc
import json
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mallard.paths import DataPaths
from mallard.settings import Settings, get_settings
from mallard.tenancy import ControlStore, Scope, TenancyError

if TYPE_CHECKING:
    from mallard.regulation_runs import RegulationRuns
    from mallard.regulations import RegulationStore
    from orchestration.pipeline import StepResult

DEMO = ("demo", "demo", "DEMO")


def _paths(args: argparse.Namespace) -> DataPaths:
    return DataPaths(Path(args.data_dir).resolve())


def _demo_file(paths: DataPaths) -> Path:
    # The demo credentials are kept (0600, git-ignored) so `make run` can show them again;
    # tokens made with `mallard tokens create` are shown once and never stored.
    return paths.root / "demo-credentials.json"


def cmd_init(args: argparse.Namespace) -> int:
    from mallard.config import apply_tenants
    from mallard.warehouse import ensure_extensions
    from orchestration.warehouse import ensure_warehouse

    paths = _paths(args)
    creds_file = _demo_file(paths)
    if creds_file.exists():
        creds = json.loads(creds_file.read_text())
        ensure_warehouse(paths)
        if args.json:
            print(json.dumps(creds))
        else:
            print(f"{paths.root} is already initialised; nothing changed.")
            _print_creds(creds)
        return 0
    paths.root.mkdir(parents=True, exist_ok=True)
    for d in (paths.wal_dir, paths.landing_dir, paths.lake_data, paths.dagster_home, paths.run_dir):
        d.mkdir(parents=True, exist_ok=True)
    ensure_extensions(paths)
    ensure_warehouse(paths)
    control = ControlStore(paths.control_db)
    apply_tenants(control)
    client, account, brand = DEMO
    control.add_account(client, account)
    _, secret = control.create_token(Scope("client", client), name="demo (mallard init)")
    write_key = control.create_write_key(client, account, brand)
    creds = {
        "clientId": client,
        "accountId": account,
        "brandId": brand,
        "token": secret,
        "writeKey": write_key,
        "dataDir": str(paths.root),
    }
    fd = os.open(creds_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(creds, f)
    if args.json:
        print(json.dumps(creds))
    else:
        print(f"Initialised {paths.root}")
        _print_creds(creds)
    return 0


def _print_creds(creds: dict[str, str]) -> None:
    print(f"  client/account/brand: {creds['clientId']}/{creds['accountId']}/{creds['brandId']}")
    print(f"  auth-token (all accounts of client {creds['clientId']}): {creds['token']}")
    print(f"  writeKey: {creds['writeKey']}")


SERVE_SWITCH_INTERVAL_S = 0.0005


def cmd_serve(args: argparse.Namespace) -> int:
    import uvicorn

    from mallard.app import create_app
    from mallard.head_deadline import head_guard

    settings = get_settings().with_data_dir(args.data_dir)
    if not DataPaths(settings.data_dir).control_db.exists():
        print(f"{settings.data_dir} is not initialised: run `mallard init` first", file=sys.stderr)
        return 2
    workers = settings.serve_workers if args.workers is None else args.workers
    if workers < 1:
        print(f"mallard serve: --workers must be 1 or more, not {workers}", file=sys.stderr)
        return 2
    if workers > 1 and args.worker is None:
        from mallard.workers import supervise_servers

        _print_serving(settings, args, f" ({workers} workers)")
        serve_args = ["--data-dir", str(settings.data_dir), "--host", args.host]
        serve_args += ["--port", str(args.port), "--log-level", args.log_level]
        return supervise_servers(serve_args, workers, settings.collector_id)
    # A request thread waiting for the GIL gets it after at most this long (Python's default:
    # 5 ms): a short read (traits, ~1 ms) no longer waits 5 ms behind a long one (an events
    # page, the read index being built) that holds the GIL in Python code.
    sys.setswitchinterval(SERVE_SWITCH_INTERVAL_S)
    options: dict[str, Any] = {
        "host": args.host,
        "port": args.port,
        "log_level": args.log_level,
        "access_log": False,
        "timeout_graceful_shutdown": 10,
        # uvicorn bounds neither the time nor the size of a request's head (httptools).
        "http": head_guard(settings.limits.head_timeout_s, settings.limits.max_head_bytes),
    }
    config = uvicorn.Config(create_app(settings), **options)
    paths = DataPaths(settings.data_dir)
    if args.worker is None:
        _print_serving(settings, args, "")
        started = _run_server(config, paths)
    else:
        # One of `--workers N` (mallard/workers.py): the port shared with the others.
        from mallard.workers import reuseport_socket

        started = _run_server(config, paths, reuseport_socket(args.host, args.port))
    return 0 if started else 3  # uvicorn.run's exit code when start-up failed


def _run_server(config: Any, paths: DataPaths, sock: Any = None) -> bool:
    """uvicorn's server on `config` (on `sock` when given) until it stops, recording the address
    it listens on once it does (mallard/served.py); whether it started."""
    import uvicorn

    from mallard import served

    class Server(uvicorn.Server):
        async def startup(self, sockets: list[Any] | None = None) -> None:
            await super().startup(sockets)
            if self.started:
                host, port = self.servers[0].sockets[0].getsockname()[:2]
                served.record(paths, host, port)

    server = Server(config)
    server.run(sockets=None if sock is None else [sock])
    return bool(server.started)


def _print_serving(settings: Settings, args: argparse.Namespace, how: str) -> None:
    base = f"http://{args.host}:{args.port}"
    print(f"Mallard serving {settings.data_dir}{how}", flush=True)
    print(f"  ingestion + read API: {base}/track/<clientId>/<accountId>/<BRANDID>/v1/", flush=True)
    print(f"  tag, mobile, preferences: {base}/cdp/   health: {base}/health", flush=True)
    print(f"  OpenAPI: {base}/schema", flush=True)


def report_steps(results: list[StepResult]) -> bool:
    """A pass's steps, a line each; whether every one succeeded."""
    ok = True
    for step in results:
        print(f"{'ok  ' if step.ok else 'FAIL'} {step.name}: {step.summary}", flush=True)
        ok = ok and step.ok
    return ok


def run_pass(data_dir: Path, kind: str) -> int:
    """One pass of a kind (orchestration/window.py PassKind: full or served), its steps printed
    as `mallard pipeline run` prints them; 0 when every step succeeded. The watcher runs served
    passes; the test harness (mallard/harness.py) runs them through this."""
    from mallard.offline import force_offline
    from orchestration.pipeline import BY_THE_WATCHER, run_pipeline
    from orchestration.window import PassKind

    force_offline()
    return 0 if report_steps(run_pipeline(data_dir, BY_THE_WATCHER, PassKind(kind))) else 1


def cmd_pipeline_run(args: argparse.Namespace) -> int:
    import logging

    from orchestration.pipeline import PASS_BEGINS, run_pipeline, watch_pipeline

    # The CLI prints one line per step; Dagster's own INFO lines (each pass's dbt command with its
    # whole selection, kilobytes long) stay in the run's log in the Dagster UI.
    logging.getLogger("dagster.builtin").setLevel(logging.WARNING)
    if not args.watch:
        return 0 if report_steps(run_pipeline(_paths(args).root)) else 1
    import signal
    import threading

    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):  # finish the pass under way, then exit
        signal.signal(sig, lambda *_: stop.set())
    from orchestration.locks import WatcherRunning

    print(f"watching {_paths(args).landing_dir} for landing files (stop: Ctrl-C)", flush=True)
    try:
        passes = watch_pipeline(
            _paths(args).root,
            stop,
            report_steps,
            poll_s=args.poll,
            begin=lambda kind: print(PASS_BEGINS[kind], flush=True),
        )
    except WatcherRunning as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"stopped after {passes} passes", flush=True)
    return 0


def cmd_pipeline_status(args: argparse.Namespace) -> int:
    """The last pass's record, the watcher, and who holds the lake writer's turn; exits 1 when
    the last pass failed, 2 when no pass has run."""
    import dataclasses

    from mallard.passes import read_last_pass
    from orchestration.locks import watcher_pid, writer_holder

    paths = _paths(args)
    last = read_last_pass(paths)
    watcher = watcher_pid(paths)
    holder = writer_holder(paths)
    if args.json:
        record = dataclasses.asdict(last) if last else None
        writer = holder.to_json() if holder else None
        print(json.dumps({"lastPass": record, "watcherPid": watcher, "lakeWriter": writer}))
    else:
        print(last.line() if last else "no pass has run in this data dir")
        print(f"watcher: {'pid ' + str(watcher) if watcher is not None else 'not running'}")
        print(f"lake writer: {'held by ' + holder.line() if holder else 'free'}")
    return 2 if last is None else (0 if last.ok else 1)


def cmd_tokens(args: argparse.Namespace) -> int:
    control = ControlStore(_paths(args).control_db)
    if args.tokens_cmd == "create":
        token, secret = control.create_token(Scope.parse(args.scope), name=args.name or "")
        if args.json:
            print(
                json.dumps({"tokenId": token.token_id, "scope": str(token.scope), "token": secret})
            )
        else:
            print(f"token {token.token_id} ({token.scope}); shown once, store it now:\n{secret}")
    elif args.tokens_cmd == "list":
        rows = [
            {
                "tokenId": t.token_id,
                "name": t.name,
                "scope": str(t.scope),
                "revoked": t.revoked_at is not None,
            }
            for t in control.list_tokens()
        ]
        _table(rows, args.json)
    elif args.tokens_cmd == "revoke":
        if not control.revoke_token(args.token_id):
            print(f"no live token {args.token_id}", file=sys.stderr)
            return 1
        print(f"revoked {args.token_id}")
    return 0


def cmd_accounts(args: argparse.Namespace) -> int:
    control = ControlStore(_paths(args).control_db)
    if args.accounts_cmd == "add":
        created = control.add_account(args.client_id, args.account_id or args.client_id)
        for brand in args.brand or []:
            control.add_brand(args.client_id, args.account_id or args.client_id, brand)
        print("added" if created else "exists")
    elif args.accounts_cmd == "sync":
        from mallard.config import apply_tenants, config_dir

        path = Path(args.file) if args.file else config_dir() / "tenants.toml"
        added = apply_tenants(control, path)
        print(f"{path}: " + (f"added {', '.join(added)}" if added else "nothing to add"))
    elif args.accounts_cmd == "list":
        rows = [
            {"clientId": c, "accountId": a, "brands": ",".join(b) or f"{a.upper()} (default)"}
            for c, a, b in control.accounts()
        ]
        _table(rows, args.json)
    return 0


def cmd_assets(args: argparse.Namespace) -> int:
    from mallard.assets import check_assets
    from mallard.config import config_dir

    directory = Path(args.config_dir) if args.config_dir else config_dir()
    results = check_assets(directory)
    for r in results:
        print(r.line)
    if not results:
        print(f"no assets under {directory / 'assets'}")
    return 0 if all(r.ok for r in results) else 1


def cmd_journeys_check(args: argparse.Namespace) -> int:
    from mallard.config import config_dir
    from mallard.journeys import check_journeys, journeys_dir

    directory = Path(args.config_dir) if args.config_dir else config_dir()
    results = check_journeys(directory)
    for r in results:
        print(r.line)
    if not results:
        print(f"no journeys under {journeys_dir(directory)}")
    return 0 if all(r.ok for r in results) else 1


def cmd_audiences_check(args: argparse.Namespace) -> int:
    from mallard.audiences import audiences_dir, check
    from mallard.config import config_dir
    from mallard.warehouse import connect

    directory = audiences_dir(Path(args.config_dir) if args.config_dir else config_dir())
    paths = _paths(args)
    # Bound against the marts when the lake has them; else each file is only read.
    con = connect(paths, read_only=True) if paths.lake_catalog.exists() else None
    try:
        results = check(con, directory)
    finally:
        if con is not None:
            con.close()
    for r in results:
        print(r.line)
    if not results:
        print(f"no audiences under {directory}")
    return 0 if all(r.ok for r in results) else 1


def cmd_journeys_dry_run(args: argparse.Namespace) -> int:
    from mallard.config import config_dir
    from mallard.journeys import JourneyError, load_journeys_and_errors
    from orchestration.delivery.journeys import dry_run

    journeys, broken = load_journeys_and_errors(config_dir())
    if args.journey in broken:
        print(f"error: {broken[args.journey]}", file=sys.stderr)
        return 1
    journey = journeys.get(args.journey)
    if journey is None:
        known = ", ".join(sorted(journeys)) or "none"
        print(f"error: no journey {args.journey!r} (known: {known})", file=sys.stderr)
        return 1
    if args.step and args.step not in journey.steps:
        print(f"error: no step {args.step!r} in {args.journey}", file=sys.stderr)
        return 1
    try:
        lines = dry_run(_paths(args), journey, args.user, args.account, args.step, args.event or ())
    except (JourneyError, LookupError) as e:
        print(f"error: {e.args[0] if isinstance(e, LookupError) else e}", file=sys.stderr)
        return 1
    print(f"{journey.journey_id} ({journey.name}) for userId {args.user}, nothing is sent:")
    for line in lines:
        print(f"  {line}")
    return 0


def cmd_dispatch(args: argparse.Namespace) -> int:
    from orchestration.delivery.dispatch import dispatch

    print(dispatch(_paths(args)).summary(), flush=True)
    return 0


def cmd_writekeys(args: argparse.Namespace) -> int:
    control = ControlStore(_paths(args).control_db)
    if args.writekeys_cmd == "list":
        _table(control.list_write_keys(), args.json)
        return 0
    if args.writekeys_cmd == "revoke":
        n = control.revoke_write_key(args.key)
        print(f"revoked {n} writeKey(s)")
        return 0 if n else 1
    account = args.account_id or args.client_id
    brand = args.brand_id or account.upper()
    if args.writekeys_cmd == "rotate":
        print(control.rotate_write_key(args.client_id, account, brand))
    else:
        print(control.create_write_key(args.client_id, account, brand))
    return 0


def _regulation_runs(paths: DataPaths) -> RegulationRuns:
    from mallard.regulation_runs import RegulationRuns
    from orchestration.environment import TELEMETRY_OFF

    return RegulationRuns(paths, TELEMETRY_OFF)


def _regulation_body(args: argparse.Namespace) -> bytes:
    """The request body: the --body file (- for stdin), else built from --type and the ids."""
    if args.body:
        if args.type or args.ids:
            raise SystemExit("mallard: give either --body or --type with userIds, not both")
        return sys.stdin.buffer.read() if args.body == "-" else Path(args.body).read_bytes()
    if not args.type or not args.ids:
        raise SystemExit("mallard: give --type and at least one userId (or --body FILE)")
    subject = {"type": "USER_ID", "ids": args.ids}
    return json.dumps({"regulationType": args.type, "subject": subject}).encode()


def cmd_regulations(args: argparse.Namespace) -> int:
    """File, list, show and download regulations, and run them: what the HTTP routes do, for
    an operator on the server's machine (same checks, same JSON answers)."""
    from api.regulations import describe, download_file, encode, filed, parse_body, summary
    from mallard.errors import MallardError
    from mallard.regulations import RegulationStore

    paths = _paths(args)
    if not paths.control_db.exists():
        print(f"{paths.root} is not initialised: run `mallard init` first", file=sys.stderr)
        return 2
    store = RegulationStore(paths)
    try:
        if args.regulations_cmd == "run":
            if args.unfinished == bool(args.regulation_id):
                print("mallard: name a regulation or --unfinished, not both", file=sys.stderr)
                return 2
            if args.unfinished:
                return _run_unfinished(paths, store)
            if store.get(args.regulation_id) is None:
                print(f"mallard: no regulation {args.regulation_id}", file=sys.stderr)
                return 1
            ran = _run_regulation(paths, store, args.regulation_id)
            return 1 if ran == "failed" else 0
        if args.regulations_cmd == "file":
            from api.regulations import file_regulation
            from api.service import Warehouse
            from collector.messages import Tenant

            account = args.account or args.client
            brand = args.brand or account.upper()
            control = ControlStore(paths.control_db)
            if not control.tenant_exists(args.client, account, brand):
                print(f"mallard: unknown brand {args.client}/{account}/{brand}", file=sys.stderr)
                return 2
            kind, user_ids = parse_body(_regulation_body(args))
            warehouse = Warehouse(paths, use_index=False)
            try:
                reg = file_regulation(
                    store,
                    warehouse,
                    _regulation_runs(paths),
                    Tenant(args.client, account, brand),
                    kind,
                    user_ids,
                )
            finally:
                warehouse.close()
            _print_bytes(encode(filed(reg)))
        elif args.regulations_cmd == "list":
            regs = store.list(args.client, args.account or args.client, args.limit)
            _print_bytes(encode({"data": [summary(r) for r in regs]}))
        elif args.regulations_cmd == "resume":
            started = _regulation_runs(paths).resume(store)
            for regulation_id, pid in started.items():
                print(f"regulation {regulation_id}: run started (pid {pid})")
            if not started:
                print("no unfinished regulation without a live run")
        else:
            found = store.get(args.regulation_id)
            if found is None:
                print(f"mallard: no regulation {args.regulation_id}", file=sys.stderr)
                return 1
            if args.regulations_cmd == "show":
                _print_bytes(encode(describe(found, store.hash)))
            else:
                import shutil

                source = download_file(found, paths)
                target = Path(args.output or f"access-{found.regulation_id}.zip")
                shutil.copyfile(source, target)
                print(f"{target} ({target.stat().st_size} bytes)")
    except MallardError as e:
        print(f"mallard: {e.message}", file=sys.stderr)
        return 1
    finally:
        store.close()
    return 0


def _print_bytes(line: bytes) -> None:
    sys.stdout.buffer.write(line + b"\n")
    sys.stdout.flush()


def _run_regulation(paths: DataPaths, store: RegulationStore, regulation_id: str) -> str:
    """Run a regulation in this process, unless a live run of it holds its lock; its status
    after."""
    from mallard.regulation_runs import run_lock, say

    with run_lock(paths, regulation_id) as held:
        if not held:
            say(regulation_id, "a live run holds it; not run again")
            return "running"
        say(regulation_id, f"run started (pid {os.getpid()})")
        from orchestration.regulations.job import run_regulation

        run_regulation(paths.root, regulation_id)
    reg = store.get(regulation_id)
    status, error = (reg.status, reg.error) if reg else ("gone", None)
    say(regulation_id, f"run ended: {status}" + (f" ({error})" if error else ""))
    return status


def _run_unfinished(paths: DataPaths, store: RegulationStore) -> int:
    """Run every unfinished regulation in filing order in this process, those filed meanwhile
    too, skipping any a live run holds; 1 if one failed. One such run at a time."""
    from mallard.regulation_runs import BACKLOG, run_lock, say

    failed = 0
    with run_lock(paths, BACKLOG, wait_s=0) as held:
        if not held:
            print("a live run takes the unfinished regulations already")
            return 0
        tried: set[str] = set()
        while todo := [r.regulation_id for r in store.unfinished() if r.regulation_id not in tried]:
            for regulation_id in todo:
                tried.add(regulation_id)
                try:
                    failed += _run_regulation(paths, store, regulation_id) == "failed"
                except Exception as e:  # the regulation is failed with it; the next ones run
                    say(regulation_id, f"run stopped: {type(e).__name__}: {e}")
                    failed += 1
    return 1 if failed else 0


def cmd_up(args: argparse.Namespace) -> int:
    from mallard.up import up, up_distributed

    if args.distributed:
        return up_distributed(Path(args.data_dir), args.dagster_port)
    return up(Path(args.data_dir), args.port, args.dagster_port, args.mailbox_port)


def cmd_mailbox(args: argparse.Namespace) -> int:
    from mallard import mailbox

    paths = _paths(args)
    if args.mailbox_cmd == "serve":
        return mailbox.serve(paths, args.host, args.port)
    if args.mailbox_cmd == "list":
        rows = mailbox.list_messages(paths)
        if not args.json:
            rows = [{k: v for k, v in r.items() if k != "file"} for r in rows]
        _table(rows, args.json)
        return 0
    found = mailbox.find(paths, args.message)
    if found is None:
        print(f"mallard: no message {args.message!r} in {paths.mailbox_dir}", file=sys.stderr)
        return 1
    sys.stdout.buffer.write(found.read_bytes())
    return 0


def cmd_sql(args: argparse.Namespace) -> int:
    from mallard.sql_shell import run

    return run(_paths(args), args.command, args.format)


def cmd_docs(args: argparse.Namespace) -> int:
    from orchestration.dbt_docs import run

    return run(_paths(args), args.host, args.port, serve_site=not args.no_serve)


def cmd_import_customers(args: argparse.Namespace) -> int:
    from mallard.importer import BadRows, ImportFailed, import_customers, report

    try:
        result = import_customers(
            _paths(args),
            Path(args.file),
            client_id=args.client,
            account_id=args.account,
            brand_id=args.brand,
            mapping=args.map or [],
        )
    except ImportFailed as e:
        print(f"mallard import: {e}", file=sys.stderr)
        return 1
    if isinstance(result, BadRows):
        for line in report(result):
            print(line, file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(result.as_dict()))
    else:
        print(
            f"{result.read:,} rows read, {result.stored:,} stored,"
            f" {result.dropped:,} dropped by regulations in {result.seconds:.1f} s"
            f" ({result.rate:,.0f} rows/s)"
        )
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from mallard.demo import send_demo_traffic

    paths = _paths(args)
    creds = json.loads(_demo_file(paths).read_text())
    n = send_demo_traffic(args.url, creds)
    print(f"sent {n} demo messages to {args.url}")
    return 0


def _table(rows: list[dict[str, Any]], as_json: bool) -> None:
    if as_json:
        print(json.dumps(rows))
        return
    if not rows:
        print("(none)")
        return
    cols = list(rows[0])
    widths = [max(len(c), *(len(str(r[c])) for r in rows)) for c in cols]
    print("  ".join(c.ljust(w) for c, w in zip(cols, widths, strict=True)))
    for r in rows:
        print("  ".join(str(r[c]).ljust(w) for c, w in zip(cols, widths, strict=True)))


def build_parser() -> argparse.ArgumentParser:
    default_dir = os.environ.get("MALLARD_DATA_DIR", "./data")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--data-dir",
        default=default_dir,
        help="data directory (default: $MALLARD_DATA_DIR or ./data)",
    )
    p = argparse.ArgumentParser(prog="mallard", description="Mallard customer data platform")
    sub = p.add_subparsers(dest="cmd", required=True)

    s = sub.add_parser("init", parents=[common], help="create the data dir and a demo tenant")
    s.add_argument("--json", action="store_true")
    s.set_defaults(fn=cmd_init)

    s = sub.add_parser("serve", parents=[common], help="serve every route on one port")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=8000)
    s.add_argument("--log-level", default="warning")
    s.add_argument(
        "--workers",
        type=int,
        default=None,
        help="server processes sharing the port, each its own collector"
        " (default: $MALLARD_SERVE_WORKERS or 1)",
    )
    s.add_argument("--worker", type=int, default=None, help=argparse.SUPPRESS)
    s.set_defaults(fn=cmd_serve)

    s = sub.add_parser("pipeline", help="run the pipeline")
    pipe = s.add_subparsers(dest="pipeline_cmd", required=True)
    r = pipe.add_parser("run", parents=[common], help="load new landing files, dbt build, jobs")
    r.add_argument(
        "--watch",
        action="store_true",
        help="stay up: a pass whenever new landing files are there, in this one process",
    )
    r.add_argument("--poll", type=float, default=0.25, help="--watch: seconds between looks")
    r.set_defaults(fn=cmd_pipeline_run)
    st = pipe.add_parser(
        "status", parents=[common], help="the last pass (kind, when, ok or failed and why)"
    )
    st.add_argument("--json", action="store_true", help="the record as JSON")
    st.set_defaults(fn=cmd_pipeline_status)

    s = sub.add_parser("tokens", help="auth tokens (shown once, stored hashed)")
    t = s.add_subparsers(dest="tokens_cmd", required=True)
    c = t.add_parser("create", parents=[common])
    c.add_argument(
        "--scope", required=True, help="client:C | account:C/A | brands:C/A | brand:C/A/BRAND"
    )
    c.add_argument("--name", default="")
    c.add_argument("--json", action="store_true")
    c = t.add_parser("list", parents=[common])
    c.add_argument("--json", action="store_true")
    c = t.add_parser("revoke", parents=[common])
    c.add_argument("token_id")
    s.set_defaults(fn=cmd_tokens)

    s = sub.add_parser("accounts", help="clients, accounts and brands")
    a = s.add_subparsers(dest="accounts_cmd", required=True)
    c = a.add_parser("add", parents=[common])
    c.add_argument("client_id")
    c.add_argument("account_id", nargs="?")
    c.add_argument("--brand", action="append", help="a brand id (repeatable)")
    c = a.add_parser("list", parents=[common])
    c.add_argument("--json", action="store_true")
    c = a.add_parser("sync", parents=[common], help="apply config/tenants.toml (adds only)")
    c.add_argument("--file", help="tenants file (default: $MALLARD_CONFIG_DIR/tenants.toml)")
    s.set_defaults(fn=cmd_accounts)

    s = sub.add_parser("assets", help="campaign assets (config/assets/<assetId>/)")
    a = s.add_subparsers(dest="assets_cmd", required=True)
    c = a.add_parser("check", help="load and render every asset with its sample data")
    c.add_argument("--config-dir", help="config directory (default: $MALLARD_CONFIG_DIR)")
    s.set_defaults(fn=cmd_assets)

    # Each `journeys` subcommand sets its own fn.
    s = sub.add_parser("journeys", help="journeys (config/journeys/<journeyId>.toml)")
    j = s.add_subparsers(dest="journeys_cmd", required=True)
    c = j.add_parser("check", help="load and validate every journey")
    c.add_argument("--config-dir", help="config directory (default: $MALLARD_CONFIG_DIR)")
    c.set_defaults(fn=cmd_journeys_check)
    c = j.add_parser(
        "dry-run", parents=[common], help="print the path a customer would take, sending nothing"
    )
    c.add_argument("journey", help="the journey id")
    c.add_argument("--user", required=True, help="the customer's userId")
    c.add_argument("--account", help="the account (when the userId is in several)")
    c.add_argument("--step", help="start at this step (as stepIdToTrigger)")
    c.add_argument(
        "--event",
        action="append",
        help="take this event as happening (wait_for goes on; events.<name> counts 1); repeat",
    )
    c.set_defaults(fn=cmd_journeys_dry_run)

    s = sub.add_parser("audiences", help="audiences (config/audiences/<name>.sql)")
    au = s.add_subparsers(dest="audiences_cmd", required=True)
    c = au.add_parser(
        "check", parents=[common], help="read every audience file and bind it against the marts"
    )
    c.add_argument("--config-dir", help="config directory (default: $MALLARD_CONFIG_DIR)")
    c.set_defaults(fn=cmd_audiences_check)

    s = sub.add_parser(
        "dispatch",
        parents=[common],
        help="plan new commands, move journeys, send what is due (what a pass does after models)",
    )
    s.set_defaults(fn=cmd_dispatch)

    s = sub.add_parser("writekeys", help="writeKeys for the tag and mobile endpoints")
    w = s.add_subparsers(dest="writekeys_cmd", required=True)
    for verb, text in (("create", "a new writeKey"), ("rotate", "a new writeKey; older ones stop")):
        c = w.add_parser(verb, parents=[common], help=text)
        c.add_argument("client_id")
        c.add_argument("account_id", nargs="?")
        c.add_argument("brand_id", nargs="?")
    c = w.add_parser("list", parents=[common], help="writeKeys by prefix (never the secret)")
    c.add_argument("--json", action="store_true")
    c = w.add_parser("revoke", parents=[common], help="revoke by key or its prefix")
    c.add_argument("key")
    s.set_defaults(fn=cmd_writekeys)

    s = sub.add_parser("regulations", help="privacy requests: file, follow, download, run")
    g = s.add_subparsers(dest="regulations_cmd", required=True)
    c = g.add_parser("file", parents=[common], help="file a regulation and start its run")
    c.add_argument("--client", required=True, help="clientId")
    c.add_argument("--account", help="accountId (default: the clientId)")
    c.add_argument("--brand", help="BRANDID it is filed on (default: the accountId upper-cased)")
    c.add_argument(
        "--type",
        help="SUPPRESS_WITH_DELETE, DELETE, UNSUPPRESS, SUPPRESS, NO_TRACK, TRACK or ACCESS",
    )
    c.add_argument("--body", help="a JSON request body file instead of --type and ids (- stdin)")
    c.add_argument("ids", nargs="*", metavar="USER_ID", help="the subject's userIds")
    c = g.add_parser("list", parents=[common], help="an account's regulations, newest first")
    c.add_argument("--client", required=True, help="clientId")
    c.add_argument("--account", help="accountId (default: the clientId)")
    c.add_argument("--limit", type=int, default=100)
    c = g.add_parser("show", parents=[common], help="a regulation: status, outcome, evidence")
    c.add_argument("regulation_id")
    c = g.add_parser("run", parents=[common], help="run a regulation here (what filing starts)")
    c.add_argument("regulation_id", nargs="?")
    c.add_argument(
        "--unfinished", action="store_true", help="run every unfinished one, in filing order"
    )
    c = g.add_parser("download", parents=[common], help="copy an ACCESS regulation's zip")
    c.add_argument("regulation_id")
    c.add_argument("-o", "--output", help="file to write (default: access-<id>.zip)")
    g.add_parser("resume", parents=[common], help="start the run of the unfinished regulations")
    s.set_defaults(fn=cmd_regulations)

    s = sub.add_parser("up", parents=[common], help="init, serve, demo data, pipeline, Dagster UI")
    s.add_argument("--port", type=int, default=8000)
    s.add_argument("--dagster-port", type=int, default=3000)
    s.add_argument("--mailbox-port", type=int, default=1025, help="the local mailbox's SMTP port")
    s.add_argument(
        "--distributed",
        action="store_true",
        help="PostgreSQL catalog, S3 files, 2 collectors, 2 API replicas (docs/deploy.md)",
    )
    s.set_defaults(fn=cmd_up)

    s = sub.add_parser("mailbox", help="the local mailbox: an SMTP server keeping what it gets")
    m = s.add_subparsers(dest="mailbox_cmd", required=True)
    c = m.add_parser("serve", parents=[common], help="accept mail on loopback into data/mailbox/")
    c.add_argument("--host", default="127.0.0.1")
    c.add_argument("--port", type=int, default=1025)
    c = m.add_parser("list", parents=[common], help="the messages: date, from, to, subject, id")
    c.add_argument("--json", action="store_true")
    c = m.add_parser("show", parents=[common], help="print one message as it arrived")
    c.add_argument("message", metavar="N|MESSAGE-ID")
    s.set_defaults(fn=cmd_mailbox)

    s = sub.add_parser(
        "sql", parents=[common], help="the DuckDB shell on the warehouse (read-only, marts first)"
    )
    s.add_argument("-c", dest="command", metavar="SQL", help="run SQL, print, exit")
    s.add_argument("--format", choices=("table", "csv", "json"), help="output mode")
    s.set_defaults(fn=cmd_sql)

    s = sub.add_parser(
        "docs", parents=[common], help="the dbt docs site of the warehouse, served on loopback"
    )
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=8080, help="0: a free port (the URL is printed)")
    s.add_argument("--no-serve", action="store_true", help="generate the site, print its path")
    s.set_defaults(fn=cmd_docs)

    s = sub.add_parser("import", help="import a file into the warehouse (docs/import.md)")
    imp = s.add_subparsers(dest="import_cmd", required=True)
    c = imp.add_parser(
        "customers", parents=[common], help="a .csv, .parquet or .jsonl of customers as identifies"
    )
    c.add_argument("file")
    c.add_argument("--client", required=True)
    c.add_argument("--account", required=True)
    c.add_argument("--brand", help="default: the account's only brand")
    c.add_argument(
        "--map",
        action="append",
        metavar="COLUMN=FIELD",
        help="FIELD: userId, email, traits.<name> or - (drop); repeatable",
    )
    c.add_argument("--json", action="store_true", help="the summary as JSON")
    c.set_defaults(fn=cmd_import_customers)

    s = sub.add_parser("demo", parents=[common], help="send demo traffic to a running server")
    s.add_argument("--url", default="http://127.0.0.1:8000")
    s.set_defaults(fn=cmd_demo)
    return p


def default_stop_signals() -> None:
    """SIGINT and SIGTERM as Python sets them up, when the process inherited them ignored. A
    shell starts a background job (`mallard pipeline run &` in a script) with SIGINT ignored, and
    a Dagster run on the main thread gives SIGTERM SIGINT's handler when it ends: the command could
    no longer be stopped with `kill PID`, and every process it starts afterwards (Dagster's log
    tail of a step, which Dagster stops with SIGTERM) would ignore SIGTERM too."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if signal.getsignal(signal.SIGTERM) is signal.SIG_IGN:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def main(argv: Sequence[str] | None = None) -> int:
    # Before any command imports dbt or Dagster: no telemetry, in this process and its children.
    from mallard.offline import force_offline

    force_offline()
    # `kill -USR1 PID` prints every thread's stack to stderr (the process's log under data/run/
    # for the processes `mallard up` starts): how a stuck serve, watcher or stop is diagnosed.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    default_stop_signals()
    args = build_parser().parse_args(argv)
    try:
        return int(args.fn(args))
    except TenancyError as e:
        print(f"mallard: {e}", file=sys.stderr)
        return 2
    finally:
        # Python's last garbage collections at exit walk every object a command leaves: after a
        # `pipeline run` at 10M messages (~400k objects: Dagster, dbt's manifest) they took
        # 1.1 s of the pass, measured. Frozen, they are left to the OS; files, the warehouse
        # and Dagster's storage are closed by then, and refcounted objects still finalize.
        gc.freeze()


if __name__ == "__main__":
    sys.exit(main())
