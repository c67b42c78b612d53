"""`specdec serve`: an OpenAI-compatible HTTP server (FastAPI + uvicorn) over one loaded model.

Endpoints: POST /v1/chat/completions and /v1/completions (JSON or `stream: true`
server-sent events in OpenAI's chunk format, ending with `data: [DONE]`),
GET /v1/models, /v1/specdec/methods (the methods and the options a request may set),
/health (also HEAD) and /metrics (Prometheus text; behind the admin key
wherever keys are set), and the browser playground at / (`specdec.serve.playground`;
off with --no-ui). The speculative method
is chosen per request with the extra field `"specdec": {"method", "options"}`
and every reply names it under `"specdec"`, with the request's decoding stats
when the server runs with --expose-stats; with `"sources": true` a stream's text
chunks also say where each token came from (`specdec.serve.replies`).

Methods and their options: `--method SPEC` is the default for requests without
`specdec.method`; `--method-config METHOD:opt=value,...` (repeatable) sets a
method's server-side options, e.g. `draft:draft_model=qwen2.5-coder-0.5b` or
`logitspec:costs_dir=/srv/costs`. A request may set only the options listed in
specdec.serve.options.REQUEST_OPTIONS, within bounds; paths and anything that
converts, measures or calibrates are server-side. Startup prepares every method
named by --method/--method-config (loads draft models, measures cost curves,
calibrates) and builds the default method's proposer; proposers are then kept
per distinct config (specdec.serve.pool) and reused across requests.

Why it is built this way: one model with one KV cache serves everybody, so
requests are validated and tokenized on arrival, then wait in a bounded queue,
FIFO per API key and round-robin across keys (specdec.serve.scheduler.Scheduler,
specdec.serve.fair), for the decode worker thread, which runs up to --max-batch
of them together (continuous batching, specdec.engine.batch.Batch); the event
loop never runs the model, so /health, /metrics and streaming stay responsive.

Invariants:
- verification is exact (batch-invariant) unless told `--exact off` or the model's path
  cannot (`specdec.serve.exactness`, decided before anything runs the model and said at start),
  so a greedy or seeded request's text does not depend on what else is running;
- every error is JSON in OpenAI's shape {"error": {"message", "type", "param",
  "code"}} with a 4xx status for the client's mistakes (FastAPI's 422 becomes
  400) and 500 without a traceback for ours; nothing a request sends can stop
  the worker or the process;
- a request is refused before it is queued when its prompt plus max_tokens
  does not fit the context (400, code context_length_exceeded), its method or options are not valid or not a request's to set, its
  method needs server-side setup this server lacks (all 400, naming the option
  or method), or the queue is full (429); no request loads, converts, measures,
  calibrates or touches a path;
- a client that goes away cancels its generation (streaming: at the next text
  piece; non-streaming: within DISCONNECT_POLL_S);
- with API keys, every path but /health needs `Authorization: Bearer KEY` for one
  of them (/metrics an admin key: `specdec.serve.guard`), and the state proposers learn across requests (session store,
  recycle table) is kept per key: a request's proposer is built on the model
  scoped by its key (`specdec.serve.pool`), so no client drafts from another
  key's text; bodies larger than max_body_bytes are refused (413);
- a client gets request_timeout_s for its headers and again for its body, else
  408 and the connection closed (`specdec.serve.http`, `specdec.serve.guard`);
- a long prompt joining running requests is prefilled prefill_chunk tokens per
  decode step (`specdec.engine.batch.Batch`; the chunk sized from the cost curve
  unless given, `specdec.serve.prefill`), so it delays the running streams by
  about one chunk's pass per token, and a client that leaves stops it between chunks;
- on shutdown (SIGINT/SIGTERM) new requests get 503 and the accepted ones may
  finish for up to shutdown_timeout_s; then each one left ends in OpenAI's shape
  (a JSON 503 `shutting_down`, or a stream's error event and `[DONE]`) before
  uvicorn's own deadline (`specdec.serve.shutdown`); a SIGTERM shutdown that went
  through ends the process with status 0.
"""

import asyncio
import copy
import functools
import logging
import signal
import sys
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from typing import Any

