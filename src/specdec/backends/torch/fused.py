"""The exact 4-bit verification pass with its decoder layers in C++: no per-layer Python.

Why: on 4-bit weights (`pack="int4"`) the products and specdec's tree attention are a minority of a
one-token pass; transformers' modules spend more than that again around them, dispatching tens of small
PyTorch ops per layer from Python (norms, rotary, cache writes, SiLU, residuals, reshapes).
`csrc/decoder_layer.cpp` runs a whole Llama-family layer in one call, on the same block kernel and the
same attention kernel, and every layer of a pass plus the final norm in one call (`decoder_pass`): a
dispatch from Python per layer was itself a measurable share of a small model's step (docs/benchmarks.md
has the measurements).

`FusedDecoder.of(model)` takes a packed int4 view (`specdec.backends.torch.packed.packed_view`) whose
decoder layers all run on specdec's block kernels (4-bit blocks; a GGUF's Q6_K tensors on their own bits
and its Q8_0 ones as 8-bit blocks, a qkv projection of two types as two products side by side) and whose attention runs specdec's tree-attention
kernel (bf16, heads of 64 or 128, a CPU with AVX-512 BF16); anything else gets None and keeps transformers'
forward. `TargetModel.run` uses it for exact passes (the invariant attention plan): prompt chunks,
one-token steps, trees and batched rows alike, so every pass of a generation runs the same arithmetic.

Invariants:
- the weights are the view's own tensors (nothing copied or quantized again), handed to C++ once as a
  `Layers` object; a pass's intermediate rows live in one workspace it allocates; the embeddings and the
  head are the model's own modules, the rotary angles rows of tables its rotary module fills, the final
  norm the layers' C++ norm with the model's weight (`decoder_pass` runs every layer and that norm in
  one call where no layer's input is captured);
- the KV cache is the target's transformers `Cache`: each layer's entries are written in place at the
  slots its layer's `claim` gives, and the layer's length advances as `update` would advance it;
- a row's bits depend on its token, its position and its key sequence only (the C++ file's invariant),
  so a tree node gets a one-token pass's logits bit for bit;
- the arithmetic is transformers' up to the order of a few fp32 sums (not bit-identical to the unfused
  view): plain decoding and every method run this same pass, so losslessness is untouched.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from transformers.cache_utils import Cache

from specdec.backends.torch.invariant import KERNEL_DIMS, Layout, kernel_runs_here
from specdec.kernels.q4_kernel import Q4Linear, Q8Linear
from specdec.kernels.q5 import Q5Linear
from specdec.kernels.q6_k import Q6Linear
from specdec.tree import DraftTree

MODEL_TYPES = frozenset({"llama", "mistral", "qwen2"})  # decoder layers of exactly the C++ file's form
_NO_BIAS = torch.empty(0, dtype=torch.bfloat16)
_ROTARY_BLOCK = 256  # positions the rotary tables grow by


def fits(config: object) -> bool:
    """Whether a model of this config has the layers the fused pass runs (its weights and the machine aside)."""
    heads = getattr(config, "num_attention_heads", 0) or 1
    dim = getattr(config, "head_dim", None) or getattr(config, "hidden_size", 0) // heads
    sliding = getattr(config, "use_sliding_window", getattr(config, "sliding_window", None) is not None)
    return (getattr(config, "model_type", None) in MODEL_TYPES and getattr(config, "hidden_act", "silu") == "silu"
            and dim in KERNEL_DIMS and not sliding)


def why_not(model: torch.nn.Module) -> str | None:
    """Why `model` cannot run the fused pass, or None when it can."""
    config = getattr(model, "config", None)
    if not hasattr(model, "get_decoder") or not hasattr(model, "get_output_embeddings"):
        return "not a transformers causal LM"
    if config is None or getattr(config, "model_type", None) not in MODEL_TYPES:
        return f"model type {getattr(config, 'model_type', None)!r} is not one of {sorted(MODEL_TYPES)}"
    if getattr(config, "hidden_act", "silu") != "silu":
        return f"activation {config.hidden_act!r} is not silu"
    if next(model.parameters()).dtype != torch.bfloat16:
        return "the model is not bf16"
    if not kernel_runs_here():
        return "specdec's tree-attention kernel does not run here (an x86-64 CPU and the extension are needed)"
    for layer in model.get_decoder().layers:
        attention, mlp = layer.self_attn, layer.mlp
        if getattr(attention, "head_dim", None) not in KERNEL_DIMS:
            return f"heads of {getattr(attention, 'head_dim', None)}, the attention kernel takes {KERNEL_DIMS}"
        linears = [*_parts(getattr(attention, "qkv_proj", None)), attention.o_proj, mlp.gate_proj, mlp.up_proj,
                   mlp.down_proj]
        if not all(_runs_here(linear) for linear in linears):
            return "not every decoder product runs on specdec's 4-bit kernel (pack='int4' in bf16)"
        if any(linear.bias is not None for linear in linears[-4:]):
            return "a bias on o, gate, up or down"
        if getattr(attention, "sliding_window", None) is not None:
            return "sliding-window attention"
    return None


def _runs_here(linear: torch.nn.Module | None) -> bool:
    """A product `decoder_layer` runs: 4-bit blocks, Q6_K's bits, 5-bit values in 8-bit blocks with a minimum, or
    8-bit blocks on 8-bit activations."""
    return (isinstance(linear, (Q4Linear, Q5Linear, Q6Linear))
            or (isinstance(linear, Q8Linear) and linear.activations == "int8"))


def _parts(qkv: torch.nn.Module | None) -> list[torch.nn.Module | None]:
    """The products a qkv projection runs: `Columns`' parts (q and k apart from a Q6_K v), else itself."""
    return list(qkv.parts) if hasattr(qkv, "parts") else [qkv]


