"""The one-call API: `specdec.generate(model, prompt, method=...)`.

A thin layer over `Engine` for the common case; loops that generate many times
(benchmarks, the server) keep one `Engine` and one proposer instead.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from specdec.engine import Engine, GenerationConfig, GenerationOutput
from specdec.models import LoadedModel
from specdec.prompts import Messages, encode_prompt
from specdec.proposers import make_config, parse_method
from specdec.sampling import SamplingParams


def generate(
    model: LoadedModel | Engine,
    prompt: str | Messages,
    method: str = "plain",
    *,
    max_new_tokens: int = 128,
    temperature: float = 0.0,
    top_k: int = 0,
    top_p: float = 1.0,
    seed: int | None = None,
    stop: Sequence[str] = (),
    chat: bool = False,
    on_text: Callable[[str], None] | None = None,
    **method_options: Any,
) -> GenerationOutput:
    """Generate a reply to `prompt` with a speculative `method` (e.g. "logitspec:k=60" or "pld")."""
    engine = model if isinstance(model, Engine) else Engine(model)
    config = make_config(method, method_options) if method_options else parse_method(method)
    proposer = config.build(engine.loaded)
    prompt_ids = encode_prompt(engine.tokenizer, prompt, chat=chat)
    sampling = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, seed=seed)
    settings = GenerationConfig(max_new_tokens=max_new_tokens, sampling=sampling, stop=tuple(stop))
    return engine.generate(prompt_ids, proposer, settings, on_text=on_text)
