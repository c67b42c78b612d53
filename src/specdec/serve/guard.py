"""ASGI middleware in front of every route: API keys, the body-size cap, the body deadline, response counting.

Why a raw ASGI middleware (not a FastAPI dependency): it must hold for every path,
the ones FastAPI answers itself (/openapi.json, /docs, 404s, 405s) included, and
it must refuse an oversized or late body before any of it is parsed.

Invariants:
- with API keys, every path but PUBLIC_PATHS (/health and the playground's
  static files) needs `Authorization: Bearer KEY` for one of them (compared in constant time, each key); ADMIN_PATHS (the
  server-wide /metrics) need an admin key instead wherever any key is set (a
  client key gets 403, so one client never reads the server's totals); the request's
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
- every response's status is counted once;
- every response carries `X-Request-Id`: the client's own (when it is a short
  token of safe characters) or a new one, and one log line names it with the
  method, path and status.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import re
import uuid
from collections.abc import Sequence

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from specdec.serve.metrics import ServerMetrics
from specdec.serve.playground import PAGE_PATHS
from specdec.serve.replies import APIError, error_response

log = logging.getLogger("specdec.server")
PUBLIC_PATHS = frozenset({"/health", *PAGE_PATHS})  # the playground's files hold no data; its calls need a key
ADMIN_PATHS = frozenset({"/metrics"})
REQUEST_ID = re.compile(rb"[A-Za-z0-9._:-]{1,128}")  # a client's X-Request-Id is echoed only if it matches
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
        admin_keys: Sequence[str] = (),
    ) -> None:
        self.app = app
        self.expected = [f"Bearer {key}".encode() for key in api_keys]
        self.admin = [f"Bearer {key}".encode() for key in admin_keys]
        self.max_body_bytes = max_body_bytes
        self.metrics = metrics
        self.body_timeout_s = body_timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        given = dict(scope["headers"]).get(b"x-request-id", b"")
        request_id = given.decode() if REQUEST_ID.fullmatch(given) else uuid.uuid4().hex

        async def counted_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                self.metrics.record_response(path, message["status"])
                message = {**message, "headers": [*message.get("headers", []), (b"x-request-id", request_id.encode())]}
                log.info("request %s: %s %s -> %d", request_id, scope["method"], path, message["status"])
            await send(message)

        refusal = self._refusal(scope)
        if refusal is not None:
            await error_response(refusal)(scope, receive, counted_send)
            return
        await self.app(scope, self._bounded(receive), counted_send)

    def _refusal(self, scope: Scope) -> APIError | None:
        headers = dict(scope["headers"])
        refused = self._unauthorized(scope, headers.get(b"authorization", b""))
        if refused is not None:
            return refused
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

    def _unauthorized(self, scope: Scope, given: bytes) -> APIError | None:
        """The refusal of a request whose key does not open its path (None: it does); notes its tenant."""
        path = scope["path"]
        if path in PUBLIC_PATHS or not (self.expected or self.admin):
            return None
        # Every key is compared (no early exit), so the time taken does not tell which one matched.
        matches = [hmac.compare_digest(given, expected) for expected in self.expected]
        if path in ADMIN_PATHS:
            if any([hmac.compare_digest(given, admin) for admin in self.admin]):
                return None
            if any(matches):
                return APIError(403, f"{path} needs the admin key", code="admin_key_required")
        elif any(matches) or not self.expected:
            if any(matches):
                scope.setdefault("state", {})[TENANT] = f"key{matches.index(True)}"
            return None
        why = "missing" if not given else "incorrect"
        return APIError(401, f"{why} API key: send 'Authorization: Bearer <key>'", code="invalid_api_key")

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
