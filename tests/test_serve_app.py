"""`specdec serve`'s app in process (ASGI, no sockets): the openai client, methods, options and the proposer pool.

One app per module on the session's fp32 model, driven through Starlette's
TestClient (which runs the app's lifespan, so the real decode worker runs).
What must hold (each test can fail):
- through the openai client, chat and completions, streamed or not, give at
  temperature 0 exactly the text, finish reason and token counts of
  `specdec.api.generate` with the same settings;
- the request's `specdec` field picks the method, and the text does not depend on it;
- a request can set only allowlisted, bounded options: paths (`draft_model`,
  `cache_dir`, `costs_dir`), out-of-bounds values, and the same in the method
  string get 400 in OpenAI's shape naming the option; a method that needs
  server-side setup this server lacks (`draft` without a draft model) gets 400;
- replies show a method's request options, never its server-side settings;
- proposers are built once per distinct config and reused across requests;
- a full queue answers 429 in OpenAI's shape (the worker is held by an event, not by time).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import openai
import pytest
from starlette.testclient import TestClient

from specdec.api import generate
from specdec.engine.generation import GenerationConfig
from specdec.proposers import make_config
from specdec.sampling import SamplingParams
from specdec.serve.app import ServerConfig, create_app
from specdec.serve.scheduler import Job

pytestmark = pytest.mark.slow  # the full tier (make test-all): in-process server over the real model, many requests

METHOD = "logitspec"
MODEL = "smollm2-135m"
LIMIT = 32
MAX_QUEUE = 3
WAIT_S = 120.0  # bound on every wait
MESSAGES = [{"role": "user", "content": "Name three colors of the rainbow."}]
SERVER = ServerConfig(
    method=METHOD,
    method_configs=("layerskip:skip=10+20", "logitspec:min_gain=0.2"),
    max_tokens_limit=LIMIT,
    max_queue=MAX_QUEUE,
    max_batch=4,
    expose_stats=True,  # the tests below read the decoding stats; hidden by default (test_server_limits.py)
    log_level="warning",
)


@pytest.fixture(scope="module")
def http(default_model) -> Iterator[TestClient]:
    with TestClient(create_app(SERVER, default_model), raise_server_exceptions=False) as client:
        yield client


@pytest.fixture(scope="module")
def client(http) -> openai.OpenAI:
    return openai.OpenAI(base_url="http://testserver/v1", api_key="unused", http_client=http, max_retries=0)


def complete(http: TestClient, specdec: dict | None, max_tokens: int = 4, **extra):
    body = {"prompt": "The three primary colors are", "max_tokens": max_tokens, "temperature": 0, **extra}
    return http.post("/v1/completions", json={**body, **({"specdec": specdec} if specdec is not None else {})})


def error_of(response, status: int = 400) -> dict:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    return body["error"]


# ------------------------------------------------------------------ the openai client
def test_chat_through_openai_client_matches_library(client, default_model):
    expected = generate(default_model, MESSAGES, METHOD, max_new_tokens=12, temperature=0.0, chat=True)
    reply = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=12, temperature=0)
    assert reply.choices[0].message.content == expected.text
    assert reply.choices[0].finish_reason == expected.finish_reason
    assert reply.usage.prompt_tokens == expected.stats.num_prompt_tokens
    assert reply.usage.completion_tokens == len(expected.token_ids)
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens
    stats = reply.model_extra["specdec"]
    assert stats["method"] == METHOD and stats["num_new_tokens"] == len(expected.token_ids)
    assert sum(stats["accepted_histogram"].values()) == stats["num_forward_passes"] - 1  # decode steps

    chunks = list(
        client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=12, temperature=0, stream=True)
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == expected.text
    assert [c.choices[0].finish_reason for c in chunks if c.choices[0].finish_reason] == [expected.finish_reason]
    assert chunks[-1].model_extra["specdec"]["num_new_tokens"] == len(expected.token_ids)


def test_completions_through_openai_client_match_library(client, default_model):
    prompt, stop = "The three primary colors are", ["."]
    expected = generate(default_model, prompt, METHOD, max_new_tokens=12, temperature=0.0, stop=stop)
    reply = client.completions.create(model=MODEL, prompt=prompt, max_tokens=12, temperature=0, stop=stop)
    assert reply.choices[0].text == expected.text and "." not in expected.text
    assert reply.choices[0].finish_reason == expected.finish_reason
    assert reply.usage.completion_tokens == len(expected.token_ids)

    chunks = list(
        client.completions.create(
            model=MODEL, prompt=prompt, max_tokens=12, temperature=0, stop=stop, stream=True,
            stream_options={"include_usage": True},
        )
    )  # fmt: skip
    assert "".join(c.choices[0].text for c in chunks if c.choices) == expected.text
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == len(expected.token_ids)
    assert chunks[-1].model_extra["specdec"]["method"] == METHOD


def test_specdec_field_picks_the_method_and_the_text_does_not_change(client):
    def ask(specdec: dict):
        return client.chat.completions.create(
            model=MODEL, messages=MESSAGES, max_tokens=8, temperature=0, extra_body={"specdec": specdec}
        )

    replies = {
        "plain": ask({"method": "plain"}),
        METHOD: ask({"method": METHOD}),
        "pld": ask({"method": "pld:num_pred_tokens=4", "options": {"max_ngram": 2}}),
        "layerskip": ask({"method": "layerskip", "options": {"k": 2}}),  # its skip set is the server's
        "lookahead": ask({"method": "lookahead", "options": {"window": 3}}),
    }
    assert replies["plain"].model_extra["specdec"]["mat"] == 1.0
    texts = {name: reply.choices[0].message.content for name, reply in replies.items()}
    for name, reply in replies.items():
        assert reply.model_extra["specdec"]["method"] == name
        assert texts[name] == texts["plain"], name
    assert replies["pld"].model_extra["specdec"]["options"] == {
        "max_ngram": 2, "min_ngram": 1, "num_pred_tokens": 4, "prefer": "earliest"
    }  # fmt: skip


def test_seeded_sampling_is_reproducible(client):
    def ask() -> str:
        reply = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=8, temperature=0.9,
                                          top_p=0.9, seed=1234)  # fmt: skip
        return reply.choices[0].text

    assert ask() == ask()


@pytest.mark.parametrize(
    "extra",
    [{"frequency_penalty": False}, {"temperature": True}, {"max_tokens": True}, {"top_k": False},
     {"seed": True}, {"prompt": [True, 2]}],  # fmt: skip
)
def test_booleans_are_not_numbers(http, extra):
    """The schema says number / integer; pydantic's lax mode would read true as 1 (found by the fuzz test)."""
    error = error_of(complete(http, None, **extra))
    assert error["type"] == "invalid_request_error"


