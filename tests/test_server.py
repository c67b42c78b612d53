"""`specdec serve` end to end: a real server process on loopback, the official openai client.

What must hold (each test can fail):
- through the openai client, chat and completions, streamed or not, give at
  temperature 0 exactly the text, finish reason and token counts of
  `specdec.api.generate` with the same settings (the server adds and loses nothing);
- the request's `specdec` field picks the method, and the text does not depend on it;
- 8 concurrent streaming clients each get their single-client output, and the
  /metrics counters add up to the `usage` the clients were sent;
- a full queue answers 429; a client that disconnects cancels its generation;
- SIGTERM lets the running and the queued streams finish, then the process exits cleanly;
- the scheduler (in process) is FIFO, bounded, and cancels everything on close.
"""

from __future__ import annotations

import json
import signal
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from specdec.api import generate
from specdec.engine import Engine, GenerationConfig
from specdec.prompts import encode_prompt
from specdec.proposers import parse_method
from specdec.sampling import SamplingParams
from specdec.serve.metrics import ServerMetrics
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
MAX_QUEUE = 7  # main server: 1 running + 7 waiting = 8 concurrent clients, the 9th gets 429
LIMIT = 256
SERVER_ARGS = ["--dtype", "fp32", "--method", METHOD, "--log-level", "warning"]
MESSAGES = [{"role": "user", "content": "Name three colors of the rainbow."}]
COUNTING = "1, 2, 3, 4, 5, 6, 7, 8,"  # greedy SmolLM2 counts on for hundreds of tokens without EOS
# A request that holds the decode worker for LIMIT plain forward passes (seconds even on an idle
# machine) until its client leaves: it makes "one running, the rest waiting" a fact, not a race.
HOLD = {"prompt": COUNTING, "max_tokens": LIMIT, "temperature": 0, "stream": True, "specdec": {"method": "plain"}}
PROMPTS = ["Say hello.", "Name a fruit.", "What is 3+4?", "Name a planet.", "Give me a color."]
WAIT_S = 90.0  # bound on every poll loop


@pytest.fixture(scope="module")
def servers(tmp_path_factory) -> Iterator[dict[str, ServerProcess]]:
    """Both server processes start at once (model loading overlaps); all are stopped at the end."""
    logs = tmp_path_factory.mktemp("server-logs")
    specs = {
        "main": [*SERVER_ARGS, "--max-queue", str(MAX_QUEUE), "--max-tokens-limit", str(LIMIT)],
        "shutdown": [*SERVER_ARGS, "--max-tokens-limit", "32", "--shutdown-timeout", "60"],
    }
    started: dict[str, ServerProcess] = {}
    try:
        for name, args in specs.items():
            started[name] = ServerProcess(args, logs / f"{name}.log").start()
        yield started
    finally:
        for server in started.values():
            server.stop()


@pytest.fixture(scope="module")
def server(servers) -> ServerProcess:
    return servers["main"].wait_ready()


@pytest.fixture
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", timeout=120, max_retries=0)


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


def stream_chat(client: openai.OpenAI, prompt: str, max_tokens: int = 8) -> tuple[str, object]:
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


# ------------------------------------------------------------------ the openai client
def test_chat_through_openai_client_matches_library(client, default_model):
    expected = generate(default_model, MESSAGES, METHOD, max_new_tokens=24, temperature=0.0, chat=True)
    reply = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=24, temperature=0)
    assert reply.choices[0].message.content == expected.text
    assert reply.choices[0].finish_reason == expected.finish_reason
    assert reply.usage.prompt_tokens == expected.stats.num_prompt_tokens
    assert reply.usage.completion_tokens == len(expected.token_ids)
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens
    stats = reply.model_extra["specdec"]
    assert stats["method"] == METHOD and stats["num_new_tokens"] == len(expected.token_ids)
    assert sum(stats["accepted_histogram"].values()) == stats["num_forward_passes"] - 1  # decode steps

    chunks = list(
        client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=24, temperature=0, stream=True)
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == expected.text
    assert [c.choices[0].finish_reason for c in chunks if c.choices[0].finish_reason] == [expected.finish_reason]
    assert chunks[-1].choices[0].finish_reason == expected.finish_reason  # the stats ride on the last chunk
    assert chunks[-1].model_extra["specdec"]["num_new_tokens"] == len(expected.token_ids)


