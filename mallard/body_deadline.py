"""A deadline for reading a request's body: a body still arriving after it gets 408.

uvicorn times out only an idle connection, not a request whose body trickles in (a slowloris
client sending a byte a second holds its connection, and what the handler buffered, for as long
as it likes). This wraps the ASGI `receive` of every HTTP request: until the body is complete,
each wait for more of it is bounded by what is left of the deadline, counted from the request's
arrival; past it the handler's read raises RequestTimeout, answered 408 in the JSON of the
route's family, and the connection closes. Once the body is in, `receive` is left alone (a
streamed download listens on it for the client's disconnect for as long as it takes).
"""

from __future__ import annotations

import asyncio
import time

from litestar.types import ASGIApp, Message, Receive, Scope, Send

from mallard.errors import MallardError


class RequestTimeout(MallardError):
    status = 408
    code = "invalid_request_error"

    def __init__(self, seconds: float) -> None:
        super().__init__(
            f"the request body did not arrive within {seconds:g} s",
            headers={"connection": "close"},
        )


class BodyDeadline:
    def __init__(self, app: ASGIApp, seconds: float) -> None:
        self.app = app
        self.seconds = seconds

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or self.seconds <= 0:
            await self.app(scope, receive, send)
            return
        deadline = time.monotonic() + self.seconds
        complete = False

        async def bounded() -> Message:
            nonlocal complete
            if complete:
                return await receive()
            left = deadline - time.monotonic()
            try:
                async with asyncio.timeout(max(left, 0)):
                    message = await receive()
            except TimeoutError:
                raise RequestTimeout(self.seconds) from None
            if message["type"] != "http.request" or not message.get("more_body", False):
                complete = True
            return message

        await self.app(scope, bounded, send)  # type: ignore[arg-type]
