"""Every read answer says how fresh its data is, errors from the framework included.

Handlers that read the warehouse set the freshness headers of the snapshot they read; any other
answer on a read path (auth and parameter errors, framework 404/405, 500) gets those of the
latest snapshot this process has seen. A before-send hook, not a middleware: Litestar runs
route middleware only for matched routes, and hooks see every response.
"""

from __future__ import annotations

import anyio.to_thread
from litestar.types import Message, Scope

from api.service import FRESHNESS_HEADERS, Snapshot, Warehouse, freshness_headers
from mallard.errors import family_of

_MARK = FRESHNESS_HEADERS[-1].encode()


async def add_freshness(message: Message, scope: Scope) -> None:
    if message["type"] != "http.response.start" or not scope["path"].startswith("/track/"):
        return
    if family_of(scope["path"], str(scope.get("method", "GET"))) != "read":
        return
    headers = list(message.get("headers", []))
    if any(k.lower() == _MARK for k, _ in headers):
        return
    snap = await _latest(scope)
    headers += [(k.encode(), v.encode()) for k, v in freshness_headers(snap).items()]
    message["headers"] = headers


async def _latest(scope: Scope) -> Snapshot:
    wh: Warehouse | None = getattr(scope["litestar_app"].state, "warehouse", None)
    if wh is None:
        return Snapshot(0, None, None)
    if wh.latest is not None:
        return wh.latest
    try:
        return await anyio.to_thread.run_sync(wh.snapshot)
    except Exception:  # the answer is already an error; it still gets the headers
        return Snapshot(0, None, None)
