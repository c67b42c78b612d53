"""`specdec serve` against hostile clients: API key, invalid requests, and schema fuzzing.

One real server process on loopback with an API key and a small max_tokens limit
(so that every request schemathesis makes is cheap). What must hold:
- without the right `Authorization: Bearer KEY` every path but /health is 401,
  in OpenAI's error shape;
- every invalid request gets a 4xx whose body is exactly OpenAI's error shape
  with a clear message (never FastAPI's 422 body, never a traceback);
- fuzzing the server's own OpenAPI schema (schemathesis) finds no 5xx, no
  response that breaks the schema, and the process stays up;
- an internal error becomes a 500 in the same shape, without its details.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import httpx
import openai
import pytest
import schemathesis
from fastapi import FastAPI
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode
from schemathesis.specs.openapi.checks import positive_data_acceptance
from starlette.testclient import TestClient

from specdec.proposers import method_config_class
from specdec.serve.process import ServerProcess
from specdec.serve.replies import event_error, install_error_handlers
from specdec.serve.scheduler import ErrorEvent

METHOD = "logitspec"
MODEL = "smollm2-135m"
KEY = "test-key-123"
AUTH = {"Authorization": f"Bearer {KEY}"}
LIMIT = 4
CONTEXT = 8192  # SmolLM2's max_position_embeddings
CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
MAX_EXAMPLES = 15  # per operation and mode; generation requests cost up to LIMIT tokens each
USER = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def strict(tmp_path_factory) -> Iterator[ServerProcess]:
    args = ["--dtype", "fp32", "--method", METHOD, "--api-key", KEY, "--max-tokens-limit", str(LIMIT),
            "--max-queue", "4", "--log-level", "warning"]  # fmt: skip
    server = ServerProcess(args, tmp_path_factory.mktemp("strict") / "server.log").start()
    try:
        yield server.wait_ready()
    finally:
        server.stop()


def assert_openai_error(response: httpx.Response, status: int) -> dict:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["message"] and "Traceback" not in response.text
    return body["error"]


# ------------------------------------------------------------------ auth
@pytest.mark.parametrize(("method", "path"), [("GET", "/v1/models"), ("GET", "/metrics"),
                                              ("GET", "/openapi.json"), ("POST", CHAT), ("POST", COMPLETIONS)])  # fmt: skip
@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}])
def test_without_the_key_every_path_but_health_is_401(strict, method, path, headers):
    response = httpx.request(method, strict.url + path, headers=headers, json={"messages": USER}, timeout=30)
    assert assert_openai_error(response, 401)["code"] == "invalid_api_key"


def test_health_is_open_and_the_key_works(strict):
    assert httpx.get(strict.url + "/health", timeout=30).json()["status"] == "ok"
    assert httpx.get(strict.url + "/v1/models", headers=AUTH, timeout=30).json()["data"][0]["id"] == MODEL
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=strict.url + "/v1", api_key="wrong", max_retries=0).models.list()
    client = openai.OpenAI(base_url=strict.url + "/v1", api_key=KEY, timeout=120, max_retries=0)
    reply = client.chat.completions.create(model=MODEL, messages=USER, max_tokens=LIMIT, temperature=0)
    assert reply.usage.completion_tokens <= LIMIT and reply.choices[0].finish_reason in ("stop", "length")


# ------------------------------------------------------------------ invalid requests
def _bad_option() -> dict:
    """An option of the default method given a value of the wrong type."""
    for field in dataclasses.fields(method_config_class(METHOD)):
        if field.type in (int, "int", float, "float"):
            return {field.name: "not-a-number"}
    return {"no_such_option": 1}


INVALID = [
    (CHAT, {"messages": []}, 400, "messages"),
    (CHAT, {"max_tokens": 2}, 400, "messages"),
    (CHAT, {"messages": "hello"}, 400, "messages"),
    (CHAT, {"messages": [{"role": "wizard", "content": "hi"}]}, 400, "messages.0.role"),
    (CHAT, {"messages": USER, "max_tokens": -1}, 400, "max_tokens"),
    (CHAT, {"messages": USER, "max_tokens": 10**12}, 400, "max_tokens"),
    (CHAT, {"messages": USER, "max_tokens": "many"}, 400, "max_tokens"),
    (CHAT, {"messages": USER, "temperature": -0.5}, 400, "temperature"),
    (CHAT, {"messages": USER, "top_p": 0}, 400, "top_p"),
    (CHAT, {"messages": USER, "n": 2}, 400, "n"),
    (CHAT, {"messages": USER, "logprobs": True}, 400, "logprobs"),
    (CHAT, {"messages": USER, "stop": ["a", "b", "c", "d", "e"]}, 400, "stop"),
    (CHAT, {"messages": USER, "specdec": {"method": "no-such-method"}}, 400, "specdec.method"),
    (CHAT, {"messages": USER, "specdec": {"options": {"no_such_option": 1}}}, 400, "specdec.options"),
    (CHAT, {"messages": USER, "specdec": {"options": _bad_option()}}, 400, "specdec.options"),
    (CHAT, {"messages": USER, "model": "gpt-4"}, 404, "model"),
    (COMPLETIONS, {"prompt": [1] * CONTEXT}, 400, "prompt"),
    (COMPLETIONS, {"prompt": "   "}, 400, "prompt"),
    (COMPLETIONS, {"prompt": [10**9]}, 400, "prompt"),
    (COMPLETIONS, {"prompt": "hi", "echo": True}, 400, "echo"),
    (COMPLETIONS, ["not", "an", "object"], 400, None),
]


@pytest.mark.parametrize(("path", "body", "status", "param"), INVALID)
def test_invalid_requests_get_4xx_in_openai_shape(strict, path, body, status, param):
    response = httpx.post(strict.url + path, json=body, headers=AUTH, timeout=60)
    error = assert_openai_error(response, status)
    assert error["param"] == param or (param and (error["param"] or "").startswith(param))


@pytest.mark.parametrize(
    ("request_args", "status"),
    [
        ({"method": "POST", "url": CHAT, "content": b'{"messages": [', "headers": {"Content-Type": "application/json"}}, 400),
        ({"method": "POST", "url": CHAT, "content": b"x" * (2 << 20)}, 413),
        ({"method": "GET", "url": CHAT}, 405),
        ({"method": "GET", "url": "/v1/nothing"}, 404),
    ],
)  # fmt: skip
def test_malformed_http_gets_openai_shape(strict, request_args, status):
    args = dict(request_args)
    url = strict.url + args.pop("url")
    headers = {**AUTH, **args.pop("headers", {})}
    assert_openai_error(httpx.request(url=url, headers=headers, timeout=60, **args), status)


def test_internal_errors_become_500_without_details():
    assert event_error(ErrorEvent(RuntimeError("secret detail"))).status == 500
    assert "secret" not in event_error(ErrorEvent(RuntimeError("secret detail"))).message
    app = FastAPI()
    install_error_handlers(app)

    @app.get("/boom")
    async def boom() -> None:
        raise RuntimeError("secret detail at /home/someone")

    with TestClient(app, raise_server_exceptions=False) as client:
        response = client.get("/boom")
    assert response.status_code == 500
    assert response.json()["error"]["code"] == "internal_error" and "secret" not in response.text


# ------------------------------------------------------------------ schema fuzzing
@pytest.mark.parametrize("mode", list(GenerationMode), ids=lambda mode: mode.value)
def test_fuzz_the_openapi_schema(strict, mode):
    """Schema-valid (positive) and schema-breaking (negative) requests to every operation.

    All of schemathesis's response checks run (no 5xx, status codes, content types and bodies
    as documented, schema-breaking data refused) except `positive_data_acceptance`: some
    schema-valid requests are rightly refused for reasons a schema cannot express (a method
    option the chosen method does not have, a prompt longer than the context in tokens).
    """
    api_schema = schemathesis.openapi.from_url(strict.url + "/openapi.json", headers=AUTH, timeout=30)
    operations = [result.ok() for result in api_schema.get_all_operations()]
    assert {op.path for op in operations} >= {CHAT, COMPLETIONS, "/v1/models", "/health", "/metrics"}
    for operation in operations:
        if mode is GenerationMode.NEGATIVE and not list(operation.iter_parameters()) and not operation.body:
            continue  # nothing to break in a request without parameters or body

        @given(case=operation.as_strategy(generation_mode=mode))
        @settings(max_examples=MAX_EXAMPLES, deadline=None, derandomize=True, database=None,
                  suppress_health_check=list(HealthCheck))  # fmt: skip
        def call(case) -> None:
            case.call_and_validate(headers=AUTH, timeout=120, excluded_checks=[positive_data_acceptance])

        call()
    assert strict.process.poll() is None, strict.log_tail()
