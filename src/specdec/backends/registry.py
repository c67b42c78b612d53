"""Which engine verifies a loaded model's trees, and what else the layers above may ask of a backend.

Why a module of its own: the engine (`specdec.engine.loop`) and the cost curve that sizes drafts
(`specdec.engine.costs`) must time and run the same verifier, and both pick it here from
`LoadedModel.backend`. Adding a backend: a name in `specdec.choices`, a module that gives a
`contract.Target` and its `contract.Rows`, and one entry in `_VERIFIERS` (tests/test_backends.py checks
that every declared name has one and that it keeps the contract).

It is also the boundary: nothing outside `specdec.backends` imports a backend's own modules
(tests/test_imports.py checks it). What the engine, proposers and applications need to know of a
backend (is its pass exact, may a tree go through it as drafted, which module a draft runs on) is a
capability function here, dispatched on the backend where the answer differs; the few torch helpers
drafting and greedy acceptance use (`head_logits`, `top_tokens`, `argmax_rows`, `greedy_walk`, the attention plans,
`GraphedCall` for a head's step and the graphs' `bucket`) are re-exported as they are.

Invariant: one llama.cpp context per loaded model (kept in its `state`), so every engine and cost
measurement of that model shares one KV memory and its sequence ids.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from transformers import PreTrainedModel

from specdec.backends.compiled import CompiledTarget
from specdec.backends.contract import Rows, Target
from specdec.backends.llamacpp import LlamaCppModel, LlamaCppTarget
from specdec.backends.timing_cache import contended, cost_file, cost_key, write_json_atomic
from specdec.backends.torch import explain as torch_explain
from specdec.backends.torch.attention import AttentionPlan, resolve_plan
from specdec.backends.torch.draft_runner import GraphedSequence, SequencePool
from specdec.backends.torch.graphed_call import GraphedCall
from specdec.backends.torch.graphs import GraphedTarget, bucket, bucket_sizes
from specdec.backends.torch.invariant import verifiable
from specdec.backends.torch.packed import (
    PackedLinear,
    is_invariant,
    maybe_packed,
    pack_of,
    rounded_products,
    verify_model,
    wants_packing,
)
from specdec.backends.torch.prompt_cache import DEFAULT_MAX_BYTES
from specdec.backends.torch.rows import BatchedTarget, OneSequence
from specdec.backends.torch.target import FAST_HEAD_TYPES, TargetModel, head_logits
from specdec.backends.torch.top_tokens import argmax_rows, greedy_walk, top_tokens
from specdec.choices import BACKENDS
from specdec.kernels import q4_kernel
from specdec.kernels.q4_kernel import block_head_rows
from specdec.models import LoadedModel
from specdec.models import load_model as load_source
from specdec.tree import DraftTree

__all__ = [
    "load_model",
    # verifiers
    "AttentionPlan", "Timed", "llamacpp_model", "verifier", "rows_of", "timing_target", "padded_sizes",
    # capabilities
    "verifies_exactly", "verifies_on_int4", "verifiable_tree", "scores_every_position",
    "sequence_runner", "draft_runner", "SequencePool", "runs_graphed", "verify_model", "pack_draft", "separable_head",
    "block_head_rows", "describe_path", "path_line",
    # torch helpers for drafting, and the cost curves' cache (`timing_cache`), as they are
    "head_logits", "on_blocks", "top_tokens", "argmax_rows", "greedy_walk", "GraphedCall", "bucket",
    "contended", "cost_file", "cost_key", "write_json_atomic",
]

Timed = TargetModel | OneSequence  # prefill, forward_tree, trim on a sequence of its own (`timing_target`)


def load_model(*args: Any, **kwargs: Any) -> LoadedModel:
    """`specdec.models.load_model` (same arguments), with dtype "auto" also settled by what the backends run
    here: on a CPU without native bf16, a GGUF source stays in bf16 where the fused exact 4-bit pass runs it
    (`verifies_on_int4`; models cannot ask the backends, so the question is passed down). What
    `specdec.load_model`, the CLI, the server, the demo and the bench load with."""
    return load_source(*args, fused_bf16=verifies_on_int4, **kwargs)


def llamacpp_model(loaded: LoadedModel) -> LlamaCppModel:
    """The llama.cpp context of `loaded` (made on first use)."""
    return loaded.state.shared("llamacpp", lambda: LlamaCppModel(loaded.gguf_path, loaded.model.config))


def _torch(loaded: LoadedModel, attention: str | AttentionPlan) -> Target:
    if loaded.device.type == "cuda":  # launch-bound eager: passes replay as CUDA graphs (`torch.graphs`)
        return GraphedTarget(verify_model(loaded))
    return TargetModel(verify_model(loaded), attention=resolve_plan(loaded, attention))


def _compiled(loaded: LoadedModel, attention: str | AttentionPlan) -> Target:
    if loaded.device.type == "cuda":  # inductor's fused kernels, replayed as CUDA graphs
        return GraphedTarget(verify_model(loaded), inductor="dynamic")
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


def rows_of(target: Target, keep_prompts: bool = True) -> Rows:
    """An empty set of batch rows verified on `target` (what `specdec.engine.batch.Batch` drives). keep_prompts:
    the torch rows keep whole-prompt prefills for the same prompt again (`prompt_cache`); llama.cpp's keep none."""
    if isinstance(target, LlamaCppTarget):
        return target.batched()
    if isinstance(target, TargetModel):
        compiled = target.compiled if isinstance(target, CompiledTarget) else None
        graphed = target.graphed if isinstance(target, GraphedTarget) else None
        return BatchedTarget(target, compiled, graphed, prompt_bytes=DEFAULT_MAX_BYTES if keep_prompts else 0)
    raise TypeError(f"no rows for a {type(target).__name__}")