# ------------------------------------------------------------------ method options from requests
@pytest.mark.parametrize(
    ("specdec", "option", "param"),
    [
        ({"method": "draft", "options": {"draft_model": "/etc"}}, "draft_model", "specdec.options"),
        ({"method": "draft", "options": {"cache_dir": "/tmp"}}, "cache_dir", "specdec.options"),
        ({"method": "layerskip", "options": {"cache_dir": "/tmp"}}, "cache_dir", "specdec.options"),
        ({"method": "layerskip", "options": {"skip": "1"}}, "skip", "specdec.options"),
        ({"options": {"costs_dir": "/tmp/costs"}}, "costs_dir", "specdec.options"),
        ({"method": "logitspec:costs_dir=/tmp/costs"}, "costs_dir", "specdec.method"),
        ({"method": "draft:draft_model=/etc"}, "draft_model", "specdec.method"),
    ],
)
def test_server_side_options_get_400_naming_the_option(http, specdec, option, param):
    error = error_of(complete(http, specdec))
    assert (error["param"], error["code"], error["type"]) == (param, "option_not_allowed", "invalid_request_error")
    assert repr(option) in error["message"] and "/tmp" not in error["message"]


@pytest.mark.parametrize(
    "specdec",
    [
        {"method": "logitspec", "options": {"budget": 1000}},
        {"method": "logitspec:budget=1000"},
        {"options": {"budget": 0}},
        {"options": {"k": -1}},
        {"method": "pld", "options": {"num_pred_tokens": 10**9}},
        {"method": "lookahead:window=1000"},
    ],
)
def test_out_of_bounds_options_get_400(http, specdec):
    error = error_of(complete(http, specdec))
    assert error["code"] == "invalid_value" and error["param"] in ("specdec.options", "specdec.method")
    assert "must be" in error["message"]


