"""`mallard docs`: the dbt docs site of the project, generated from the lake read-only and served
on loopback with nothing fetched from elsewhere."""

from __future__ import annotations

import sys
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from mallard.distributed import storage
from mallard.paths import DataPaths
from mallard.warehouse import ensure_extensions
from orchestration.context import dbt_project_args
from orchestration.environment import dbt_env

# What the site is made of: dbt's single-page app and the two documents it fetches beside it.
SITE = ("index.html", "manifest.json", "catalog.json")
# profiles.yml attaches the lake READ_ONLY when this is set: the catalog queries read committed
# snapshots while a pass writes, and nothing `mallard docs` does can change the lake.
READ_ONLY = {"MALLARD_LAKE_READ_ONLY": "1"}


def generate(paths: DataPaths) -> Path:
    """manifest.json (`dbt parse`) and catalog.json (`dbt docs generate --no-compile`: column
    types read from the lake, no model compiled, so no introspective query runs) into
    `paths.dbt_docs`; raises on a dbt failure. dbt's telemetry is off (DO_NOT_TRACK in
    dbt_env), which also leaves the manifest's `send_anonymous_usage_stats` false: the page
    then loads no tracker from a CDN."""
    from orchestration.dbt_in_process import run_dbt

    ensure_extensions(paths)  # the profile loads ducklake and sqlite from the data dir
    target = paths.dbt_docs
    target.mkdir(parents=True, exist_ok=True)
    for args in (["parse"], ["docs", "generate", "--no-compile"]):
        run_dbt([*args, *dbt_project_args(target, paths)], {**dbt_env(paths), **READ_ONLY})
    return target


class SiteHandler(SimpleHTTPRequestHandler):
    """The site's three files and nothing else of the target dir (dbt's parse state, logs)."""

    def send_head(self) -> Any:
        name = self.path.split("?", 1)[0].split("#", 1)[0].lstrip("/") or "index.html"
        if name not in SITE:
            self.send_error(404)
            return None
        self.path = "/" + name
        return super().send_head()

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base's name
        pass


def serve(site: Path, host: str, port: int) -> None:
    """Serve the site until interrupted; prints its URL first (port 0: a free port)."""
    httpd = ThreadingHTTPServer((host, port), partial(SiteHandler, directory=str(site)))
    print(f"dbt docs: http://{host}:{httpd.server_address[1]}/", flush=True)
    try:
        httpd.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        httpd.server_close()


def run(paths: DataPaths, host: str, port: int, serve_site: bool = True) -> int:
    if not paths.lake_catalog.exists() and not storage().catalog:
        print(f"{paths.root} has no warehouse: run `mallard init` first", file=sys.stderr)
        return 2
    try:
        site = generate(paths)
    except RuntimeError as e:
        print(f"mallard docs: {e}", file=sys.stderr)
        return 1
    if not serve_site:
        print(f"dbt docs: {site / 'index.html'}", flush=True)
        return 0
    serve(site, host, port)
    return 0