def timing_target(loaded: LoadedModel) -> Timed:
    """A one-sequence target of its own (prefill, forward_tree, trim) on what the engine verifies with.
    The torch pass is timed with the model's own attention (measuring the attention plan needs the
    cost curve's sizes, not the other way round); where verification is exact, and on other backends,
    through one batch row of its own on the plan the engine runs: the engine's own path at every size
    (a one-node tree takes its one-token step, which a tree pass of one node would overprice)."""
    if _VERIFIERS[loaded.backend] is not _torch or loaded.device.type == "cuda":
        target = verifier(loaded)
    elif is_invariant(loaded):
        target = TargetModel(verify_model(loaded), attention=AttentionPlan.invariant())
    else:
        return TargetModel(verify_model(loaded), attention=None)
    return OneSequence(rows_of(target), target.config, target.device, target.max_length)


def padded_sizes(loaded: LoadedModel, sizes: Sequence[int]) -> tuple[int, ...] | None:
    """Where every verification pass of `loaded` runs padded to a bucket (a GPU's graphs, `torch.graphs`):
    the buckets `sizes` fall in, the tree sizes the cost curve is to be timed at (a pass between two costs
    the larger); None where a pass runs at its own size."""
    if loaded.device.type != "cuda" or _VERIFIERS[loaded.backend] not in (_torch, _compiled):
        return None
    return bucket_sizes(sizes)


# ------------------------------------------------------------------ capabilities
def verifies_exactly(loaded: LoadedModel) -> bool:
    """Whether the engine verifies `loaded` exactly: each row's logits bit-identical whatever shares its pass.

    A GGUF backend (llama.cpp) holds exactness in its own engine: on when `loaded.exact` is "on". The
    torch passes (eager, compiled) answer from dtype, device, packing and `loaded.exact`
    (`torch.packed.is_invariant`), and raise ValueError where `exact="on"` cannot hold."""
    if BACKENDS[loaded.backend].gguf:
        return loaded.exact == "on"
    return is_invariant(loaded)


def verifies_on_int4(loaded: LoadedModel) -> bool:
    """Whether the torch pass verifies `loaded` on 4-bit weights batch-invariantly (the fused pass:
    specdec's block and attention kernels, one C++ call a pass); a draft beside such a target may run
    the same pass (`specdec.proposers.draft`)."""
    return pack_of(loaded) == "int4" and is_invariant(loaded)


def verifiable_tree(rows: Rows, tree: DraftTree) -> DraftTree:
    """`tree` as `rows` can verify it. The torch pass on its invariant plan cannot read every node
    invariantly and drops those (and their descendants: `torch.invariant.verifiable`), which verifies
    to the same text; every other pass (not invariant, or llama.cpp's) takes the tree as drafted."""
    if isinstance(rows, BatchedTarget) and rows.invariant:
        return verifiable(tree)
    return tree


def scores_every_position(target: Target) -> bool:
    """Whether `target` returns the logits of every position it is fed (`reset`, then `append`): the
    torch targets (eager and compiled, the transformers model) do; llama.cpp's does not."""
    return isinstance(target, TargetModel)


def sequence_runner(module: torch.nn.Module, attention: AttentionPlan | None = None) -> TargetModel:
    """A torch module run as one sequence with a KV cache of its own (`prefill`, `append`, `forward_tree`,
    `trim`, `reset`): a draft's runner, or a target timed or read apart from any engine. `attention`:
    the plan its passes run on, None for the model's own."""
    return TargetModel(module, attention=attention)


def draft_runner(module: torch.nn.Module, attention: AttentionPlan | None = None) -> TargetModel | GraphedSequence:
    """A draft's own sequence: on CUDA (the model's plan unchanged) its passes replay as CUDA graphs
    (`torch.draft_runner`: an eager draft pass is launch-bound there), else `sequence_runner`'s."""
    if runs_graphed(module) and attention is None:
        return GraphedSequence(module)
    return sequence_runner(module, attention)


