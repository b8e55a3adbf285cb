"""The baseline for ingestion: a Litestar JSON endpoint that parses the body and answers like
the collector, but stores nothing. Served by uvicorn with the same settings as `mallard serve`.

    python -m bench.noop_app --port 8765
"""

from __future__ import annotations

import argparse

import msgspec
import uvicorn
from litestar import Litestar, Request, get, post

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
    args = p.parse_args()
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning", access_log=False)
