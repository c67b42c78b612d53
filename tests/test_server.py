"""`specdec serve` as a real process on loopback: concurrency, the queue, client disconnects, shutdown.

Only what needs real sockets, a real uvicorn and real signals runs against a
process here (one for the whole module); everything else about the server runs
in process (test_serve_app.py, test_server_fuzz.py). No test depends on timing:
every wait is an event or a bounded poll. What must hold (each test can fail):
- 8 concurrent streaming clients each get their single-client output, and the
  /metrics counters add up to the `usage` the clients were sent;
- a client that disconnects cancels its generation (a full queue's 429 is tested
  in process, deterministically: test_serve_app.py);
- SIGTERM lets the running and the queued streams finish, then the process exits
  with status 0 (this ends the module's server, so it is the module's last server test);
- the scheduler (in process) is FIFO, bounded, cancels everything on close, and
  takes its proposers from the pool (one build per config).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from specdec.engine.generation import GenerationConfig
from specdec.engine.loop import Engine
from specdec.prompts import encode_prompt
from specdec.proposers import parse_method
from specdec.sampling import SamplingParams
from specdec.serve.metrics import ServerMetrics
from specdec.serve.pool import ProposerPool
from specdec.serve.process import ServerProcess
from specdec.serve.scheduler import (
    CancelledEvent,
    DoneEvent,
    Job,
    QueueClosed,
    QueueFull,
    Scheduler,
    TextEvent,
)

METHOD = "logitspec"
MODEL = "smollm2-135m"
MAX_QUEUE = 7  # 1 running + 7 waiting = 8 concurrent clients
LIMIT = 1024
SERVER_ARGS = ["--dtype", "fp32", "--method", METHOD, "--log-level", "warning", "--max-queue", str(MAX_QUEUE),
               "--max-tokens-limit", str(LIMIT), "--shutdown-timeout", "60"]  # fmt: skip
MESSAGES = [{"role": "user", "content": "Name three colors of the rainbow."}]
COUNTING = "1, 2, 3, 4, 5, 6, 7, 8,"  # greedy SmolLM2 counts on for hundreds of tokens without EOS
# A request that would hold the decode worker for LIMIT plain forward passes (many seconds on any
# machine) if its client did not leave after a few chunks: "still running when the client left" is a fact.
HOLD = {"prompt": COUNTING, "max_tokens": LIMIT, "temperature": 0, "stream": True, "specdec": {"method": "plain"}}
PROMPTS = ["Say hello.", "Name a fruit.", "What is 3+4?", "Name a planet.", "Give me a color."]
WAIT_S = 120.0  # bound on every poll loop


@pytest.fixture(scope="module")
def server(default_model, tmp_path_factory) -> Iterator[ServerProcess]:
    """One server process for the module. `default_model` first: the model is converted and the
    cost curve cached before the child starts, so the child only reads them."""
    process = ServerProcess(SERVER_ARGS, tmp_path_factory.mktemp("server-logs") / "server.log").start()
    try:
        yield process.wait_ready()
    finally:
        process.stop()


@pytest.fixture
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", timeout=300, max_retries=0)


# ------------------------------------------------------------------ helpers
def scrape(server: ServerProcess) -> dict[tuple, float]:
    """/metrics as {(sample name, sorted labels): value}."""
    text = httpx.get(server.url + "/metrics", timeout=30).text
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def metric(values: dict[tuple, float], name: str, **labels: str) -> float:
    return values.get((name, tuple(sorted(labels.items()))), 0.0)


def wait_until(condition, what: str) -> None:
    """Poll `condition` (bounded by WAIT_S); fail with `what` if it never holds."""
    for _ in range(int(WAIT_S / 0.2)):
        if condition():
            return
        threading.Event().wait(0.2)
    pytest.fail(f"timed out waiting for {what}")


def wait_idle(server: ServerProcess) -> None:
    def idle() -> bool:
        health = server.health()
        return health is not None and health["waiting"] == 0 and health["running"] == 0

    wait_until(idle, "the server to be idle")


def data_lines(response: httpx.Response) -> Iterator[str]:
    for line in response.iter_lines():
        if line.startswith("data: "):
            yield line[len("data: ") :]


def stream_chat(client: openai.OpenAI, prompt: str, max_tokens: int = 6) -> tuple[str, object]:
    """(text, usage) of one streamed chat request at temperature 0."""
    chunks = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": prompt}],
        max_tokens=max_tokens,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    parts, usage = [], None
    for chunk in chunks:
        parts.extend(choice.delta.content or "" for choice in chunk.choices)
        usage = chunk.usage or usage
    return "".join(parts), usage


# ------------------------------------------------------------------ concurrency, queue, cancellation
@pytest.mark.slow
def test_eight_concurrent_streaming_clients_get_their_single_client_output(server, client):
    single = {prompt: stream_chat(client, prompt)[0] for prompt in PROMPTS}
    wait_idle(server)
    before = scrape(server)

    def run_client(index: int) -> list[tuple[str, str, object]]:
        own = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", timeout=300, max_retries=0)
        order = [PROMPTS[index % len(PROMPTS)], PROMPTS[(index + 1) % len(PROMPTS)]]
        return [(prompt, *stream_chat(own, prompt)) for prompt in order]

    with ThreadPoolExecutor(max_workers=8) as pool:
        results = [row for rows in pool.map(run_client, range(8)) for row in rows]
    after = scrape(server)
    assert len(results) == 16
    for prompt, text, _ in results:
        assert text == single[prompt], prompt

    def delta(name: str, **labels: str) -> float:
        return metric(after, name, **labels) - metric(before, name, **labels)

    assert delta("specdec_requests_total", endpoint="chat", method=METHOD, outcome="completed") == 16
    assert delta("specdec_http_responses_total", path="/v1/chat/completions", status="200") == 16
    assert delta("specdec_completion_tokens_total", method=METHOD) == sum(u.completion_tokens for *_, u in results)
    assert delta("specdec_prompt_tokens_total", method=METHOD) == sum(u.prompt_tokens for *_, u in results)
    assert delta("specdec_step_seconds_count", method=METHOD) == delta("specdec_forward_passes_total", method=METHOD) - 16


def _open_stream(stack: ExitStack, server: ServerProcess, body: dict = HOLD, path: str = "/v1/completions"):
    http = stack.enter_context(httpx.Client(timeout=120))
    response = stack.enter_context(http.stream("POST", server.url + path, json=body))
    assert response.status_code == 200
    return response


@pytest.mark.slow
def test_client_disconnect_cancels_its_generation(server):
    wait_idle(server)
    labels = {"endpoint": "completions", "method": "plain"}
    before = scrape(server)
    with ExitStack() as stack:
        lines = data_lines(_open_stream(stack, server))
        seen = [json.loads(next(lines)) for _ in range(3)]  # 3 text chunks; then the client leaves
        assert all(chunk["choices"][0]["finish_reason"] is None for chunk in seen)

    def delta(name: str, **extra: str) -> float:
        now = scrape(server)
        return metric(now, name, **labels, **extra) - metric(before, name, **labels, **extra)

    wait_until(lambda: delta("specdec_requests_total", outcome="cancelled") == 1, "the generation to be cancelled")
    assert delta("specdec_requests_total", outcome="completed") == 0
    chunks = metric(scrape(server), "specdec_text_chunks_total", method="plain") - metric(
        before, "specdec_text_chunks_total", method="plain"
    )
    assert 3 <= chunks < LIMIT // 2  # it stopped soon after the client left, far from max_tokens


# ------------------------------------------------------------------ the scheduler, in process
def _job(prompt_ids: list[int], max_tokens: int, sink, method: str = "plain") -> Job:
    settings = GenerationConfig(max_new_tokens=max_tokens, sampling=SamplingParams(temperature=0.0))
    return Job(prompt_ids, parse_method(method), method, settings, "chat", True, sink)


def test_scheduler_is_fifo_bounded_and_closes_cleanly(default_model):
    prompt_ids = encode_prompt(default_model.tokenizer, COUNTING)
    events: list[tuple[int, object]] = []
    first_three_done, started = threading.Event(), threading.Event()

    def sink_for(index: int):
        def sink(event) -> None:
            events.append((index, event))
            if isinstance(event, DoneEvent) and index == 2:
                first_three_done.set()
            if isinstance(event, TextEvent) and index == 3:
                started.set()

        return sink

    pool = ProposerPool(default_model)
    scheduler = Scheduler(Engine(default_model), max_queue=2, metrics=ServerMetrics(), pool=pool)  # max_batch 1
    for index in range(3):  # nothing runs yet: 2 waiting + the one the worker will take
        scheduler.submit(_job(prompt_ids, 3, sink_for(index)))
    with pytest.raises(QueueFull):
        scheduler.submit(_job(prompt_ids, 3, sink_for(99)))
    scheduler.start()
    try:
        assert first_three_done.wait(WAIT_S)
        scheduler.submit(_job(prompt_ids, 500, sink_for(3)))  # long: still running at close()
        scheduler.submit(_job(prompt_ids, 3, sink_for(4)))
        assert started.wait(WAIT_S)
    finally:
        scheduler.close(WAIT_S)
    done = [index for index, event in events if isinstance(event, DoneEvent)]
    assert done == [0, 1, 2]
    assert [index for index, event in events if isinstance(event, CancelledEvent)] == [3, 4]
    assert not scheduler.worker_alive
    assert pool.stats().builds == 1  # five jobs, one config: one proposer
    with pytest.raises(QueueClosed):
        scheduler.submit(_job(prompt_ids, 3, sink_for(5)))


# ------------------------------------------------------------------ shutdown (ends the server: keep last)
@pytest.mark.slow
def test_sigterm_lets_running_and_queued_streams_finish(server):
    wait_idle(server)
    with ExitStack() as stack:
        chat = {"messages": MESSAGES, "temperature": 0, "stream": True}
        running = data_lines(_open_stream(stack, server, {**chat, "max_tokens": 24}, "/v1/chat/completions"))
        queued = data_lines(_open_stream(stack, server, {**chat, "max_tokens": 8}, "/v1/chat/completions"))
        next(running)
        server.terminate()
        streams = [[next(running), *running], list(queued)]
    for lines in streams:
        assert lines[-1] == "[DONE]"
        last = json.loads(lines[-2])
        assert "error" not in last and last["choices"][0]["finish_reason"] in ("stop", "length")
    # a clean SIGTERM shutdown exits 0 (not 143, which supervisors read as "killed")
    assert server.process.wait(WAIT_S) == 0
    assert server.health() is None
    assert "Traceback" not in server.log_tail()