def test_completions_through_openai_client_match_library(client, default_model):
    prompt, stop = "The three primary colors are", ["."]
    expected = generate(default_model, prompt, METHOD, max_new_tokens=24, temperature=0.0, stop=stop)
    reply = client.completions.create(model=MODEL, prompt=prompt, max_tokens=24, temperature=0, stop=stop)
    assert reply.choices[0].text == expected.text and "." not in expected.text
    assert reply.choices[0].finish_reason == expected.finish_reason
    assert reply.usage.completion_tokens == len(expected.token_ids)

    chunks = list(
        client.completions.create(
            model=MODEL, prompt=prompt, max_tokens=24, temperature=0, stop=stop, stream=True,
            stream_options={"include_usage": True},
        )
    )  # fmt: skip
    assert "".join(c.choices[0].text for c in chunks if c.choices) == expected.text
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == len(expected.token_ids)
    assert chunks[-1].model_extra["specdec"]["method"] == METHOD


def test_specdec_field_picks_the_method_and_the_text_does_not_change(client):
    def ask(method: str):
        return client.chat.completions.create(
            model=MODEL, messages=MESSAGES, max_tokens=16, temperature=0, extra_body={"specdec": {"method": method}}
        )

    plain, spec = ask("plain"), ask(METHOD)
    assert plain.model_extra["specdec"]["method"] == "plain"
    assert plain.model_extra["specdec"]["mat"] == 1.0
    assert spec.model_extra["specdec"]["method"] == METHOD
    assert spec.choices[0].message.content == plain.choices[0].message.content


def test_seeded_sampling_is_reproducible(client):
    def ask() -> str:
        reply = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=12, temperature=0.9,
                                          top_p=0.9, seed=1234)  # fmt: skip
        return reply.choices[0].text

    assert ask() == ask()


# ------------------------------------------------------------------ concurrency, queue, cancellation
def test_eight_concurrent_streaming_clients_get_their_single_client_output(server, client):
    single = {prompt: stream_chat(client, prompt)[0] for prompt in PROMPTS}
    wait_idle(server)
    before = scrape(server)

    def run_client(index: int) -> list[tuple[str, str, object]]:
        own = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", timeout=300, max_retries=0)
        order = PROMPTS[index % len(PROMPTS) :] + PROMPTS[: index % len(PROMPTS)]
        return [(prompt, *stream_chat(own, prompt)) for prompt in order]

    with ThreadPoolExecutor(max_workers=8) as pool:
        results = [row for rows in pool.map(run_client, range(8)) for row in rows]
    after = scrape(server)
    assert len(results) == 40
    for prompt, text, _ in results:
        assert text == single[prompt], prompt

    def delta(name: str, **labels: str) -> float:
        return metric(after, name, **labels) - metric(before, name, **labels)

    assert delta("specdec_requests_total", endpoint="chat", method=METHOD, outcome="completed") == 40
    assert delta("specdec_http_responses_total", path="/v1/chat/completions", status="200") == 40
    assert delta("specdec_completion_tokens_total", method=METHOD) == sum(u.completion_tokens for *_, u in results)
    assert delta("specdec_prompt_tokens_total", method=METHOD) == sum(u.prompt_tokens for *_, u in results)
    assert delta("specdec_step_seconds_count", method=METHOD) == delta("specdec_forward_passes_total", method=METHOD) - 40


def _open_stream(stack: ExitStack, server: ServerProcess, body: dict = HOLD, path: str = "/v1/completions"):
    http = stack.enter_context(httpx.Client(timeout=120))
    response = stack.enter_context(http.stream("POST", server.url + path, json=body))
    assert response.status_code == 200
    return response


def test_full_queue_answers_429_in_openai_shape(server):
    wait_idle(server)
    with ExitStack() as stack:
        running = data_lines(_open_stream(stack, server))  # kept: a dropped iterator closes the connection
        next(running)  # its first text: it runs, and holds the worker
        for _ in range(MAX_QUEUE):
            _open_stream(stack, server)  # 200 and headers: these are queued
        health = server.health()
        refused = httpx.post(server.url + "/v1/chat/completions", json={"messages": MESSAGES, "max_tokens": 4})
    assert health is not None and (health["running"], health["waiting"]) == (1, MAX_QUEUE)
    assert refused.status_code == 429, refused.text
    assert refused.json()["error"]["code"] == "queue_full"
    assert set(refused.json()["error"]) == {"message", "type", "param", "code"}
    wait_idle(server)  # the closed streams were all cancelled


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


def test_sigterm_lets_running_and_queued_streams_finish(servers):
    server = servers["shutdown"].wait_ready()
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
    # uvicorn re-raises the SIGTERM it handled once it has shut down cleanly: that is the exit status
    assert server.process.wait(WAIT_S) in (0, -signal.SIGTERM)
    assert server.health() is None
    assert "Traceback" not in server.log_tail()


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

    scheduler = Scheduler(Engine(default_model), max_queue=2, metrics=ServerMetrics())
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
    with pytest.raises(QueueClosed):
        scheduler.submit(_job(prompt_ids, 3, sink_for(5)))
