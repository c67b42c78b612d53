"""What `specdec serve` sends back: OpenAI-shaped replies, chunks and errors.

Why apart from app.py: the wire format is the contract with every OpenAI
client, and it is easiest to check (and keep stable) as plain functions from
engine results to JSON-ready dicts, free of HTTP plumbing.

Invariants:
- a reply carries exactly one choice (index 0), `usage` counts the prompt and
  the generated tokens as the engine counted them, `finish_reason` is the
  engine's ("stop": EOS or a stop string; "length": max_tokens or the context);
- streaming: chat streams start with a role-only delta; the chunk with
  `finish_reason` (or, with include_usage, the usage chunk after it) is the last
  one before `data: [DONE]` and carries the request's `specdec` field;
- a streamed text chunk of a request that set `specdec.sources` carries
  `"specdec": {"source", "step", "token"}` (its token's draft source or
  "target", the forward pass that emitted it, 0 being the prefill's, and the
  token's index: `specdec.engine.provenance`); without it a chunk is exactly
  OpenAI's, and OpenAI clients ignore the extra field either way;
- the `specdec` field names the method and its request options; the decoding
  statistics (acceptance, timings, queue time) are added only when the server
  exposes them (`--expose-stats`): they depend on what earlier requests left in
  the server's shared state and on the load, so they could tell one client about
  another's;
- error bodies are {"error": {"message", "type", "param", "code"}} and never
  hold a traceback or another request's data; every 429 and 503 carries
  `Retry-After`.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from specdec.engine.provenance import Piece
from specdec.serve.scheduler import CancelledEvent, DoneEvent, ErrorEvent

log = logging.getLogger("specdec.server")
MAX_VALIDATION_ERRORS = 3
MAX_MESSAGE_CHARS = 500
RETRY_STATUSES = frozenset({429, 503})
UNION_TAGS = frozenset({"str", "int", "float", "bool", "list", "dict", "none"})
DEFAULT_RETRY_AFTER_S = 1  # seconds, where the refusal has no better estimate


class APIError(Exception):
    """An error reply: HTTP status plus OpenAI's error fields; a 429 or 503 always says when to retry."""

    def __init__(
        self,
        status: int,
        message: str,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        retry_after_s: int | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message[:MAX_MESSAGE_CHARS]
        self.type = type
        self.param = param
        self.code = code
        if retry_after_s is None and status in RETRY_STATUSES:
            retry_after_s = DEFAULT_RETRY_AFTER_S
        self.retry_after_s = retry_after_s

    @property
    def headers(self) -> dict[str, str]:
        return {} if self.retry_after_s is None else {"Retry-After": str(max(1, self.retry_after_s))}


def error_body(error: APIError) -> dict:
    return {"error": {"message": error.message, "type": error.type, "param": error.param, "code": error.code}}


def error_response(error: APIError) -> JSONResponse:
    """The JSON reply of an error, with its headers (Retry-After on a 429 or 503)."""
    return JSONResponse(error_body(error), status_code=error.status, headers=error.headers)


def event_error(event: ErrorEvent | CancelledEvent) -> APIError:
    """The client-facing error for a job that did not complete."""
    if isinstance(event, CancelledEvent):
        return APIError(
            503,
            "the request was cancelled: the server is shutting down",
            type="server_error",
            code="shutting_down",
        )
    if isinstance(event.error, ValueError):
        return APIError(400, str(event.error))
    return APIError(500, "internal server error", type="server_error", code="internal_error")


def validation_message(errors: Sequence[Any]) -> tuple[str, str | None, str]:
    """(message, param, code) for pydantic/FastAPI validation errors; no input values are echoed."""
    parts, params = [], []
    for error in list(errors)[:MAX_VALIDATION_ERRORS]:
        loc = [str(x) for x in error.get("loc", ()) if x != "body" and not _union_tag(x)]
        if error.get("type") == "json_invalid":
            detail = (error.get("ctx") or {}).get("error", "")
            return f"the request body is not valid JSON: {detail}".strip(), None, "invalid_json"
        param = ".".join(loc) or None
        params.append(param)
        parts.append(f"{param}: {error.get('msg')}" if param else str(error.get("msg")))
    more = len(errors) - MAX_VALIDATION_ERRORS
    message = "; ".join(parts) + (f" (and {more} more)" if more > 0 else "")
    return message or "invalid request", params[0] if params else None, "invalid_value"


def _union_tag(part: Any) -> bool:
    """Whether a validation error's location part names a member of a union (`str`, `function-after[...]`),
    not a field: left out of `param`, which names the field as the client sent it."""
    if isinstance(part, int):
        return False
    return part in UNION_TAGS or not str(part).isidentifier()


def sse(payload: dict) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"


def _jsonable(value: Any) -> Any:
    if isinstance(value, bool | int | float | str) or value is None:
        return value
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    return repr(value)


class Reply:
    """Builds the chat or completion reply (full, or as chunks) of one request."""

    def __init__(
        self,
        chat: bool,
        model: str,
        method_name: str,
        options: dict[str, Any],
        num_prompt_tokens: int,
        expose_stats: bool = False,
    ):
        """`options`: the method's options as a client may see them (server-side ones, paths, left out);
        expose_stats: add the decoding statistics to the `specdec` field."""
        self.chat = chat
        self.expose_stats = expose_stats
        self.model = model
        self.method_name = method_name
        self.options = _jsonable(options)
        self.num_prompt_tokens = num_prompt_tokens
        self.id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        self.created = int(time.time())

    def _envelope(self, choices: list[dict], chunk: bool) -> dict:
        kind = ("chat.completion.chunk" if chunk else "chat.completion") if self.chat else "text_completion"
        return {
            "id": self.id,
            "object": kind,
            "created": self.created,
            "model": self.model,
            "system_fingerprint": None,
            "choices": choices,
        }

    def _choice(self, text: str, finish: str | None, chunk: bool, first: bool = False) -> dict:
        choice: dict[str, Any] = {"index": 0}
        if not self.chat:
            choice["text"] = text
        elif not chunk:
            choice["message"] = {"role": "assistant", "content": text}
        elif first:
            choice["delta"] = {"role": "assistant", "content": text}
        else:
            choice["delta"] = {"content": text} if text else {}
        return {**choice, "logprobs": None, "finish_reason": finish}

    def chunk(self, text: str, first: bool = False, piece: Piece | None = None) -> dict:
        body = self._envelope([self._choice(text, None, chunk=True, first=first)], chunk=True)
        if piece is None:
            return body
        return {**body, "specdec": {"source": piece.source, "step": piece.step, "token": piece.token}}

    def usage(self, done: DoneEvent) -> dict:
        completion = len(done.output.token_ids)
        return {
            "prompt_tokens": self.num_prompt_tokens,
            "completion_tokens": completion,
            "total_tokens": self.num_prompt_tokens + completion,
        }

    def stats(self, done: DoneEvent) -> dict:
        if not self.expose_stats:
            return {"method": self.method_name, "options": self.options}
        stats = done.output.stats.to_dict()
        stats["accepted_histogram"] = {str(k): v for k, v in stats["accepted_histogram"].items()}
        return {
            "method": self.method_name,
            "options": self.options,
            **stats,
            "queue_time_s": done.queue_time_s,
        }

    def full(self, done: DoneEvent) -> dict:
        output = done.output
        body = self._envelope([self._choice(output.text, output.finish_reason, chunk=False)], chunk=False)
        return {**body, "usage": self.usage(done), "specdec": self.stats(done)}

    def final_chunks(self, done: DoneEvent, include_usage: bool) -> list[dict]:
        """The finish_reason chunk, then (include_usage) the usage chunk; the last one carries the stats."""
        finish = self._envelope([self._choice("", done.output.finish_reason, chunk=True)], chunk=True)
        if not include_usage:
            return [{**finish, "specdec": self.stats(done)}]
        usage = {**self._envelope([], chunk=True), "usage": self.usage(done), "specdec": self.stats(done)}
        return [finish, usage]


def install_error_handlers(app: FastAPI) -> None:
    """OpenAI-shaped JSON for every error FastAPI or a handler raises (422 becomes 400)."""

    reply = error_response

    async def api_error(request: Request, error: APIError) -> JSONResponse:
        return reply(error)

    async def invalid(request: Request, error: RequestValidationError) -> JSONResponse:
        message, param, code = validation_message(error.errors())
        return reply(APIError(400, message, param=param, code=code))

    async def http_error(request: Request, error: HTTPException) -> JSONResponse:
        kind = "invalid_request_error" if error.status_code < 500 else "server_error"
        code = {408: "request_timeout", 413: "request_too_large"}.get(error.status_code)
        response = reply(APIError(error.status_code, str(error.detail), type=kind, code=code))
        response.headers.update(error.headers or {})  # e.g. Connection: close after a late body
        return response

    async def internal(request: Request, error: Exception) -> JSONResponse:
        log.error("internal error on %s", request.url.path, exc_info=error)
        return reply(APIError(500, "internal server error", type="server_error", code="internal_error"))

    app.add_exception_handler(APIError, api_error)
    app.add_exception_handler(RequestValidationError, invalid)
    app.add_exception_handler(HTTPException, http_error)
    app.add_exception_handler(Exception, internal)