import jinja2.exceptions
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from specdec.backends.registry import path_line
from specdec.engine.costs import load_or_measure
from specdec.engine.floor_store import remembered_floor
from specdec.engine.generation import GenerationConfig
from specdec.engine.loop import Engine
from specdec.models import LoadedModel
from specdec.prompts import encode_prompt
from specdec.sampling import SamplingParams
from specdec.serve.config import ServerConfig
from specdec.serve.exactness import settle_exact
from specdec.serve.guard import PUBLIC_PATHS, Guard, tenant
from specdec.serve.http import HeaderDeadlineProtocol
from specdec.serve.metrics import ServerMetrics
from specdec.serve.model_thread import off_main_thread
from specdec.serve.options import RequestRefused, Resolved
from specdec.serve.playground import add_methods_route, add_playground
from specdec.serve.pool import ProposerPool
from specdec.serve.prefill import sized_prefill_chunk
from specdec.serve.replies import APIError, Reply, error_body, event_error, install_error_handlers, sse
from specdec.serve.scheduler import (
    CancelledEvent,
    DoneEvent,
    ErrorEvent,
    Job,
    QueueClosed,
    QueueFull,
    Scheduler,
)
from specdec.serve.schema import (
    ERROR_RESPONSES,
    SSE_CONTENT,
    ChatCompletion,
    Completion,
    Health,
    ModelCard,
    ModelList,
    SchemaLimits,
    document_bearer_auth,
    request_models,
)
from specdec.serve.shutdown import Drain, DrainingServer, exit_cleanly, uvicorn_timeout_s

log = logging.getLogger("specdec.server")
DISCONNECT_POLL_S = 0.5
COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions
# Below this, logits / temperature can overflow to inf (NaN probabilities); such a temperature
# means "greedy" anyway, so it is served as 0 (the convention of other OpenAI-compatible servers).
MIN_TEMPERATURE = 1e-5