def test_methods_without_server_side_setup_get_400_not_500(http):
    error = error_of(complete(http, {"method": "draft", "options": {"k": 2}}))
    assert (error["param"], error["code"]) == ("specdec.method", "method_not_available")
    assert "draft model" in error["message"] and "--method-config" in error["message"]


def test_replies_show_request_options_never_server_side_settings(http):
    stats = complete(http, None).json()["specdec"]
    assert stats["options"]["min_gain"] == 0.2  # the server's setting, visible: a request may set it too
    assert "costs_dir" not in stats["options"]
    layerskip = complete(http, {"method": "layerskip"}).json()["specdec"]["options"]
    assert "skip" not in layerskip and "cache_dir" not in layerskip and layerskip["k"] == 3


# ------------------------------------------------------------------ the proposer pool
def test_the_same_config_reuses_its_proposer(http):
    pool = http.app.state.service.pool
    specdec = {"method": "logitspec", "options": {"budget": 9, "k": 7}}
    assert complete(http, specdec).status_code == 200
    after_first = pool.stats()
    same = {"method": "logitspec:k=7", "options": {"budget": "9"}}  # the same config, said differently
    assert complete(http, same).status_code == 200
    after_second = pool.stats()
    assert after_second.builds == after_first.builds
    assert after_second.hits == after_first.hits + 1
    assert complete(http, {"method": "logitspec", "options": {"budget": 10, "k": 7}}).status_code == 200
    assert pool.stats().builds == after_first.builds + 1
    assert pool.stats().prepared == 1  # the one cost curve, measured (or read) at startup, shared by all


# ------------------------------------------------------------------ the queue
def test_full_queue_answers_429_in_openai_shape(http):
    """The worker is held by a job whose sink waits for an event; behind it wait the jobs the batch's
    free rows will take (max_batch - 1) and MAX_QUEUE more."""
    scheduler = http.app.state.service.scheduler
    holding, release = threading.Event(), threading.Event()

    def hold(event) -> None:
        holding.set()
        release.wait(WAIT_S)

    settings = GenerationConfig(max_new_tokens=LIMIT, sampling=SamplingParams(temperature=0.0))
    jobs = [Job([1, 2, 3], make_config("plain"), "plain", settings, "completions", True, hold)]
    jobs += [Job([1, 2, 3], make_config("plain"), "plain", settings, "completions", True, lambda event: None)
             for _ in range(MAX_QUEUE + SERVER.max_batch - 1)]
    try:
        scheduler.submit(jobs[0])
        assert holding.wait(WAIT_S)  # its first text piece: it runs, and holds the worker
        for job in jobs[1:]:
            scheduler.submit(job)
        health = http.get("/health").json()
        refused = complete(http, None)
    finally:
        for job in jobs:
            job.cancel()
        release.set()
    assert (health["running"], health["waiting"]) == (1, MAX_QUEUE + SERVER.max_batch - 1)
    error = error_of(refused, 429)
    assert (error["code"], error["type"]) == ("queue_full", "rate_limit_error")
    assert int(refused.headers["retry-after"]) >= 1
    for _ in range(int(WAIT_S / 0.1)):  # the cancelled jobs drain
        if scheduler.num_waiting == scheduler.num_running == 0:
            break
        threading.Event().wait(0.1)
    assert complete(http, None).status_code == 200


def test_long_ngram_logitspec_request_on_repeated_text(http, default_model):
    """Once HTTP 500: logitspec's priors were indexed by n-gram sizes up to 3 only."""
    prompt = "one two three four five six. " * 5 + "one two three four"
    response = complete(http, {"method": "logitspec:max_ngram=5"}, max_tokens=8, prompt=prompt)
    assert response.status_code == 200, response.text
    expected = generate(default_model, prompt, "logitspec:max_ngram=5", max_new_tokens=8)
    assert response.json()["choices"][0]["text"] == expected.text
