"""Which engine verifies a loaded model's trees: transformers on PyTorch (eager or compiled), or llama.cpp.

Why a module of its own: the engine (`specdec.engine`) and the cost curve that
sizes drafts (`proposers.budget`) must time and run the same verifier, and both
pick it from `LoadedModel.backend` here. Invariant: one llama.cpp context per
loaded model (kept in its `state`), so every engine and cost measurement of
that model shares one KV memory and its sequence ids.
"""

from __future__ import annotations

from specdec.attention import AttentionPlan, resolve_plan
from specdec.batching.target import BatchedTarget, OneSequence
from specdec.compiled import CompiledTarget
from specdec.llamacpp import LlamaCppBatch, LlamaCppModel, LlamaCppTarget
from specdec.models import LoadedModel
from specdec.packed import verify_model
from specdec.target import TargetModel


def llamacpp_model(loaded: LoadedModel) -> LlamaCppModel:
    """The llama.cpp context of `loaded` (made on first use)."""
    return loaded.state.shared("llamacpp", lambda: LlamaCppModel(loaded.gguf_path, loaded.model.config))


def verifier(loaded: LoadedModel, attention: str | AttentionPlan = "auto") -> TargetModel | LlamaCppTarget:
    """What the engine verifies on: a `TargetModel` on `verify_model(loaded)`, or the llama.cpp context.
    Both give `max_length`, `config` and `device`; `rows_of` makes a `Batch`'s rows on either."""
    if loaded.backend == "llamacpp":
        return LlamaCppTarget(llamacpp_model(loaded), loaded.exact == "on")
    if loaded.backend == "compiled":
        return CompiledTarget(verify_model(loaded))
    return TargetModel(verify_model(loaded), attention=resolve_plan(loaded, attention))


def timing_target(loaded: LoadedModel) -> TargetModel | OneSequence:
    """A one-sequence target of its own (prefill, forward_tree, trim) on what the engine verifies with."""
    if loaded.backend == "torch":
        return TargetModel(verify_model(loaded))
    target = verifier(loaded)
    return OneSequence(rows_of(target), target.config, target.device, target.max_length)


def rows_of(target: TargetModel | LlamaCppTarget) -> BatchedTarget | LlamaCppBatch:
    """An empty set of batch rows verified on `target` (what `specdec.engine.Batch` drives)."""
    if isinstance(target, LlamaCppTarget):
        return target.batched()
    return BatchedTarget(target, target.compiled if isinstance(target, CompiledTarget) else None)