class Service:
    """The served model, its queue and its metrics; the route handlers live here."""

    def __init__(self, config: ServerConfig, loaded: LoadedModel) -> None:
        self.config = config
        # decided before anything measures or runs the model: cost curves time the pass that will run
        loaded, self.exact_note = settle_exact(loaded, config.model.exact)
        self.loaded = loaded
        self.engine = Engine(loaded, floor=remembered_floor(loaded))
        self.metrics = ServerMetrics()
        self.methods = config.method_settings()
        self.pool = ProposerPool(loaded, config.pool_capacity)
        # Startup does every expensive thing requests may later need (load draft models, measure
        # cost curves, calibrate) for the methods the server was told about, and builds the default
        # method's proposer; requests only ever assemble proposers from these parts.
        for name in self.methods.configured:
            self.pool.prepare(self.methods.server_config(name))
        self.pool.get(self.methods.server_config(self.methods.default))
        # The batch plans each pass's width with this machine's measured pass costs (cached per machine).
        costs = load_or_measure(loaded) if config.max_batch > 1 else None
        self.prefill_chunk = config.prefill_chunk or sized_prefill_chunk(costs)
        self.scheduler = Scheduler(
            self.engine, config.max_queue, self.metrics, self.pool, config.max_batch, costs, self.prefill_chunk,
            max_queue_per_key=config.queue_share, max_rows_per_key=config.max_rows_per_key,
        )
        # Requests are tokenized on their own thread with their own tokenizer copy, so the event loop
        # never waits on a chat template and never shares a tokenizer with the decode worker.
        self.tokenizer = copy.deepcopy(loaded.tokenizer)
        self.encoder = ThreadPoolExecutor(max_workers=1, thread_name_prefix="specdec-tokenize")
        self.context = self.engine.target.max_length
        self.vocab_size = int(self.engine.target.config.vocab_size)

    @property
    def model_name(self) -> str:
        return self.loaded.name

    def check_model(self, model: str | None) -> None:
        if model is not None and model != self.model_name:
            raise APIError(
                404,
                f"model {model!r} is not served here; use {self.model_name!r}",
                param="model",
                code="model_not_found",
            )

    async def prompt_ids(self, body: Any, chat: bool) -> list[int]:
        try:
            ids = await asyncio.get_running_loop().run_in_executor(self.encoder, self._encode, body, chat)
        except (ValueError, TypeError, jinja2.exceptions.TemplateError) as error:
            raise APIError(400, f"invalid prompt: {error}", param="messages" if chat else "prompt") from None
        if self.context and len(ids) >= self.context:
            raise APIError(
                400,
                f"the prompt has {len(ids)} tokens; the model's context is {self.context}",
                param="messages" if chat else "prompt",
                code="context_length_exceeded",
            )
        return ids

    def _encode(self, body: Any, chat: bool) -> list[int]:
        if chat:
            messages = [_message_dict(m) for m in body.messages]
            return encode_prompt(self.tokenizer, messages, chat=True)
        prompt = body.prompt
        if isinstance(prompt, list) and isinstance(prompt[0], int):
            return [int(t) for t in prompt]
        return encode_prompt(self.tokenizer, prompt if isinstance(prompt, str) else prompt[0])

    def resolve(self, request: Any) -> Resolved:
        """The method config of a request's `specdec` field: allowed options only, parts prepared."""
        try:
            method, options = (request.method, request.options) if request is not None else (None, None)
            resolved = self.methods.resolve(method, options)
            self.pool.check(resolved.config)
        except RequestRefused as error:
            raise APIError(400, str(error), param=error.param, code=error.code) from None
        return resolved

    def settings(self, body: Any, chat: bool, num_prompt_tokens: int) -> GenerationConfig:
        limit = self.config.max_tokens_limit
        max_tokens = getattr(body, "max_completion_tokens", None) or body.max_tokens
        room = self.context - num_prompt_tokens if self.context else limit
        if max_tokens is None:  # the default fits what is left of the context
            max_tokens = min(limit, room) if chat else min(limit, COMPLETIONS_DEFAULT_MAX_TOKENS, room)
        elif max_tokens > room:
            raise APIError(
                400,
                f"This model's maximum context length is {self.context} tokens. However, you requested "
                f"{num_prompt_tokens + max_tokens} tokens ({num_prompt_tokens} in the prompt, {max_tokens} "
                "for the completion). Please reduce the length of the prompt or the completion.",
                param="max_tokens",
                code="context_length_exceeded",
            )
        stop = (body.stop,) if isinstance(body.stop, str) else tuple(body.stop or ())
        try:
            temperature = body.temperature if body.temperature >= MIN_TEMPERATURE else 0.0
            sampling = SamplingParams(temperature, body.top_k, body.top_p, body.seed)
            return GenerationConfig(max_new_tokens=max_tokens, sampling=sampling, stop=stop)
        except ValueError as error:
            raise APIError(400, str(error)) from None

    def submit(self, job: Job) -> None:
        try:
            self.scheduler.submit(job)
        except QueueFull as error:
            raise APIError(429, str(error), type="rate_limit_error", code="queue_full") from None
        except QueueClosed as error:
            raise APIError(503, str(error), type="server_error", code="shutting_down") from None

    async def generate(self, request: Request, body: Any, chat: bool) -> Response:
        self.check_model(body.model)
        method = self.resolve(body.specdec)
        prompt_ids = await self.prompt_ids(body, chat)
        settings = self.settings(body, chat, len(prompt_ids))
        events: asyncio.Queue = asyncio.Queue()
        loop = asyncio.get_running_loop()
        endpoint = "chat" if chat else "completions"

        def sink(event: Any) -> None:
            loop.call_soon_threadsafe(events.put_nowait, event)

        scope, sources = tenant(request.scope), bool(body.specdec and body.specdec.sources)
        job = Job(prompt_ids, method.config, method.name, settings, endpoint, body.stream, sink, scope, sources)
        self.submit(job)
        reply = Reply(chat, self.model_name, method.name, method.visible, len(prompt_ids), self.config.expose_stats)
        if body.stream:
            usage = bool(body.stream_options and body.stream_options.include_usage)
            headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
            return StreamingResponse(
                self.stream(job, events, reply, usage), media_type="text/event-stream", headers=headers
            )
        return await self.collect(request, job, events, reply)

    async def stream(self, job: Job, events: asyncio.Queue, reply: Reply, usage: bool) -> AsyncIterator[str]:
        """SSE chunks of one job; leaving early (client gone, shutdown) cancels the job."""
        try:
            if reply.chat:
                yield sse(reply.chunk("", first=True))
            while True:
                event = await events.get()
                if isinstance(event, DoneEvent):
                    for chunk in reply.final_chunks(event, usage):
                        yield sse(chunk)
                elif isinstance(event, ErrorEvent | CancelledEvent):
                    yield sse(error_body(event_error(event)))
                else:
                    yield sse(reply.chunk(event.text, piece=event.piece))
                    continue
                yield "data: [DONE]\n\n"
                return
        finally:
            job.cancel()

    async def collect(self, request: Request, job: Job, events: asyncio.Queue, reply: Reply) -> Response:
        """Wait for a non-streaming job's result, cancelling it if the client goes away."""
        getter = asyncio.ensure_future(events.get())
        try:
            while not getter.done():
                await asyncio.wait({getter}, timeout=DISCONNECT_POLL_S)
                if not getter.done() and await request.is_disconnected():
                    return Response(status_code=499)  # nobody reads this; the finally cancels the job
            event = getter.result()
        finally:
            getter.cancel()
            job.cancel()
        if isinstance(event, DoneEvent):
            return JSONResponse(reply.full(event))
        raise event_error(event)

    def health(self) -> dict:
        return {
            "status": "ok",
            "model": self.model_name,
            "waiting": self.scheduler.num_waiting,
            "running": self.scheduler.num_running,
        }

    def models(self) -> dict:
        card = {"id": self.model_name, "object": "model", "created": 0, "owned_by": "specdec"}
        return {"object": "list", "data": [card]}


def _message_dict(message: Any) -> dict[str, str]:
    content = message.content
    text = content if isinstance(content, str) else "".join(part.text for part in content)
    return {"role": "system" if message.role == "developer" else message.role, "content": text}