def runs_graphed(module: torch.nn.Module) -> bool:
    """Whether `draft_runner` replays `module`'s passes as graphs: a transformers model (every position's
    logits, not a last-row view such as layerskip's) with its weights on CUDA."""
    return isinstance(module, PreTrainedModel) and next(module.parameters()).device.type == "cuda"


def pack_draft(module: torch.nn.Module, loaded: LoadedModel) -> torch.nn.Module:
    """A draft `module` (no `LoadedModel` holds it) with its Linear weights packed as `loaded`'s are
    (`loaded.pack`), so its pass costs what its parameter count says beside the target's; the view is
    the caller's own, `module` itself where packing does not apply."""
    return maybe_packed(module, loaded.pack, None)


def block_linear(linear: torch.nn.Linear) -> torch.nn.Module:
    """`linear` on 8-bit blocks (Q8_0, `q4_kernel.Q8Linear`) where the C++ kernel runs it (CPU weights, K a
    multiple of 32), else `linear` itself. For drafting heads' small products: in bf16 each reads twice
    the bytes and costs more to start than to multiply. Its output is x's dtype (fp32 or bf16)."""
    fits = linear.weight.device.type == "cpu" and linear.in_features % q4_kernel.BLOCK == 0
    return q4_kernel.Q8Linear.from_linear(linear) if fits and q4_kernel.load_extension() else linear


def on_blocks(module: torch.nn.Module) -> torch.nn.Module:
    """Every `Linear` inside `module` replaced by its `block_linear` (in place); returns `module`. For a
    drafting head's products (Medusa's, Hydra's, EAGLE's): the drafts change a little, never the output."""
    for parent in list(module.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, torch.nn.Linear):
                setattr(parent, name, block_linear(child))
    return module


def separable_head(model: torch.nn.Module) -> torch.nn.Module | None:
    """`model`'s output head where its logits are exactly head(decoder(...).last_hidden_state) (a model
    type in `FAST_HEAD_TYPES` with a Linear or packed Linear head), so the head may run outside the
    model on the rows the caller keeps; else None."""
    if model.config.model_type not in FAST_HEAD_TYPES:
        return None
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    return head if isinstance(head, (torch.nn.Linear, PackedLinear)) else None


def describe_path(loaded: LoadedModel) -> dict[str, object]:
    """What decodes `loaded` on this machine, every `auto` settled: backend, device, dtype, weights (`pack`),
    exact verification, the fused layer, the C++ kernels' paths (`q4_kernel.kernels_in_use`: the block
    products' and the fused layer's, e.g. `avx512_vnni+avx512_bf16`; None where the extension is not loaded in
    this process) and, on a GPU, how passes run. What `--stats`, the demo and
    the bench manifest show, so nobody has to guess which path ran."""
    device = loaded.device
    dtype = str(loaded.dtype).removeprefix("torch.")
    if BACKENDS[loaded.backend].gguf:
        weights = f"the GGUF's ({loaded.gguf_path.name})"
    else:
        pack = pack_of(loaded)
        weights = "int4" if pack == "int4" else f"{dtype} packed" if wants_packing(pack, loaded.model) else dtype
        moved, total = rounded_products(verify_model(loaded)) if pack == "int4" else (0, 0)
        weights += f" ({moved} of {total} products re-quantized: not the weights loaded)" if moved else ""
    path: dict[str, object] = {
        "backend": loaded.backend, "device": str(device), "dtype": dtype, "weights": weights,
        "exact": verifies_exactly(loaded), "fused_layer": verifies_on_int4(loaded),
        "kernels": q4_kernel.kernels_in_use() if weights.startswith("int4") else None,
    }
    if device.type == "cuda":
        path["gpu"] = torch.cuda.get_device_name(device)
        path["passes"] = "cuda-graphs+inductor" if loaded.backend == "compiled" else "cuda-graphs"
    return path


def path_line(loaded: LoadedModel) -> str:
    """`describe_path` as one line: `key value` pairs, booleans as on/off."""
    shown = {k: ("on" if v else "off") if isinstance(v, bool) else ("none" if v is None else v)
             for k, v in describe_path(loaded).items()}
    return ", ".join(f"{key} {value}" for key, value in shown.items())


def explain(loaded: LoadedModel) -> dict[str, str]:
    """setting ("pack", "exact", "kernels") -> why it is settled so for `loaded` (`specdec-hf doctor`)."""
    if BACKENDS[loaded.backend].gguf:
        exact = "on: as asked" if loaded.exact == "on" else "off: llama.cpp's passes are exact only when asked (--exact on)"
        return {"pack": "the GGUF's own tensors, on llama.cpp's engine", "exact": exact,
                "kernels": "llama.cpp's own (ggml)"}
    return torch_explain.reasons(loaded)
