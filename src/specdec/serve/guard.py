"""ASGI middleware in front of every route: API keys, the body-size cap, the body deadline, response counting.

Why a raw ASGI middleware (not a FastAPI dependency): it must hold for every path,
the ones FastAPI answers itself (/openapi.json, /docs, 404s, 405s) included, and
it must refuse an oversized or late body before any of it is parsed.

Invariants:
- with API keys, every path but PUBLIC_PATHS needs `Authorization: Bearer KEY`
  for one of them (compared in constant time, each key); the request's
  `state_scope` (`tenant`) names which key it was, by position, never by the key
  itself: what the server learns across requests is kept per key
  (`specdec.serve.pool`);
- a body whose declared or streamed size exceeds max_body_bytes gets 413;
- a POST whose Content-Type is not JSON gets 415 "expected application/json"
  (none at all is read as JSON, as FastAPI does), never a parser's guess;
- a body not received whole within body_timeout_s of the request's headers gets
  408 with `Connection: close` (a client that declares more than it sends, or
  trickles it, cannot hold a connection and its handler); the time to the
  headers themselves is bounded below the app (`specdec.serve.http`);
- every response's status is counted once.
"""

from __future__ import annotations

import asyncio
import hmac
from collections.abc import Sequence

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from specdec.serve.metrics import ServerMetrics
from specdec.serve.replies import APIError, error_response

PUBLIC_PATHS = frozenset({"/health"})
TENANT = "specdec_state_scope"  # key in the ASGI scope's "state": which API key a request came with


def tenant(scope: Scope) -> str:
    """The state scope of a request (set by `Guard`): "key<i>" for the i-th API key, "" without keys."""
    return str(scope.get("state", {}).get(TENANT, ""))


class Guard:
    """API keys, the body-size cap, the body deadline and response counting, before any route runs."""

    def __init__(
        self,
        app: ASGIApp,
        api_keys: Sequence[str],
        max_body_bytes: int,
        metrics: ServerMetrics,
        body_timeout_s: float,
    ) -> None:
        self.app = app
        self.expected = [f"Bearer {key}".encode() for key in api_keys]
        self.max_body_bytes = max_body_bytes
        self.metrics = metrics
        self.body_timeout_s = body_timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope["path"]

        async def counted_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                self.metrics.record_response(path, message["status"])
            await send(message)

        refusal = self._refusal(scope)
        if refusal is not None:
            await error_response(refusal)(scope, receive, counted_send)
            return
        await self.app(scope, self._bounded(receive), counted_send)

    def _refusal(self, scope: Scope) -> APIError | None:
        headers = dict(scope["headers"])
        if self.expected and scope["path"] not in PUBLIC_PATHS:
            given = headers.get(b"authorization", b"")
            # Every key is compared (no early exit), so the time taken does not tell which one matched.
            matches = [hmac.compare_digest(given, expected) for expected in self.expected]
            if not any(matches):
                why = "missing" if not given else "incorrect"
                return APIError(
                    401, f"{why} API key: send 'Authorization: Bearer <key>'", code="invalid_api_key"
                )
            scope.setdefault("state", {})[TENANT] = f"key{matches.index(True)}"
        length = headers.get(b"content-length", b"0")
        if not length.isdigit() or int(length) > self.max_body_bytes:
            return APIError(
                413, f"the request body exceeds {self.max_body_bytes} bytes", code="request_too_large"
            )
        media = headers.get(b"content-type", b"application/json").split(b";")[0].strip().lower()
        if scope["method"] == "POST" and media != b"application/json" and not media.endswith(b"+json"):
            shown = media.decode("latin-1")[:100] or "empty"
            return APIError(
                415, f"expected application/json, got Content-Type {shown!r}", code="unsupported_media_type"
            )
        return None

    def _bounded(self, receive: Receive) -> Receive:
        """`receive` with the size cap, and the deadline on the body (none once it has all come)."""
        seen = 0
        deadline = asyncio.get_running_loop().time() + self.body_timeout_s
        whole = False

        async def bounded() -> Message:
            nonlocal seen, whole
            if whole:
                return await receive()
            try:
                left = deadline - asyncio.get_running_loop().time()
                message = await asyncio.wait_for(receive(), max(left, 0.0))
            except asyncio.TimeoutError:
                raise HTTPException(
                    408,
                    f"the request body did not arrive within {self.body_timeout_s:g} s",
                    headers={"Connection": "close"},
                ) from None
            seen += len(message.get("body", b""))
            whole = message["type"] != "http.request" or not message.get("more_body", False)
            if seen > self.max_body_bytes:
                raise HTTPException(413, f"the request body exceeds {self.max_body_bytes} bytes")
            return message

        return bounded