def _blocks(linear: Q4Linear | Q5Linear | Q6Linear | Q8Linear) -> list[torch.Tensor]:
    """A product's three tensors as `decoder_layer` reads them (it tells the forms apart by qs's shape)."""
    if isinstance(linear, Q6Linear):
        return [linear.qs, linear.sub, linear.d]
    if isinstance(linear, Q8Linear):
        return [linear.qs, linear.scale, _NO_BIAS]  # no minimum: the 8-bit forms are symmetric
    return [linear.qs, linear.scale, linear.minimum]


def _weights(layer: torch.nn.Module) -> tuple[list[torch.Tensor], int]:
    """The tensors `decoder_layer` reads, in the order its `named` (csrc/decoder_layer.cpp) reads them into a
    `LayerWeights`, and how many products the qkv projection runs (P): 3P + 12 tensors with gate and up joined
    (`_join`), else 3P + 15."""
    attention, mlp = layer.self_attn, layer.mlp
    parts = _parts(attention.qkv_proj)
    biases = [part.bias for part in parts]
    if all(b is None for b in biases):
        bias = _NO_BIAS
    else:
        bias = torch.cat([torch.zeros(p.out_features) if b is None else b for p, b in zip(parts, biases, strict=True)])
        bias = bias.to(torch.bfloat16).contiguous()
    joined = _join(mlp.gate_proj, mlp.up_proj)
    down = mlp.down_proj
    products = [*joined, *_blocks(down)] if joined else [
        t for p in (mlp.gate_proj, mlp.up_proj, down) for t in _blocks(p)]
    qkv = [t for part in parts for t in _blocks(part)]
    return [layer.input_layernorm.weight, *qkv, bias, *_blocks(attention.o_proj),
            layer.post_attention_layernorm.weight, *products], len(parts)


def _join(gate: torch.nn.Module, up: torch.nn.Module) -> list[torch.Tensor] | None:
    """gate's and up's blocks as one product's (gate's columns first), or None where their forms differ.

    Each output column is reduced alone in either form of the kernel, so the joined product's columns are
    the two products' bits. The layers' own tensors become views of the joined ones: no second copy, and a
    second fused pass over the same model (another target) finds them joined already."""
    if not (isinstance(gate, Q4Linear) and isinstance(up, Q4Linear)):
        return None
    names = ("qs", "scale", "minimum")
    pairs = [(getattr(gate, name), getattr(up, name)) for name in names]
    if any(a.dtype != b.dtype or a.shape[1:] != b.shape[1:] for a, b in pairs):
        return None
    joined = [_joined(a, b) for a, b in pairs]
    for name, whole, (a, _) in zip(names, joined, pairs, strict=True):
        setattr(gate, name, whole[: a.shape[0]])
        setattr(up, name, whole[a.shape[0] :])
    return joined


def _joined(first: torch.Tensor, second: torch.Tensor) -> torch.Tensor:
    """[first; second] along dim 0: the tensor both are consecutive views of where they are, else a new one."""
    base = first._base
    if (base is not None and second._base is base and base.shape[0] == first.shape[0] + second.shape[0]
            and first.data_ptr() == base.data_ptr()):
        return base
    return torch.cat([first, second])


def _causal_rows(batch: int, tokens: int, context: int) -> tuple[torch.Tensor, ...]:
    """A causal pass's positions, starts and counts [B, T] (row t sits at context + t and reads slots
    [0, context + t], nothing gathered) as three views of one tensor, and its empty tail [B, T, 0]: each tensor
    made or op called beside a pass costs several times its warm price (docs/benchmarks.md)."""
    positions = list(range(context, context + tokens))
    made = torch.tensor([[positions] * batch, [[p + 1 for p in positions]] * batch, [[0] * tokens] * batch])
    positions, starts, counts = made.unbind()
    return positions, starts, counts, made.new_empty(batch, tokens, 0)


