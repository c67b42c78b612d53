"""uvicorn's h11 protocol with a deadline on request headers (408) and OpenAI's error shape for malformed HTTP.

Why: uvicorn bounds the idle time between requests (`timeout_keep_alive`, which
stops counting at the first byte) but not the time a client takes to send a
request's headers, so a client that trickles them (or sends half and waits)
holds its connection forever. The app never sees such a request, so the
deadline has to live in the protocol. This subclasses uvicorn's own
`H11Protocol` (no fork): a timer runs from the connection's start, and again
from the end of each response, until the next request's headers are complete.
The body's deadline is the app's (`specdec.serve.guard`).

A request h11 cannot parse (a garbage request line, no Host, a Content-Length
of -1, `abc` or two values, `Transfer-Encoding: gzip, chunked`) never reaches
the app either: uvicorn answered it `400 text/plain`; here it gets the JSON
error shape every other refusal has.

Invariants: a connection waiting for headers longer than `header_timeout_s` gets
one 408 in OpenAI's error shape with `Connection: close`, then is closed; a
request whose headers arrived in time is never touched by this timer; a
malformed request gets one JSON 400 (code `invalid_http`) and the connection is
closed.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from specdec.serve.replies import APIError, error_body

MALFORMED = (
    "the request is not valid HTTP/1.1 (its request line, Host header, Content-Length or Transfer-Encoding)"
)


def closing_response(error: APIError, reason: str) -> bytes:
    """A complete HTTP/1.1 response in OpenAI's error shape that closes the connection."""
    body = json.dumps(error_body(error)).encode()
    head = (
        f"HTTP/1.1 {error.status} {reason}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    )
    return head.encode() + body


def timeout_response(what: str, timeout_s: float) -> bytes:
    """A complete HTTP/1.1 408 response (OpenAI's error shape) that closes the connection."""
    error = APIError(408, f"the request {what} did not arrive within {timeout_s:g} s", code="request_timeout")
    return closing_response(error, "Request Timeout")


class HeaderDeadlineProtocol(H11Protocol):
    """`H11Protocol` that answers 408 and closes when a request's headers take longer than the deadline."""

    def __init__(self, *args: Any, header_timeout_s: float, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.header_timeout_s = header_timeout_s
        self._header_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.conn.their_state is not h11.IDLE:  # the headers of a request are complete
            self._disarm()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing() and self.conn.their_state is h11.IDLE:
            self._arm()  # the next request's headers are due within the deadline too

    def send_400_response(self, msg: str) -> None:
        """uvicorn's answer to what h11 cannot parse, in OpenAI's JSON error shape (then closed)."""
        self._disarm()
        self.transport.write(closing_response(APIError(400, MALFORMED, code="invalid_http"), "Bad Request"))
        self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self) -> None:
        self._disarm()
        self._header_timer = self.loop.call_later(self.header_timeout_s, self._expired)

    def _disarm(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _expired(self) -> None:
        self._header_timer = None
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            self.transport.write(timeout_response("headers", self.header_timeout_s))
            self.transport.close()
