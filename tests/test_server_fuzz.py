"""`specdec serve` against hostile clients, in process: API key, invalid requests, schema and method fuzzing.

One app per module (ASGI, no sockets) on the session's fp32 model, with an API
key and a small max_tokens limit so that every generated request is cheap.
What must hold (each test can fail):
- without the right `Authorization: Bearer KEY` every path but /health is 401,
  in OpenAI's error shape;
- every invalid request gets a 4xx whose body is exactly OpenAI's error shape
  with a clear message (never FastAPI's 422 body, never a traceback);
- fuzzing the server's own OpenAPI schema (schemathesis) finds no 5xx and no
  response that breaks the schema;
- fuzzing `specdec.method` and `specdec.options` (method names from the registry
  and junk, option names from the configs and junk, values of every JSON type)
  gets 200 or 4xx, never 5xx nor an error event in a stream; and whatever a
  request sends, it never changes a server-side option of its method;
- an internal error becomes a 500 in the same shape, without its details.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator

import openai
import pytest
import schemathesis
from fastapi import FastAPI
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.specs.openapi.checks import positive_data_acceptance
from starlette.testclient import TestClient
from starlette.types import ASGIApp, Receive, Scope, Send

from specdec.proposers import METHODS, method_config_class
from specdec.proposers.schema import OptionSpec
from specdec.serve.app import ServerConfig, create_app
from specdec.serve.keys import API_KEYS_ENV, gather_keys
from specdec.serve.options import REQUEST_OPTIONS, MethodSettings, RequestRefused
from specdec.serve.replies import event_error, install_error_handlers
from specdec.serve.scheduler import ErrorEvent

METHOD = "logitspec"
MODEL = "smollm2-135m"
KEY = "test-key-123"
AUTH = {"Authorization": f"Bearer {KEY}"}
ADMIN = {"Authorization": "Bearer admin-key-456"}
LIMIT = 4
CONTEXT = 8192  # SmolLM2's max_position_embeddings
CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
MAX_EXAMPLES = 15  # per operation and mode; generation requests cost up to LIMIT tokens each
USER = [{"role": "user", "content": "hi"}]
REPEATS = "one two three four " * 4  # repeated n-grams: retrieval methods find matches
SERVER = ServerConfig(
    method=METHOD,
    method_configs=("layerskip:skip=10+20",),
    api_keys=(KEY,),
    admin_keys=("admin-key-456",),
    max_tokens_limit=LIMIT,
    max_queue=4,
    log_level="warning",
)


@pytest.fixture(scope="module")
def http(default_model) -> Iterator[TestClient]:
    app = create_app(SERVER, default_model)
    with TestClient(app, raise_server_exceptions=False) as client:
        yield client
    assert not app.state.service.scheduler.worker_alive  # the lifespan stopped the worker


def assert_openai_error(response, status: int) -> dict:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["message"] and "Traceback" not in response.text
    return body["error"]


# ------------------------------------------------------------------ auth
@pytest.mark.parametrize(("method", "path"), [("GET", "/v1/models"), ("GET", "/metrics"),
                                              ("GET", "/openapi.json"), ("POST", CHAT), ("POST", COMPLETIONS)])  # fmt: skip
@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}])
def test_without_the_key_every_path_but_health_is_401(http, method, path, headers):
    response = http.request(method, path, headers=headers, json={"messages": USER})
    assert assert_openai_error(response, 401)["code"] == "invalid_api_key"


def test_metrics_need_the_admin_key_and_the_admin_key_opens_nothing_else(http):
    refused = assert_openai_error(http.get("/metrics", headers=AUTH), 403)  # a client key: not the totals
    assert refused["code"] == "admin_key_required"
    assert http.get("/metrics", headers=ADMIN).status_code == 200
    assert assert_openai_error(http.get("/v1/models", headers=ADMIN), 401)["code"] == "invalid_api_key"


def test_every_response_carries_a_request_id_and_health_answers_head(http):
    assert http.get("/health", headers={"X-Request-Id": "abc-123"}).headers["x-request-id"] == "abc-123"
    generated = http.get("/v1/models").headers["x-request-id"]  # a refusal has one too
    assert len(generated) == 32 and generated != http.get("/health").headers["x-request-id"]
    assert http.get("/health", headers={"X-Request-Id": "a b\tc"}).headers["x-request-id"] != "a b\tc"
    head = http.head("/health")
    assert head.status_code == 200 and head.content == b""


def test_keys_come_from_the_command_line_a_file_and_the_environment(tmp_path):
    path = tmp_path / "keys"
    path.write_text("# one a line\nfile-key-1\n\n  file-key-2  \ncli-key\n")
    environ = {API_KEYS_ENV: "env-key-1, env-key-2 file-key-1"}
    keys = gather_keys(["cli-key"], path, environ, API_KEYS_ENV)
    assert keys == ("cli-key", "file-key-1", "file-key-2", "env-key-1", "env-key-2")
    assert gather_keys([], None, {}, API_KEYS_ENV) == ()
    with pytest.raises(OSError):
        gather_keys([], tmp_path / "missing", {}, API_KEYS_ENV)


def test_health_is_open_and_the_key_works(http):
    assert http.get("/health").json()["status"] == "ok"
    assert http.get("/v1/models", headers=AUTH).json()["data"][0]["id"] == MODEL
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url="http://testserver/v1", api_key="wrong", http_client=http, max_retries=0).models.list()
    client = openai.OpenAI(base_url="http://testserver/v1", api_key=KEY, http_client=http, max_retries=0)
    reply = client.chat.completions.create(model=MODEL, messages=USER, max_tokens=LIMIT, temperature=0)
    assert reply.usage.completion_tokens <= LIMIT and reply.choices[0].finish_reason in ("stop", "length")


# ------------------------------------------------------------------ invalid requests
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
    (CHAT, {"messages": USER, "logprobs": 0}, 400, "logprobs"),  # a number is not a boolean
    (CHAT, {"messages": USER, "top_logprobs": 2}, 400, "top_logprobs"),  # refused as logprobs is
    (CHAT, {"messages": USER, "top_logprobs": 0, "logprobs": False}, 200, None),
    (CHAT, {"messages": USER, "stream": "yes"}, 400, "stream"),  # a string is not a boolean
    (CHAT, {"messages": USER, "stream": 1}, 400, "stream"),
    (CHAT, {"messages": USER, "stream": True, "stream_options": {"include_usage": "true"}}, 400,
     "stream_options.include_usage"),
    (CHAT, {"messages": USER, "stop": ["a", "b", "c", "d", "e"]}, 400, "stop"),
    (CHAT, {"messages": USER, "specdec": {"method": "no-such-method"}}, 400, "specdec.method"),
    (CHAT, {"messages": USER, "specdec": {"method": "logitspec:"}}, 200, None),
    (CHAT, {"messages": USER, "specdec": {"method": "logitspec:k"}}, 400, "specdec.method"),
    (CHAT, {"messages": USER, "specdec": {"options": {"no_such_option": 1}}}, 400, "specdec.options"),
    (CHAT, {"messages": USER, "specdec": {"options": {"k": "not-a-number"}}}, 400, "specdec.options"),
    (CHAT, {"messages": USER, "specdec": {"options": {"k": [1]}}}, 400, "specdec.options"),
    (CHAT, {"messages": USER, "specdec": {"options": {"k": None}}}, 400, "specdec.options"),
    (CHAT, {"messages": USER, "specdec": {"method": "draft", "options": {"draft_model": "/etc"}}}, 400,
     "specdec.options"),
    (CHAT, {"messages": USER, "specdec": {"method": "draft"}}, 400, "specdec.method"),
    (CHAT, {"messages": USER, "specdec": {"method": "logitspec:budget=1000"}}, 400, "specdec.method"),
    (CHAT, {"messages": USER, "model": "gpt-4"}, 404, "model"),
    (COMPLETIONS, {"prompt": [1] * CONTEXT}, 400, "prompt"),
    (COMPLETIONS, {"prompt": "   "}, 400, "prompt"),
    (COMPLETIONS, {"prompt": [10**9]}, 400, "prompt"),
    (COMPLETIONS, {"prompt": "hi", "echo": True}, 400, "echo"),
    (COMPLETIONS, {"prompt": "hi", "echo": 0}, 400, "echo"),
    (COMPLETIONS, {"prompt": "hi", "logprobs": False}, 400, "logprobs"),
    (COMPLETIONS, ["not", "an", "object"], 400, None),
]  # fmt: skip


@pytest.mark.parametrize(("path", "body", "status", "param"), INVALID)
def test_invalid_requests_get_4xx_in_openai_shape(http, path, body, status, param):
    response = http.post(path, json=body, headers=AUTH)
    if status == 200:  # a control: the neighbouring refusals are not refusing everything
        assert response.status_code == 200, response.text
        return
    error = assert_openai_error(response, status)
    assert error["param"] == param or (param and (error["param"] or "").startswith(param))


# A feature specdec does not have is refused in those words, naming the one value it takes (the schema declares it);
# a value of the wrong type still gets the type's own error.
UNSUPPORTED = [
    (CHAT, {"messages": USER, "logprobs": True}, "logprobs", "false"),
    (CHAT, {"messages": USER, "top_logprobs": 2}, "top_logprobs", "0"),
    (CHAT, {"messages": USER, "n": 2}, "n", "1"),
    (CHAT, {"messages": USER, "presence_penalty": 0.5}, "presence_penalty", "0"),
    (CHAT, {"messages": USER, "logit_bias": {"50256": -100}}, "logit_bias", "an empty object"),
    (CHAT, {"messages": USER, "tools": [{"type": "function"}]}, "tools", "an empty list"),
    (COMPLETIONS, {"prompt": "hi", "logprobs": 3}, "logprobs", "0"),
    (COMPLETIONS, {"prompt": "hi", "echo": True}, "echo", "false"),
    (COMPLETIONS, {"prompt": "hi", "best_of": 2}, "best_of", "1"),
    (COMPLETIONS, {"prompt": "hi", "suffix": "end"}, "suffix", "an empty string"),
]  # fmt: skip


@pytest.mark.parametrize(("path", "body", "param", "only"), UNSUPPORTED)
def test_a_feature_specdec_lacks_is_refused_as_such(http, path, body, param, only):
    error = assert_openai_error(http.post(path, json=body, headers=AUTH), 400)
    assert (error["param"], error["message"]) == (param, f"{param}: not supported by specdec (only {only} is accepted)")


def test_a_wrong_type_for_a_missing_feature_is_a_type_error(http):
    error = assert_openai_error(http.post(CHAT, json={"messages": USER, "logprobs": 0}, headers=AUTH), 400)
    assert error["message"] == "logprobs: Input should be a valid boolean"
    error = assert_openai_error(http.post(COMPLETIONS, json={"prompt": "hi", "logprobs": False}, headers=AUTH), 400)
    assert error["message"] == "logprobs: Input should be a valid integer"


@pytest.mark.parametrize(
    ("request_args", "status"),
    [
        ({"method": "POST", "url": CHAT, "content": b'{"messages": [', "headers": {"Content-Type": "application/json"}}, 400),
        ({"method": "POST", "url": CHAT, "content": b"x" * (2 << 20)}, 413),
        ({"method": "GET", "url": CHAT}, 405),
        ({"method": "POST", "url": CHAT, "content": json.dumps({"messages": USER}).encode(),
          "headers": {"Content-Type": "text/plain"}}, 415),
        ({"method": "POST", "url": CHAT, "data": {"messages": "hi"}}, 415),  # a form, as curl -d sends
        ({"method": "GET", "url": "/v1/nothing"}, 404),
    ],
)  # fmt: skip
def test_malformed_http_gets_openai_shape(http, request_args, status):
    args = dict(request_args)
    headers = {**AUTH, **args.pop("headers", {})}
    error = assert_openai_error(http.request(headers=headers, **args), status)
    if status == 415:
        assert error["message"].startswith("expected application/json")


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        (CHAT, '{"messages": [{"role": "user", "content": "a\\ud800b"}]}', "messages.0.content"),
        (CHAT, '{"messages": [{"role": "user", "content": [{"type": "text", "text": "\\udc00"}]}]}',
         "messages.0.content"),
        (COMPLETIONS, '{"prompt": "a\\ud800b"}', "prompt"),
        (COMPLETIONS, '{"prompt": "hi", "stop": "\\ud800"}', "stop"),
    ],
)  # fmt: skip
def test_invalid_text_is_refused_with_our_own_message(http, path, body, param):
    """A lone surrogate (JSON may escape one) reached the tokenizer, whose internal message came back."""
    headers = {**AUTH, "Content-Type": "application/json"}
    error = assert_openai_error(http.post(path, content=body.encode(), headers=headers), 400)
    assert error["param"] == param and "not valid Unicode" in error["message"], error


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
def without_lifespan(app: ASGIApp) -> ASGIApp:
    """`app` for schemathesis, whose ASGI client runs lifespans of its own: the module's
    TestClient already runs this app's (its decode worker starts once), so this one only answers."""

    async def asgi(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "lifespan":
            await app(scope, receive, send)
            return
        while True:
            phase = (await receive())["type"].rsplit(".", 1)[-1]  # startup | shutdown
            await send({"type": f"lifespan.{phase}.complete"})
            if phase == "shutdown":
                return

    return asgi


@pytest.mark.slow
@pytest.mark.parametrize("mode", list(GenerationMode), ids=lambda mode: mode.value)
def test_fuzz_the_openapi_schema(http, mode):
    """Schema-valid (positive) and schema-breaking (negative) requests to every operation.

    All of schemathesis's response checks run (no 5xx, status codes, content types and bodies
    as documented, schema-breaking data refused) except `positive_data_acceptance`: some
    schema-valid requests are rightly refused for reasons a schema cannot express (a method
    option the chosen method does not have, a prompt longer than the context in tokens).
    """
    api_schema = schemathesis.openapi.from_asgi("/openapi.json", without_lifespan(http.app), headers=AUTH)
    operations = [result.ok() for result in api_schema.get_all_operations()]
    assert {op.path for op in operations} >= {CHAT, COMPLETIONS, "/v1/models", "/health", "/metrics"}
    for operation in operations:
        if mode is GenerationMode.NEGATIVE and not list(operation.iter_parameters()) and not operation.body:
            continue  # nothing to break in a request without parameters or body

        @given(case=operation.as_strategy(generation_mode=mode))
        @settings(max_examples=MAX_EXAMPLES, deadline=None, derandomize=True, database=None,
                  suppress_health_check=list(HealthCheck))  # fmt: skip
        def call(case) -> None:
            case.call_and_validate(headers=AUTH, excluded_checks=[positive_data_acceptance])

        call()
    assert http.app.state.service.scheduler.worker_alive


# ------------------------------------------------------------------ method and option fuzzing
FIELDS = sorted({field.name for name in METHODS for field in dataclasses.fields(method_config_class(name))})
OPTION_NAMES = st.sampled_from(FIELDS) | st.text(max_size=12)
OPTION_VALUES = (
    st.integers(-(10**20), 10**20)
    | st.integers(-2, 70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.booleans()
    | st.none()
    | st.text(max_size=12)
    | st.sampled_from(["/etc", "../..", "1e9", "true", "0", "-1", "3", "latest", "int8", "timed", "4+6"])
    | st.lists(st.integers(), max_size=2)
)
METHOD_NAMES = st.sampled_from(sorted(METHODS)) | st.text(max_size=10)
STRING_OPTIONS = st.lists(st.tuples(OPTION_NAMES, st.text(max_size=8) | st.integers(-2, 70).map(str)), max_size=3)
METHOD_STRINGS = st.one_of(
    st.none(),
    st.sampled_from(sorted(METHODS)),
    st.builds(lambda name, pairs: name + ":" + ",".join(f"{k}={v}" for k, v in pairs), METHOD_NAMES, STRING_OPTIONS),
    st.text(max_size=30),
)
OPTIONS = st.dictionaries(OPTION_NAMES, OPTION_VALUES, max_size=4)


def near_bounds(spec: OptionSpec) -> st.SearchStrategy:
    """Values at, inside and just outside one allowed option's bounds (a request's), typed or as strings."""
    if spec.choices:
        return st.sampled_from([*spec.choices, "bogus"])
    if spec.kind is bool:
        return st.booleans() | st.sampled_from(["yes", "no", "maybe"])
    low, high = spec.low[1], spec.request_max
    if spec.kind is int:
        values = st.integers(low - 1, high + 1)
        return values | values.map(str)
    return st.floats(low - 0.5, high + 0.5)


@st.composite
def near_valid(draw: st.DrawFn) -> tuple[str, dict]:
    """A registered method with a few of its request options, mostly in bounds, some in the string."""
    name = draw(st.sampled_from(sorted(METHODS)))
    allowed = REQUEST_OPTIONS[name]
    keys = draw(st.lists(st.sampled_from(sorted(allowed)), max_size=3, unique=True)) if allowed else []
    options = {key: draw(near_bounds(allowed[key])) for key in keys}
    in_string = {key: value for key, value in options.items() if isinstance(value, str) and draw(st.booleans())}
    spec = name + ":" + ",".join(f"{key}={value}" for key, value in in_string.items())
    return spec, {key: value for key, value in options.items() if key not in in_string}


SPECDEC_FIELDS = near_valid() | st.tuples(METHOD_STRINGS, OPTIONS)


@pytest.mark.slow
@given(fields=SPECDEC_FIELDS, stream=st.booleans(), temperature=st.sampled_from([0.0, 0.8]))
@settings(max_examples=50, deadline=None, database=None, suppress_health_check=list(HealthCheck))
def test_fuzzed_methods_and_options_get_200_or_4xx(http, fields, stream, temperature):
    method, options = fields
    specdec = {"options": options, **({"method": method} if method is not None else {})}
    body = {"prompt": REPEATS, "max_tokens": LIMIT, "temperature": temperature, "stream": stream, "specdec": specdec}
    response = http.post(COMPLETIONS, json=body, headers=AUTH)
    event(f"status {response.status_code}")
    if response.status_code != 200:
        error = assert_openai_error(response, response.status_code)
        assert 400 <= response.status_code < 500 and error["type"] == "invalid_request_error", response.text
        return
    if stream:
        events = [line[6:] for line in response.text.splitlines() if line.startswith("data: ")]
        assert events[-1] == "[DONE]" and "error" not in json.loads(events[-2]), response.text
    else:
        assert response.json()["specdec"]["method"] in METHODS


SETTINGS = MethodSettings.from_specs("logitspec:budget=16", ["draft:draft_model=some-draft,cache_dir=/srv/cache"])


@pytest.mark.slow
@given(method=METHOD_STRINGS | st.builds(lambda pair: pair[0], near_valid()), options=OPTIONS)
@settings(max_examples=300, deadline=None, database=None, suppress_health_check=list(HealthCheck))
def test_fuzzed_requests_never_change_a_server_side_option(method, options):
    try:
        resolved = SETTINGS.resolve(method, options)
    except RequestRefused as error:
        assert error.param in ("specdec.method", "specdec.options") and str(error)
        return
    server = SETTINGS.server_config(resolved.name)
    for field in dataclasses.fields(server):
        if field.name not in REQUEST_OPTIONS[resolved.name]:
            assert getattr(resolved.config, field.name) == getattr(server, field.name), field.name
