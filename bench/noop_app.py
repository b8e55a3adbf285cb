"""The baseline for ingestion: a Litestar JSON endpoint that parses the body and answers like
the collector, but stores nothing. Served by uvicorn with the same settings as `mallard serve`,
and with --workers N as `mallard serve --workers N` serves: N processes on the port
(SO_REUSEPORT, mallard/workers.py).

    python -m bench.noop_app --port 8765 [--workers N]
"""

from __future__ import annotations

import argparse
import sys

import msgspec
import uvicorn
from litestar import Litestar, Request, get, post

from mallard.workers import reuseport_socket, supervise

_decode = msgspec.json.Decoder()


@post("/noop", status_code=200)
async def noop(request: Request) -> dict[str, object]:
    _decode.decode(await request.body())
    return {"success": True, "eventId": "0"}


@get("/health")
async def health() -> dict[str, str]:
    return {"status": "ok"}


app = Litestar(route_handlers=[noop, health], debug=False)

if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--reuseport", action="store_true", help="one of --workers N")
    args = p.parse_args()
    options = {"host": "127.0.0.1", "port": args.port, "log_level": "warning", "access_log": False}
    if args.workers == 1 and not args.reuseport:
        uvicorn.run(app, **options)  # type: ignore[arg-type]
        sys.exit(0)
    if not args.reuseport:  # N processes on the port, supervised as `mallard serve`'s are
        one = [sys.executable, "-m", "bench.noop_app", "--port", str(args.port), "--reuseport"]
        sys.exit(supervise([one] * args.workers))
    uvicorn.Server(uvicorn.Config(app, **options)).run(  # type: ignore[arg-type]
        sockets=[reuseport_socket("127.0.0.1", args.port)]
    )
