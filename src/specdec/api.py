"""The one-call API: `specdec.generate(model, prompt, method=...)`.

A thin layer over `Engine` for the common case; loops that generate many times
(benchmarks, the server) keep one `Engine` and one proposer instead. A list of
prompts is decoded as a batch (`specdec.engine.loop`, up to `max_batch` rows per
forward pass) and gives one output per prompt, each equal to that prompt alone
in greedy decoding.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from specdec.engine.floor_store import remembered_floor
from specdec.engine.generation import GenerationConfig, GenerationOutput
from specdec.engine.loop import Engine, generate_batch
from specdec.models import LoadedModel
from specdec.prompts import Messages, encode_prompt
from specdec.proposers import make_config, parse_method
from specdec.sampling import SamplingParams


def generate(
    model: LoadedModel | Engine,
    prompt: str | Messages | list[str | Messages],
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
    max_batch: int = 8,
    **method_options: Any,
) -> GenerationOutput | list[GenerationOutput]:
    """Generate a reply to `prompt` with a speculative `method` (e.g. "logitspec:k=60" or "pld").

    A list of prompts (plain strings, or chats as lists of messages) gives a list of outputs, decoded
    `max_batch` at a time; `on_text` streams single prompts only.
    """
    if not isinstance(model, LoadedModel | Engine):  # a name or a path: loading is the caller's, once
        shown = f"{type(model).__name__} {model!r}" if isinstance(model, str) else type(model).__name__
        raise TypeError(f"model must be a loaded model (model = specdec.load_model(NAME_OR_PATH), once) or an Engine, "
                        f"got {shown}")
    engine = model if isinstance(model, Engine) else Engine(model, floor=remembered_floor(model))
    config = make_config(method, method_options) if method_options else parse_method(method)
    sampling = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, seed=seed)
    settings = GenerationConfig(max_new_tokens=max_new_tokens, sampling=sampling, stop=tuple(stop))
    if not _is_many(prompt):
        prompt_ids = encode_prompt(engine.tokenizer, prompt, chat=chat)
        return engine.generate(prompt_ids, config.build(engine.loaded), settings, on_text=on_text)
    if not prompt:
        raise ValueError("the list of prompts is empty")
    if on_text is not None:
        raise ValueError("on_text streams one prompt; a list of prompts returns its outputs")
    many = [encode_prompt(engine.tokenizer, p, chat=chat) for p in prompt]
    return generate_batch(
        engine, many, lambda: config.build(engine.loaded), settings, costs=engine.pass_costs(), max_batch=max_batch
    )


def _is_many(prompt: Any) -> bool:
    """A list of prompts, not one chat (a list of {"role", "content"} messages)."""
    return isinstance(prompt, list) and not (prompt and all(isinstance(m, dict) for m in prompt))
