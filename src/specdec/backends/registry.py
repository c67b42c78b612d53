"""Which engine verifies a loaded model's trees: one entry per backend name of `specdec.choices.BACKENDS`.

Why a module of its own: the engine (`specdec.engine.loop`) and the cost curve that sizes drafts
(`specdec.engine.costs`) must time and run the same verifier, and both pick it here from
`LoadedModel.backend`. Adding a backend: a name in `specdec.choices`, a module that gives a
`contract.Target` and its `contract.Rows`, and one entry in `_VERIFIERS` (tests/test_backends.py checks
that every declared name has one and that it keeps the contract).

Invariant: one llama.cpp context per loaded model (kept in its `state`), so every engine and cost
measurement of that model shares one KV memory and its sequence ids.
"""

from __future__ import annotations

from collections.abc import Callable

from specdec.backends.compiled import CompiledTarget
from specdec.backends.contract import Rows, Target
from specdec.backends.llamacpp import LlamaCppModel, LlamaCppTarget
from specdec.backends.torch.attention import AttentionPlan, resolve_plan
from specdec.backends.torch.packed import is_invariant, verify_model
from specdec.backends.torch.rows import BatchedTarget, OneSequence
from specdec.backends.torch.target import TargetModel
from specdec.models import LoadedModel


def llamacpp_model(loaded: LoadedModel) -> LlamaCppModel:
    """The llama.cpp context of `loaded` (made on first use)."""
    return loaded.state.shared("llamacpp", lambda: LlamaCppModel(loaded.gguf_path, loaded.model.config))


def _torch(loaded: LoadedModel, attention: str | AttentionPlan) -> Target:
    return TargetModel(verify_model(loaded), attention=resolve_plan(loaded, attention))


def _compiled(loaded: LoadedModel, attention: str | AttentionPlan) -> Target:
    return CompiledTarget(verify_model(loaded))


def _llamacpp(loaded: LoadedModel, attention: str | AttentionPlan) -> Target:
    return LlamaCppTarget(llamacpp_model(loaded), loaded.exact == "on")


# backend name -> the target it verifies on; `attention` applies to the torch pass only
_VERIFIERS: dict[str, Callable[[LoadedModel, str | AttentionPlan], Target]] = {
    "torch": _torch,
    "compiled": _compiled,
    "llamacpp": _llamacpp,
}


def verifier(loaded: LoadedModel, attention: str | AttentionPlan = "auto") -> Target:
    """What the engine verifies `loaded` on (its backend's `Target`); `rows_of` makes its rows."""
    return _VERIFIERS[loaded.backend](loaded, attention)


def rows_of(target: Target) -> Rows:
    """An empty set of batch rows verified on `target` (what `specdec.engine.loop.Batch` drives)."""
    if isinstance(target, LlamaCppTarget):
        return target.batched()
    if isinstance(target, TargetModel):
        return BatchedTarget(target, target.compiled if isinstance(target, CompiledTarget) else None)
    raise TypeError(f"no rows for a {type(target).__name__}")


def timing_target(loaded: LoadedModel) -> TargetModel | OneSequence:
    """A one-sequence target of its own (prefill, forward_tree, trim) on what the engine verifies with.
    The torch pass is timed with the model's own attention (measuring the attention plan needs the
    cost curve's sizes, not the other way round); where verification is exact, and on other backends,
    through one batch row of its own on the plan the engine runs: the engine's own path at every size
    (a one-node tree takes its one-token step, which a tree pass of one node would overprice)."""
    if _VERIFIERS[loaded.backend] is not _torch:
        target = verifier(loaded)
    elif is_invariant(loaded):
        target = TargetModel(verify_model(loaded), attention=AttentionPlan.invariant())
    else:
        return TargetModel(verify_model(loaded), attention=None)
    return OneSequence(rows_of(target), target.config, target.device, target.max_length)
