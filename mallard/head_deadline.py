"""A deadline and a size limit for a request's head (request line and headers), below the app.

uvicorn's httptools protocol arms no timer before a connection's first response, and any byte
cancels its keep-alive timer: a connection that sends nothing, or its head a byte at a time,
was held for as long as the client liked (tests/reliability/test_slow_heads.py: open after
15 s and after any length of time). httptools puts no bound on the head's size either: one
connection streaming header lines took the server from 191 to 498 MiB with 300 MB. The app
never sees a head that is not complete, so the bound has to be in the protocol.

`head_guard(seconds, max_bytes)` is uvicorn's httptools protocol with both bounds: a head must
be complete `seconds` after the connection opened or after its previous response ended (else
408 in JSON and the connection closed; a connection that sent nothing is just closed, as
uvicorn closes an idle keep-alive connection), and at most about `max_bytes` long (else 431 and
closed). Requests whose head is complete are untouched: the body has its own deadline
(mallard/body_deadline.py).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from mallard.errors import MallardError, error_body


class HeadTimeout(MallardError):
    status = 408
    code = "invalid_request_error"


class HeadTooLarge(MallardError):
    status = 431
    code = "invalid_request_error"


REASONS = {408: b"Request Timeout", 431: b"Request Header Fields Too Large"}


class HeadGuard(HttpToolsProtocol):
    head_timeout_s = 20.0
    max_head_bytes = 64 * 1024

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._head_timer: asyncio.TimerHandle | None = None
        self._awaiting_head = True
        self._head_began = False  # in the chunk being fed: the bytes before it were a body's
        self._head_bytes = 0
        self._head_started = False  # a byte of the awaited head was parsed
        self._arm_head_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_head_timer()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        awaiting, self._head_began = self._awaiting_head, False
        super().data_received(data)
        # Counted after parsing, and only a chunk that was head from its first byte to its last:
        # a chunk that completes a head may carry a 1 MB body after it, and one in which the
        # next head began carried the end of a body first. A head can so be one chunk longer
        # than the limit, never without bound.
        if awaiting and self._awaiting_head and not self._head_began:
            self._head_bytes += len(data)
            if self._head_bytes > self.max_head_bytes and not self.transport.is_closing():
                limit = f"{self.max_head_bytes // 1024} KiB"
                self._refuse(HeadTooLarge(f"the request line and headers exceed {limit}"))

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._head_started = True

    def on_headers_complete(self) -> None:
        self._awaiting_head = False
        self._cancel_head_timer()
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._awaiting_head, self._head_began, self._head_bytes = True, True, 0
        self._head_started = False

    def on_response_complete(self) -> None:
        super().on_response_complete()
        # The next head's clock starts once the response is out (a pipelined head that is
        # already complete has been started by now, and is not waited for).
        if self._awaiting_head and not self.transport.is_closing():
            self._arm_head_timer()

    def _arm_head_timer(self) -> None:
        self._cancel_head_timer()
        self._head_timer = self.loop.call_later(self.head_timeout_s, self._head_timed_out)

    def _cancel_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if not self._awaiting_head or self.transport.is_closing():
            return
        if not self._head_started:
            self.transport.close()  # nothing was sent: closed like an idle keep-alive
            return
        seconds = self.head_timeout_s
        self._refuse(HeadTimeout(f"the request head did not arrive within {seconds:g} s"))

    def _refuse(self, exc: MallardError) -> None:
        if self.cycle is not None and not self.cycle.response_complete:
            # A response is being written: an answer now would land inside it.
            self.transport.close()
            return
        status, body = error_body(exc, "read")
        content = json.dumps(body).encode()
        head = [
            b"HTTP/1.1 %d %s\r\n" % (status, REASONS[status]),
            *(name + b": " + value + b"\r\n" for name, value in self.server_state.default_headers),
            b"content-type: application/json\r\n",
            b"content-length: %d\r\n" % len(content),
            b"connection: close\r\n\r\n",
        ]
        self.transport.write(b"".join(head) + content)
        self.transport.close()


def head_guard(seconds: float, max_bytes: int) -> type[HeadGuard]:
    """The protocol class for uvicorn's `http=`, with these bounds."""
    attrs: dict[str, Any] = {"head_timeout_s": seconds, "max_head_bytes": max_bytes}
    return type("HeadGuard", (HeadGuard,), attrs)