def create_app(config: ServerConfig, loaded: LoadedModel) -> FastAPI:
    """The ASGI app for one loaded model; its lifespan starts and stops the decode worker."""
    service = Service(config, loaded)
    limits = SchemaLimits(service.model_name, config.max_tokens_limit, service.vocab_size)
    ChatRequest, CompletionRequest = request_models(limits)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        service.scheduler.start()
        try:
            yield
        finally:
            await asyncio.to_thread(service.scheduler.close, config.shutdown_timeout_s)
            service.encoder.shutdown(wait=False, cancel_futures=True)

    app = FastAPI(title="specdec", version="0.1.0", lifespan=lifespan, redoc_url=None)
    app.state.service = service
    install_error_handlers(app)
    app.add_middleware(
        Guard,
        api_keys=config.api_keys,
        max_body_bytes=config.max_body_bytes,
        metrics=service.metrics,
        body_timeout_s=config.request_timeout_s,
        admin_keys=config.admin_keys,
    )
    if config.api_keys or config.admin_keys:
        document_bearer_auth(app, PUBLIC_PATHS)
    generation = {"responses": {**ERROR_RESPONSES, 200: {"content": SSE_CONTENT}}}

    @app.post("/v1/chat/completions", response_model=ChatCompletion, **generation)
    async def chat_completions(request: Request, body: ChatRequest) -> Response:  # type: ignore[valid-type]
        return await service.generate(request, body, chat=True)

    @app.post("/v1/completions", response_model=Completion, **generation)
    async def completions(request: Request, body: CompletionRequest) -> Response:  # type: ignore[valid-type]
        return await service.generate(request, body, chat=False)

    @app.get("/v1/models", response_model=ModelList, responses=ERROR_RESPONSES)
    async def models() -> dict:
        return service.models()

    @app.get("/v1/models/{model}", response_model=ModelCard, responses=ERROR_RESPONSES)
    async def model_card(model: str) -> dict:
        service.check_model(model)
        return service.models()["data"][0]

    @app.get("/health", response_model=Health)
    async def health() -> dict:
        return service.health()

    @app.head("/health", include_in_schema=False)  # load balancers' probes: the status, no body
    async def health_head() -> Response:
        return Response(status_code=200)

    @app.get("/metrics", responses={200: {"content": {service.metrics.content_type: {}}}, **ERROR_RESPONSES})
    async def metrics() -> Response:
        return Response(service.metrics.render(), media_type=service.metrics.content_type)

    add_methods_route(app, service.methods, service.pool)
    if config.ui:
        add_playground(app)
    return app


def serve(config: ServerConfig) -> None:
    """Load the model and serve it until SIGINT/SIGTERM."""
    import uvicorn

    from specdec.backends.registry import load_model

    _log_to_stderr(config.log_level)
    def build() -> tuple[FastAPI, str]:
        app = create_app(config, load_model(config.model))
        return app, path_line(app.state.service.loaded)

    # loads the model and prepares the configured methods (measure, load, calibrate), off the main thread
    app, path = off_main_thread(build)
    loaded = app.state.service.loaded
    if not config.api_keys and config.host not in ("127.0.0.1", "localhost", "::1"):
        log.warning("serving on %s without --api-key: anyone who can reach it can use it", config.host)
    print(
        f"specdec: serving {loaded.name} (default method {config.method}) on "
        f"http://{config.host}:{config.port}; {app.state.service.exact_note}; a joining prompt is "
        f"prefilled {app.state.service.prefill_chunk} tokens per step"
        + (f"; the playground is at http://{config.host}:{config.port}/" if config.ui else "")
        + f"\nspecdec: path: {path} (`specdec-hf doctor` says why)",
        file=sys.stderr,
        flush=True,
    )
    uv_config = uvicorn.Config(
        app,
        host=config.host,
        port=config.port,
        log_level=config.log_level,
        timeout_graceful_shutdown=uvicorn_timeout_s(config.shutdown_timeout_s),
        http=functools.partial(HeaderDeadlineProtocol, header_timeout_s=config.request_timeout_s),
    )
    drain = Drain(app.state.service.scheduler, config.shutdown_timeout_s)
    # uvicorn restores the SIGTERM handler it found and raises the signal again: this one exits with 0
    previous = signal.signal(signal.SIGTERM, exit_cleanly)
    try:
        DrainingServer(uv_config, drain).run()
    finally:
        signal.signal(signal.SIGTERM, previous)


def _log_to_stderr(level: str) -> None:
    """specdec's own log lines (request ids, the drain) beside uvicorn's, at the server's log level."""
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(levelname)s:     %(message)s"))
    logger = logging.getLogger("specdec")
    logger.addHandler(handler)
    logger.setLevel(level.upper())
