"""The HTTP contract of `specdec serve`: request and response bodies as pydantic models.

Why apart from app.py: these models *are* the public API. FastAPI builds
/openapi.json from them, the tests fuzz the server from that schema, and the
official `openai` client must accept what comes back, so they are kept in one
reviewable place.

Invariants:
- fields OpenAI defines keep OpenAI's names, types and meanings (including
  OpenAI's default temperature of 1.0); everything specdec adds lives under the
  extra field `specdec`, plus `top_k` as in other OpenAI-compatible servers;
- the schema is honest: limits that depend on the served model (its name, the
  server's max_tokens limit, the vocabulary size) are written into the schema by
  `request_models`, and features specdec does not have (n > 1, logprobs,
  penalties, tools, echo, ...) are declared with the only value they accept, so a
  request the schema allows is refused only for reasons a schema cannot express
  (prompt longer than the context, a chat template that rejects the messages,
  a method option that its method refuses);
- unknown fields are ignored, as OpenAI clients send fields (`user`, metadata)
  that change nothing here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, Strict
from pydantic_core import PydanticCustomError

MAX_STOP_STRINGS = 4
MAX_STOP_CHARS = 256
MAX_METHOD_OPTIONS = 32
MAX_SEED = 2**64 - 1
MIN_SEED = -(2**63)



def _valid_unicode(text: str) -> str:
    """`text` if it can be encoded (JSON's \\ud800 escapes can carry lone surrogates, which no tokenizer takes)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        raise ValueError(f"the text is not valid Unicode: a lone surrogate at character {error.start}") from None
    return text


# Every text a request sends is checked to be valid Unicode here, so the refusal is ours, not a tokenizer's.
Text = Annotated[str, AfterValidator(_valid_unicode)]
NonEmptyText = Annotated[Text, Field(min_length=1, max_length=MAX_STOP_CHARS)]
OptionValue = Text | int | float | bool
PromptText = Annotated[Text, Field(pattern=r"\S", description="not blank")]
# Numbers and booleans are strict: pydantic's lax mode reads `true` as 1, `false` as 0, and `"yes"` or
# 1 as true, which the schema (number / integer / boolean) says is invalid (found by the schema fuzz
# test: `"frequency_penalty": false`; by a probe: `"stream": "yes"`).
Num = Annotated[float, Strict()]
Int = Annotated[int, Strict()]
Bool = Annotated[bool, Strict()]


def _strictly_bool(value: Any) -> Any:
    if not isinstance(value, bool):
        # Literal[False] alone takes 0 and 0.0; a custom error keeps pydantic's "Value error, " prefix off
        raise PydanticCustomError("bool_type", "Input should be a valid boolean")
    return value


def _only(accepted: Any, shown: str) -> BeforeValidator:
    """A feature specdec does not have: a value of the field's own type other than `accepted` is refused in those
    words, not as a bound ('less than or equal to 0'); a value of another type gets the type's own error. The
    schema still declares the one value it takes: in `Annotated`, the `Field` bounds come first, so they apply to
    the value (its schema's minimum and maximum) and this check wraps them."""

    def check(value: Any) -> Any:
        kind = type(accepted)
        if (type(value) is kind or (kind is float and type(value) is int)) and value != accepted:
            raise PydanticCustomError("not_supported", "not supported by specdec (only {only} is accepted)",
                                      {"only": shown})
        return value

    return BeforeValidator(check)


NotSupported = Annotated[Literal[False], BeforeValidator(_strictly_bool), _only(False, "false"),
                         Field(description="not supported")]
NoLogprobs = Annotated[Int, Field(ge=0, le=0, description="not supported: 0 only"), _only(0, "0")]
JustOne = Annotated[Int, Field(ge=1, le=1), _only(1, "1")]
NoPenalty = Annotated[Num, Field(ge=0.0, le=0.0), _only(0.0, "0")]
NoLogitBias = Annotated[dict[str, Num], Field(max_length=0), _only({}, "an empty object")]
NoTools = Annotated[list[dict[str, Any]], Field(max_length=0), _only([], "an empty list")]
OnePrompt = Annotated[list[PromptText], Field(min_length=1, max_length=1)]


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)


class SpecdecRequest(_Body):
    """Which speculative method serves this request (default: the server's --method)."""

    method: Text | None = Field(
        None, min_length=1, max_length=200, description="a registered method, optionally name:opt=value,..."
    )
    options: dict[str, OptionValue] = Field(
        default_factory=dict,
        max_length=MAX_METHOD_OPTIONS,
        description="the method's request options, on top of the method string's; each is bounded, and "
        "server-side options (paths, conversion, measurement, calibration) are refused with 400",
    )
    sources: Bool = Field(
        False,
        description="streaming: each text chunk carries specdec.source (its token's draft source, or "
        "'target'), specdec.step (the forward pass) and specdec.token (the token's index)",
    )


class StreamOptions(_Body):
    include_usage: Bool = False


class TextPart(_Body):
    type: Literal["text"]
    text: Text


class ChatMessage(_Body):
    role: Literal["system", "developer", "user", "assistant"]
    content: Text | list[TextPart]
    name: Text | None = None


