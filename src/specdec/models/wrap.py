"""A transformers model object the user already holds, wrapped as a `LoadedModel` as it is.

Why this module exists: a transformers user often has the model in memory
already (their dtype, device map, merged LoRA, own quantization) and should not
have to save it and reload it through specdec. `load_model(model, tokenizer=tok)`
lands here; `specdec.integrations.transformers_generate` wraps the model that
`model.generate(custom_generate=...)` hands it the same way.

Invariants:
- the model is used as it is: its dtype, device, weights, attention
  implementation, training flag and `requires_grad` are never changed here;
- what cannot be a speculative-decoding target is refused with an
  `UnsupportedModelError` naming the reason: an encoder-decoder model, a model
  whose forward takes no KV cache (`past_key_values`), a model in training mode
  (dropout would make verification disagree with itself), a non-causal model,
  and a tokenizer whose vocabulary holds ids the model's embedding lacks (the
  causal probe is `load_model`'s, run on every source).
"""

from __future__ import annotations

import inspect

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from specdec.models.base import LoadedModel, UnsupportedModelError


def model_name(model: torch.nn.Module) -> str:
    """The name a wrapped model goes by: where it was loaded from, else its class."""
    return str(getattr(model, "name_or_path", "") or type(model).__name__)


def check_wrappable(model: object, tokenizer: object) -> None:
    """Raise UnsupportedModelError unless `model` can be verified as it is and `tokenizer` matches it."""
    name = type(model).__name__
    if not isinstance(model, PreTrainedModel):
        raise UnsupportedModelError(
            f"load_model takes a name, a path or a transformers PreTrainedModel; got a {name}"
        )
    if getattr(model.config, "is_encoder_decoder", False):
        raise UnsupportedModelError(
            f"{name} is an encoder-decoder model; speculative decoding here needs a decoder-only causal LM"
        )
    if "past_key_values" not in inspect.signature(model.forward).parameters:
        raise UnsupportedModelError(
            f"{name}.forward takes no past_key_values: without a KV cache path it cannot verify drafts"
        )
    if model.training:
        raise UnsupportedModelError(f"{name} is in training mode: call model.eval() first (dropout breaks verification)")
    if not isinstance(tokenizer, PreTrainedTokenizerBase):
        raise UnsupportedModelError(
            f"a model object needs its tokenizer (load_model(model, tokenizer=tok)); got {type(tokenizer).__name__}"
        )
    num_embeddings = model.get_input_embeddings().num_embeddings
    if len(tokenizer) > num_embeddings:
        raise UnsupportedModelError(
            f"the tokenizer's vocabulary ({len(tokenizer)} tokens) does not match {name}'s embedding "
            f"({num_embeddings} rows): is it the model's own tokenizer?"
        )


def wrap_model(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, name: str | None = None) -> LoadedModel:
    """A LoadedModel around `model` and `tokenizer`, both untouched, after the checks above (`load_model`
    adds the causal probe every source gets)."""
    check_wrappable(model, tokenizer)
    return LoadedModel(model=model, tokenizer=tokenizer, name=name or model_name(model))
