"""ASGI middleware in front of every route: the API key, the body-size cap and response counting.

Why a raw ASGI middleware (not a FastAPI dependency): it must hold for every path,
the ones FastAPI answers itself (/openapi.json, /docs, 404s, 405s) included, and
it must refuse an oversized body before any of it is parsed.

Invariants: with an API key, every path but PUBLIC_PATHS needs `Authorization:
Bearer KEY` (compared in constant time); a body whose declared or streamed size
exceeds max_body_bytes gets 413; every response's status is counted once.
"""

from __future__ import annotations

import hmac

from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from specdec.serve.metrics import ServerMetrics
from specdec.serve.replies import APIError, error_body

PUBLIC_PATHS = frozenset({"/health"})


class Guard:
    """The API key, the body-size cap and response counting, before any route runs."""

    def __init__(
        self, app: ASGIApp, api_key: str | None, max_body_bytes: int, metrics: ServerMetrics
    ) -> None:
        self.app = app
        self.expected = f"Bearer {api_key}".encode() if api_key else None
        self.max_body_bytes = max_body_bytes
        self.metrics = metrics

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
            await JSONResponse(error_body(refusal), refusal.status)(scope, receive, counted_send)
            return
        await self.app(scope, self._capped(receive), counted_send)

    def _refusal(self, scope: Scope) -> APIError | None:
        headers = dict(scope["headers"])
        if self.expected and scope["path"] not in PUBLIC_PATHS:
            given = headers.get(b"authorization", b"")
            if not hmac.compare_digest(given, self.expected):
                why = "missing" if not given else "incorrect"
                return APIError(
                    401, f"{why} API key: send 'Authorization: Bearer <key>'", code="invalid_api_key"
                )
        length = headers.get(b"content-length", b"0")
        if not length.isdigit() or int(length) > self.max_body_bytes:
            return APIError(
                413, f"the request body exceeds {self.max_body_bytes} bytes", code="request_too_large"
            )
        return None

    def _capped(self, receive: Receive) -> Receive:
        seen = 0

        async def capped() -> Message:
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.max_body_bytes:
                raise HTTPException(413, f"the request body exceeds {self.max_body_bytes} bytes")
            return message

        return capped