def _slot_tensors(claims: list[tuple]) -> list[tuple]:
    """Claims with their write slots as tensors: a one-sequence cache's layers claim an int start, the same for
    every layer of a pass, made a tensor once (a batched cache's claim is its layout's tensor already)."""
    made: dict[int, torch.Tensor] = {}
    out = []
    for keys, values, write in claims:
        if isinstance(write, int):
            if write not in made:
                made[write] = torch.tensor([write])
            write = made[write]
        out.append((keys, values, write))
    return out


@dataclass(frozen=True)
class KeySequences:
    """Where each query row of a fused pass reads its keys: cache slots [0, start), then `count` gathered
    slots in position order. The tree-attention kernel reads them as one sequence whatever the split, so
    this is all a fused pass needs of a `Layout`; made from the trees, it spares a tree pass the dense
    mask and the `Layout` derived from it."""

    starts: torch.Tensor  # [B, T] int64
    tail_slots: torch.Tensor  # [B, T * L] int64, row t's slots at [t * L, t * L + count); 0 past them
    counts: torch.Tensor  # [B, T] int64

    @classmethod
    def of_trees(cls, trees: Sequence[DraftTree], lengths: Sequence[int], width: int) -> KeySequences:
        """trees[b] below lengths[b] committed tokens, rows padded to `width`: node t reads the prefix, then
        its ancestors and itself; a padding row reads the prefix and its own slot (`BatchedTarget`'s mask)."""
        lines = [[[start + node for node in line] for line in tree.ancestor_lines]
                 + [[start + pad] for pad in range(tree.num_nodes, width)]
                 for tree, start in zip(trees, lengths, strict=True)]
        longest = max(len(line) for row in lines for line in row)
        rows, nodes = len(lines), len(lines) * width
        # one tensor, three views: each tensor made beside the pass costs more than its values (docs/benchmarks.md)
        flat = [start for start in lengths for _ in range(width)]
        flat += [len(line) for row in lines for line in row]
        flat += [slot for row in lines for line in row for slot in line + [0] * (longest - len(line))]
        made = torch.tensor(flat, dtype=torch.int64)
        starts, counts, tail = made[:nodes], made[nodes : 2 * nodes], made[2 * nodes :]
        return cls(starts.view(rows, width), tail.view(rows, -1), counts.view(rows, width))