@dataclass(frozen=True)
class SchemaLimits:
    """What the served model and the server's options allow; written into the schema."""

    model_name: str
    max_tokens: int
    vocab_size: int


def request_models(limits: SchemaLimits) -> tuple[type[BaseModel], type[BaseModel]]:
    """The (chat, completion) request models for one server, with its limits in the schema."""
    MaxTokens = Annotated[Int, Field(ge=1, le=limits.max_tokens)] | None
    model_field = Field(None, json_schema_extra={"enum": [limits.model_name]}, description="the served model")
    TokenId = Annotated[Int, Field(ge=0, lt=limits.vocab_size)]

    class CommonRequest(_Body):
        model: str | None = model_field
        max_tokens: MaxTokens = None
        temperature: Num = Field(1.0, ge=0.0, le=2.0, description="0 = greedy (so is < 1e-5)")
        top_p: Num = Field(1.0, gt=0.0, le=1.0)
        top_k: Int = Field(0, ge=0, le=limits.vocab_size, description="0 = off (extension)")
        seed: Int | None = Field(None, ge=MIN_SEED, le=MAX_SEED)
        stop: NonEmptyText | Annotated[list[NonEmptyText], Field(max_length=MAX_STOP_STRINGS)] | None = None
        n: JustOne | None = Field(None, description="only 1 is supported")
        stream: Bool = False
        stream_options: StreamOptions | None = None
        presence_penalty: NoPenalty | None = Field(None, description="not supported: 0 only")
        frequency_penalty: NoPenalty | None = Field(None, description="not supported: 0 only")
        logit_bias: NoLogitBias | None = Field(None, description="not supported")
        user: Text | None = None
        specdec: SpecdecRequest | None = None

    class ChatCompletionRequest(CommonRequest):
        messages: list[ChatMessage] = Field(min_length=1)
        max_completion_tokens: MaxTokens = None
        logprobs: NotSupported | None = None
        top_logprobs: NoLogprobs | None = None  # as logprobs: refused unless it asks for nothing
        tools: NoTools | None = Field(None, description="not supported")

    class CompletionRequest(CommonRequest):
        prompt: PromptText | Annotated[list[TokenId], Field(min_length=1)] | OnePrompt = Field(
            description="text, token ids, or a list holding one text"
        )
        logprobs: NoLogprobs | None = None
        echo: NotSupported = False
        best_of: JustOne | None = None
        suffix: Annotated[Literal[""], _only("", "an empty string")] | None = None

    return ChatCompletionRequest, CompletionRequest


# ------------------------------------------------------------------ responses (documentation)
class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorDetail


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class SpecdecStats(BaseModel):
    """The request's method and options; with `--expose-stats`, its decoding stats too (the engine's
    vocabulary; see DESIGN.md, Metrics), which are left out otherwise."""

    method: str
    options: dict[str, Any]
    mat: float | None = None
    num_forward_passes: int | None = None
    num_prompt_tokens: int | None = None
    num_new_tokens: int | None = None
    accepted_histogram: dict[str, int] | None = None
    acceptance_rate: float | None = None
    retrieval_success: float | None = None
    tokens_per_s: float | None = None
    wall_time_s: float | None = None
    prefill_s: float | None = None
    draft_time_s: float | None = None
    verify_time_s: float | None = None
    queue_time_s: float | None = None


class AssistantMessage(BaseModel):
    role: Literal["assistant"]
    content: str


class ChatChoice(BaseModel):
    index: int
    message: AssistantMessage
    finish_reason: Literal["stop", "length"]
    logprobs: None = None


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    specdec: SpecdecStats


class CompletionChoice(BaseModel):
    index: int
    text: str
    finish_reason: Literal["stop", "length"]
    logprobs: None = None


class Completion(BaseModel):
    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage
    specdec: SpecdecStats


class ModelCard(BaseModel):
    id: str
    object: Literal["model"]
    created: int
    owned_by: str


class ModelList(BaseModel):
    object: Literal["list"]
    data: list[ModelCard]


class Health(BaseModel):
    status: Literal["ok"]
    model: str
    waiting: int
    running: int


SSE_EVENT = {  # OpenAPI < 3.2: for text/event-stream, `schema` describes one event
    "type": "object",
    "properties": {
        "data": {"type": "string", "description": "a JSON chunk or error object, or [DONE] at the end"},
        "event": {"type": "string"},
    },
    "required": ["data"],
}
SSE_CONTENT = {"text/event-stream": {"schema": SSE_EVENT}}
ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorResponse, "description": why}
    for status, why in {
        400: "invalid request (OpenAI error shape)",
        401: "missing or wrong API key",
        403: "a client key on a path that needs the admin key (/metrics)",
        404: "unknown model",
        413: "request body too large",
        415: "the body is not JSON (Content-Type)",
        429: "the request queue is full",
        500: "internal error",
        503: "the server is shutting down",
    }.items()
}


def document_bearer_auth(app: Any, public_paths: frozenset[str]) -> None:
    """Declare `Authorization: Bearer` on every operation of `app`'s OpenAPI but the public paths."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        schema = build()
        schema.setdefault("components", {})["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
        for path, operations in schema["paths"].items():
            for operation in operations.values():
                if path not in public_paths:
                    operation["security"] = [{"bearer": []}]
        return schema

    app.openapi = openapi