class FusedDecoder:
    """A packed int4 view's decoder and head: every layer and the final norm in one C++ call (`run`)."""

    def __init__(self, model: torch.nn.Module) -> None:
        reason = why_not(model)
        if reason is not None:
            raise ValueError(f"the fused pass cannot run this model: {reason}")
        decoder = model.get_decoder()
        self.embed, self.rotary, self.norm = decoder.embed_tokens, decoder.rotary_emb, decoder.norm
        self.head = model.get_output_embeddings()
        self.layers, self.parts = (list(part) for part in zip(*(_weights(layer) for layer in decoder.layers), strict=True))
        first = decoder.layers[0]
        self.eps = float(first.input_layernorm.variance_epsilon)
        attention = first.self_attn
        self.dim, self.scale = attention.head_dim, float(attention.scaling)
        self.kv_heads = model.config.num_key_value_heads
        self.heads = model.config.num_attention_heads
        # `decoder_pass`'s weights, handed to C++ once: a list of them every pass cost a measurable dispatch
        self._stretches: dict[tuple[int, int], object] = {}
        self.weights = self._stretch(0, len(self.layers))
        self.norm_weight = self.norm.weight.contiguous()
        self._no_norm = self.norm_weight[:0]  # `decoder_pass` then leaves its result un-normed
        self.norm_eps = float(self.norm.variance_epsilon)
        rope = getattr(self.rotary, "rope_type", "default")
        # Tabled where a position's angles are fixed; dynamic kinds rescale with the longest position
        self.tabled = isinstance(rope, str) and "dynamic" not in rope and rope != "longrope"
        self._cos = self._sin = torch.empty(0, self.dim, dtype=torch.bfloat16)
        # `pass_inputs` takes the rows itself where the embedding is a plain bf16 table and the angles tabled
        embed = self.embed
        self.direct = (self.tabled and type(embed) is torch.nn.Embedding and embed.weight.dtype == torch.bfloat16
                       and embed.max_norm is None and embed.weight.is_contiguous())

    @classmethod
    def of(cls, model: torch.nn.Module) -> FusedDecoder | None:
        """The fused pass of `model`, or None where it cannot run (`why_not`)."""
        return None if why_not(model) is not None else cls(model)

    def run(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor | None,
        layout: Layout | KeySequences | None,
        cache: Cache,
        context: int,
        last_only: bool = False,
        capture: Sequence[int] = (),
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """`TargetModel.run`'s (logits [B, T, V], features) for input_ids [B, T] after `context` cached tokens.

        layout: where each row reads its keys (a tree or batched pass's `Layout`); None for a causal pass,
        whose row t reads slots [0, context + t] (position_ids then default to context + t)."""
        batch, tokens = input_ids.shape
        if layout is None and position_ids is None:
            position_ids, starts, counts, tail = _causal_rows(batch, tokens, context)
        elif layout is None:
            starts = (position_ids + 1).contiguous()
            tail = torch.zeros(batch, tokens, 0, dtype=torch.int64)
            counts = torch.zeros_like(starts)
        else:
            if position_ids is None:  # the layout's rows at context + t
                position_ids = _causal_rows(batch, tokens, context)[0]
            starts, counts = layout.starts, layout.counts
            tail = layout.tail_slots.view(batch, tokens, -1)
        if self.direct:  # the embedding rows and rotary rows in one C++ call (what the else branch takes)
            # every position lies below context + tokens (a tree's nodes sit at their rows' starts plus their
            # depths, and context is the longest row's start): no read of position_ids' maximum
            self._grow(context + tokens)
            hidden, cos, sin = torch.ops.specdec_layer.pass_inputs(
                input_ids, self.embed.weight, position_ids, self._cos, self._sin)
        else:
            hidden = self.embed(input_ids)
            cos, sin = self.angles(hidden, position_ids)
        claims = [layer.claim(batch, self.kv_heads, self.dim, hidden.dtype, tokens) for layer in cache.layers]
        claims = _slot_tensors(claims)
        keys, values, writes = (list(part) for part in zip(*claims, strict=True))
        common = (starts, tail, counts, self.heads, self.kv_heads, self.eps, self.scale)
        total, states, at = len(self.layers), {}, 0
        # A captured state is the input of its layer: the layers run in stretches between captures, each one
        # C++ call, not a call per layer (docs/results/2026-11-server-threads, "Captured passes")
        for stop in sorted({index % (total + 1) for index in capture} - {total}):
            if stop > at:
                hidden = self._stretch(at, stop).run(
                    hidden, cos, sin, keys[at:stop], values[at:stop], writes[at:stop], *common, self._no_norm,
                    self.norm_eps)
            states[stop], at = hidden, stop
        # `decoder_pass` as the class's method: the op's Python overload would first search every argument for
        # fake script objects (it takes this class), ~90 tensors a pass (docs/benchmarks.md, "A node priced")
        hidden = self._stretch(at, total).run(
            hidden, cos, sin, keys[at:], values[at:], writes[at:], *common, self.norm_weight, self.norm_eps)
        logits = self.head(hidden[:, -1:] if last_only else hidden)
        if not capture:
            return logits, None
        states[total] = hidden  # the last state captured is the normed one the head reads
        return logits, torch.cat([states[index % (total + 1)] for index in capture], -1)

    def _stretch(self, start: int, stop: int) -> object:
        """Layers [start, stop) as `decoder_pass` takes them, built once per stretch."""
        if (start, stop) not in self._stretches:
            layers, parts = self.layers[start:stop], self.parts[start:stop]
            weights = [tensor for layer in layers for tensor in layer]
            self._stretches[start, stop] = torch.classes.specdec_layer.Layers(weights, [len(w) for w in layers], parts)
        return self._stretches[start, stop]

    def angles(self, hidden: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The rotary cos and sin [B, T, D] at position_ids [B, T]: rows of tables the model's own rotary
        module fills a block of positions at a time (the same call for every block, so a position's values
        never depend on what shares its pass), or that module's output per pass for a dynamic kind."""
        batch = position_ids.shape[0]
        if not self.tabled:
            return tuple(part.expand(batch, -1, -1).contiguous() for part in self.rotary(hidden, position_ids))
        self._grow(int(position_ids.max()) + 1)
        return self._cos[position_ids], self._sin[position_ids]

    def _grow(self, top: int) -> None:
        """The rotary tables through position top - 1, filled a block of positions at a time."""
        while self._cos.shape[0] < top:
            block = torch.arange(self._cos.shape[0], self._cos.shape[0] + _ROTARY_BLOCK)[None]
            cos, sin = self.rotary(self._cos, block)  # the module reads only its input's dtype and device
            self._cos, self._sin = torch.cat([self._cos, cos[0]]), torch.cat([self._sin, sin[0]])
