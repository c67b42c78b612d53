"""Linear layers with their weights prepacked for oneDNN: the same products, read faster.

Why: on CPU a bf16 `nn.Linear` already runs oneDNN's matrix product, but hands it
the weight in PyTorch's plain row-major layout, which oneDNN reorders into its
blocked layout on every call. A decode step of SmolLM2-135M makes 210 such calls
on weights that never change. `torch.ops.mkldnn._reorder_linear_weight` does the
reorder once (it is what inductor's `freezing` does for CPU graphs) and
`torch.ops.mkldnn._linear_pointwise` multiplies with the packed weight: about half
the time of an unpacked call per product, a fifth off a whole decode step
(docs/benchmarks.md, "Measurements behind design choices").

`packed_view(model)` is a copy of the model's module tree that shares every
tensor with the original except the decoder's Linear weights, which it holds
packed (so it costs one more copy of those weights). Where the attention class
is a plain one (`FUSABLE_ATTENTION`), its q, k and v projections become one
packed product (`FusedQKVAttention`): 60 fewer oneDNN calls per SmolLM2 pass.
Gate and up were measured fused too and not kept: one 3,072-column product
cost what the two 1,536-column ones do. The
original stays as it was, and transformers' own `generate` (the benchmarks'
baselines) keeps using it;
drafts in the target's dtype get a packed view of their own (`draft.py`).
With `pack="int4"` the view holds the decoder's Linear layers as 4-bit groups
instead (`specdec.backends.torch.int4`; a draft model is quantized alike), and a bf16 head that a
GGUF file stores as Q8_0 (the bundled model's) on the 8-bit block kernel over the file's own blocks
(`specdec.backends.torch.gguf_blocks`: the same weights, half the bytes); any other head as above.

Invariants:
- only what `auto` packs is bit-identical to the unpacked layer: in bf16 / fp16
  oneDNN runs the same kernel either way (logits checked equal in
  tests/test_packed.py). In fp32 unpacked layers go to MKL and packed ones to
  oneDNN, which sum in another order (logits differ by ~1e-5): still lossless,
  since plain decoding and every method verify on the same packed view, but no
  longer token-identical to transformers' `generate` by construction, so fp32
  packs only when asked (`LoadedModel.pack == "on"`);
- the output head is packed in bf16 / fp16 only (a packed copy: the input embedding,
  maybe tied to it, keeps the original weight); in fp32 `target.head_logits` has its
  own path, faster than a packed head for the few rows of most passes (in bf16 packing
  is the faster one);
- CPU only; a Linear on any other device, or a dtype oneDNN cannot pack on this
  CPU, is left as it was;
- a bf16 product over fewer than `PAD_ROWS` rows by a large weight (at least
  `PAD_MIN_WEIGHT` entries) runs over `PAD_ROWS` rows, the extra ones zeros and
  dropped: oneDNN's kernels for one and two rows read a weight that is out of cache
  slower than its four-row one (a quarter off a Qwen2.5-Coder-1.5B decode pass). Rows are computed
  independently, so two or three rows give the same bits padded or not; one row
  moves from oneDNN's one-row kernel to the four-row one (last bits differ from
  the unpacked one-row product; plain decoding and every method verify on the
  same view, so losslessness is untouched). Small weights stay unpadded: there
  the copy costs more than it saves.
"""

from __future__ import annotations

import copy
import inspect
import warnings
from collections import Counter
from pathlib import Path

import torch

from specdec.backends.torch.fused import fits
from specdec.backends.torch.gguf_blocks import FileBlocks, gguf_name, head_q8, unheld_types
from specdec.backends.torch.int4 import can_quantize, has_invariant_int4, int4_linear
from specdec.backends.torch.invariant import MIN_ROWS, kernel_runs_here, wants_invariance
from specdec.choices import BACKENDS, check_pack
from specdec.kernels.q4_kernel import Q4Linear, unavailable_reason
from specdec.models.base import LoadedModel
from specdec.models.state import ModelState

_EXACT_DTYPES = (torch.bfloat16, torch.float16)  # packing changes no bit of the output (see above)
PAD_ROWS = 4  # the fewest rows a large bf16 product runs over (see the module docstring)
PAD_MIN_WEIGHT = 2_000_000  # weight entries from which padding pays


# `packed_product`: rows [M, in] @ a packed weight -> [M, out_features], `PackedLinear`'s product as one
# opaque op: what a compiled pass (`specdec.backends.compiled`) calls. Inductor lowers the mkldnn op itself only for
# weights frozen into the graph as constants, and a frozen graph is never cached on disk (a minute of
# compiling in every process here); behind this op the packed weight is an ordinary input, so the graph
# caches, and the product is oneDNN's very call, bit for bit. Defined with `torch.library.Library` rather
# than `torch.library.custom_op`, whose extra Python layers add about a third to a small product's call
# (~150 products a SmolLM2 pass).
_LIBRARY = torch.library.Library("specdec", "DEF")
_LIBRARY.define("packed_product(Tensor rows, Tensor weight, Tensor? bias, SymInt out_features) -> Tensor")


def _packed_product(rows: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, out_features: int) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(rows, weight, bias, "none", [], "")


def _packed_product_shape(rows: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, out_features: int) -> torch.Tensor:
    return rows.new_empty(rows.shape[0], out_features)


_LIBRARY.impl("packed_product", _packed_product, "CompositeExplicitAutograd")  # the packed weight is MkldnnCPU
torch.library.register_fake("specdec::packed_product", _packed_product_shape, lib=_LIBRARY)


class PackedLinear(torch.nn.Module):
    """y = x @ W.T + b with W held in oneDNN's blocked layout (inference only)."""

    def __init__(self, linear: torch.nn.Linear, min_rows: int = 1) -> None:
        """min_rows: run every product over at least this many rows (`specdec.backends.torch.invariant.MIN_ROWS`)."""
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.packed_weight = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(), None)
        self.bias = None if linear.bias is None else linear.bias.detach()
        large = linear.weight.numel() >= PAD_MIN_WEIGHT
        self.min_rows = max(min_rows, PAD_ROWS if large and linear.weight.dtype == torch.bfloat16 else 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [..., in_features] -> [..., out_features]."""
        rows = x.reshape(-1, self.in_features)  # [M, in]
        num_rows = rows.shape[0]
        if num_rows == 1 and self.min_rows == 2:  # the row twice: a view, no zero-filled copy
            rows = rows.expand(2, -1)
        elif num_rows < self.min_rows:
            rows = torch.nn.functional.pad(rows, (0, 0, 0, self.min_rows - num_rows))  # [min_rows, in]
        if torch.compiler.is_compiling():  # opaque to inductor (`packed_product`)
            y = torch.ops.specdec.packed_product(rows, self.packed_weight, self.bias, self.out_features)[:num_rows]
        else:
            y = torch.ops.mkldnn._linear_pointwise(rows, self.packed_weight, self.bias, "none", [], "")[:num_rows]
        return y.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, packed"


class Columns(torch.nn.Module):
    """Products whose outputs, side by side, are one product's columns: e.g. q and k on 4-bit blocks and v on
    a GGUF's own Q6_K bits, where the file stores them in types no one product takes. Each output column is
    its own dot product in every kernel here, so the columns are those of one product over the stacked
    weights."""

    def __init__(self, parts: list[torch.nn.Module]) -> None:
        super().__init__()
        self.parts = torch.nn.ModuleList(parts)
        self.in_features = parts[0].in_features
        self.out_features = sum(part.out_features for part in parts)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [..., in_features] -> [..., out_features]."""
        return torch.cat([part(x) for part in self.parts], -1)


def _int4_products(linears: list[torch.nn.Linear], names: list[str | None], file: FileBlocks | None) -> torch.nn.Module:
    """The stacked product of `linears` in 4 bits (the file's Q4_K blocks where it has them), except that
    each the file stores as Q8_0 or Q6_K runs from the file's blocks on the 8-bit kernels: one product, or
    `Columns` of the runs."""
    parts: list[torch.nn.Module] = []
    run: list[int] = []

    def close_run() -> None:
        if run:
            stacked = _stacked([linears[i] for i in run])
            parts.append(int4_linear(stacked, file.q4([names[i] for i in run], stacked.weight) if file is not None else None))
            run.clear()

    for index, linear in enumerate(linears):
        wide = file.q8(names[index], linear.weight, linear.bias) if file is not None else None
        if wide is None:
            run.append(index)
            continue
        close_run()
        parts.append(wide)
    close_run()
    return parts[0] if len(parts) == 1 else Columns(parts)


def _stacked(linears: list[torch.nn.Linear]) -> torch.nn.Linear:
    """One Linear whose rows are `linears`' rows in order (a new weight; `linears` unchanged)."""
    if len(linears) == 1:
        return linears[0]
    first = linears[0]
    fused = torch.nn.Linear(first.in_features, sum(p.out_features for p in linears), bias=first.bias is not None,
                            dtype=first.weight.dtype, device=first.weight.device)
    with torch.no_grad():
        fused.weight.copy_(torch.cat([p.weight for p in linears]))
        if fused.bias is not None:
            fused.bias.copy_(torch.cat([p.bias for p in linears]))
    return fused


# Attention classes whose forward is exactly: q, k, v projections, rotary, cache update, the registered
# attention function, o_proj (what `FusedQKVAttention.forward` does with one product for q, k and v).
FUSABLE_ATTENTION = frozenset({"LlamaAttention", "MistralAttention", "Qwen2Attention"})


class FusedQKVAttention(torch.nn.Module):
    """A transformers attention module with its q, k and v projections as one packed product.

    Same arithmetic as the module it replaces, in one oneDNN call instead of three (split as views
    after): each output column is its own dot product, so the bits are those of the separate
    products (checked in tests/test_packed.py). Rotary embedding and the attention function are the
    model module's own (`apply_rotary_pos_emb`, `ALL_ATTENTION_FUNCTIONS`), so the invariant
    attention and the attention plan apply unchanged.
    """

    def __init__(self, attention: torch.nn.Module, min_rows: int = 1, int4: bool = False,
                 file: FileBlocks | None = None) -> None:
        """int4: the fused product holds 4-bit weights (`specdec.backends.torch.int4`) instead of packed bf16 ones,
        the GGUF `file`'s own Q4_K blocks where it has them."""
        super().__init__()
        module = inspect.getmodule(type(attention))
        self._rotary = module.apply_rotary_pos_emb
        self._eager = module.eager_attention_forward
        self._interfaces = module.ALL_ATTENTION_FUNCTIONS
        for name in ("config", "layer_idx", "head_dim", "scaling", "num_key_value_groups", "is_causal"):
            setattr(self, name, getattr(attention, name))
        self.sliding_window = getattr(attention, "sliding_window", None)
        projections = [attention.q_proj, attention.k_proj, attention.v_proj]
        self.sizes = [p.out_features for p in projections]
        if int4:
            names = [gguf_name(f"layers.{self.layer_idx}.self_attn.{part}_proj") for part in "qkv"]
            self.qkv_proj = _int4_products(projections, names, file)
        else:
            self.qkv_proj = PackedLinear(_stacked(projections), min_rows)
        self.o_proj = attention.o_proj

    def forward(self, hidden_states, position_embeddings, attention_mask, past_key_values=None, **kwargs):
        shape = (*hidden_states.shape[:-1], -1, self.head_dim)
        query, key, value = (part.view(shape).transpose(1, 2) for part in self.qkv_proj(hidden_states).split(self.sizes, -1))
        query, key = self._rotary(query, key, *position_embeddings)
        if past_key_values is not None:
            key, value = past_key_values.update(key, value, self.layer_idx)
        attend = self._interfaces.get_interface(self.config._attn_implementation, self._eager)
        extra = {"sliding_window": self.sliding_window} if self.sliding_window is not None else {}
        out, weights = attend(self, query, key, value, attention_mask, dropout=0.0, scaling=self.scaling, **extra, **kwargs)
        return self.o_proj(out.reshape(*hidden_states.shape[:-1], -1).contiguous()), weights


def _fusable(module: torch.nn.Module, int4: bool) -> bool:
    projections = [getattr(module, name, None) for name in ("q_proj", "k_proj", "v_proj")]
    return type(module).__name__ in FUSABLE_ATTENTION and all(_packable(p, int4) for p in projections)


def _packable(linear: torch.nn.Module | None, int4: bool) -> bool:
    if int4:
        return can_quantize(linear)
    return type(linear) is torch.nn.Linear and can_pack(linear.weight.dtype, linear.weight.device)


def can_pack(dtype: torch.dtype, device: torch.device) -> bool:
    """Whether oneDNN can pack Linear weights of this dtype on this device here."""
    if device.type != "cpu" or not torch.backends.mkldnn.is_available():
        return False
    if dtype == torch.float32:
        return True
    if dtype == torch.bfloat16:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    if dtype == torch.float16:
        return bool(torch.ops.mkldnn._is_mkldnn_fp16_supported())
    return False


def wants_packing(pack: str, model: torch.nn.Module) -> bool:
    """`auto`: where packing is exact (bf16 / fp16 on CPU); `on`: wherever oneDNN can; `int4`: 4-bit
    weights (`specdec.backends.torch.int4`), on the CPU only; `off`: never."""
    check_pack(pack)
    weight = next(model.parameters())
    if pack == "int4":
        if weight.device.type != "cpu":
            raise ValueError(f"pack 'int4' runs on the CPU only (the model is on {weight.device.type})")
        return True
    if pack == "off" or not can_pack(weight.dtype, weight.device):
        return False
    return pack == "on" or weight.dtype in _EXACT_DTYPES


def packed_view(
    model: torch.nn.Module, min_rows: int = 1, int4: bool = False, gguf_path: Path | None = None
) -> torch.nn.Module:
    """A copy of `model` sharing its tensors, with the decoder's Linear layers (and a bf16 head) packed,
    each product run over at least `min_rows` rows; int4: the decoder's Linear layers in 4-bit groups
    instead (`specdec.backends.torch.int4`; min_rows does not apply to them: their rows are computed alone),
    where `gguf_path` (the file `model` came from) stores a layer as Q4_K its own blocks, as Q8_0 or Q6_K on the
    8-bit kernels (`gguf_blocks.FileBlocks.q8`), and the head on the file's own Q8_0 or Q6_K blocks where it has them."""
    tensors = {id(t): t for t in (*model.parameters(), *model.buffers())}
    view = copy.deepcopy(model, tensors)  # modules and configs copied, tensors shared
    decoder = view.get_decoder() if hasattr(view, "get_decoder") else view
    head = view.get_output_embeddings() if hasattr(view, "get_output_embeddings") else None
    file = FileBlocks.of(gguf_path) if int4 else None  # Q4_K layers are read as the file stores them
    for parent in list(decoder.modules()):
        for name, child in list(parent.named_children()):
            if _fusable(child, int4):
                setattr(parent, name, FusedQKVAttention(child, min_rows, int4, file))
    paths = {id(module): path for path, module in decoder.named_modules()}
    for parent in list(decoder.modules()):
        for name, child in list(parent.named_children()):
            if child is not head and _packable(child, int4):
                if not int4:
                    setattr(parent, name, PackedLinear(child, min_rows))
                    continue
                path = f"{paths[id(parent)]}.{name}".lstrip(".")
                setattr(parent, name, _int4_products([child], [gguf_name(path)], file))
    # The head keeps its weights' precision under int4 too: a GGUF's head is usually of more bits than its
    # layers (the bundled model's: Q8_0, which 4 bits would move by up to 5% of its largest weight).
    blocks = head_q8(gguf_path, head, file)[0] if int4 and head is not None else None
    if blocks is not None:
        view.set_output_embeddings(blocks)
    elif _packable(head, False) and head.weight.dtype in _EXACT_DTYPES:
        view.set_output_embeddings(PackedLinear(head, min_rows))
    view.eval()
    if int4:
        _say_rounded(view, file)
    return view


def rounded_products(view: torch.nn.Module) -> tuple[int, int]:
    """(4-bit products whose weights re-quantizing moved, 4-bit products) of a view: where a GGUF holds its
    layers in another type than Q4_1/Q4_K (F16, Q5_0, ...), the int4 view is not the file's model."""
    products = [m for m in view.modules() if isinstance(m, Q4Linear)]
    return sum(m.rounded for m in products), len(products)


def _say_rounded(view: torch.nn.Module, file: FileBlocks | None) -> None:
    """Warn, once a view, where the 4-bit products are not the weights the model came with."""
    moved, total = rounded_products(view)
    if not moved or file is None:  # 4 bits asked of a model that is not a GGUF's: nothing hidden
        return
    stored = Counter(t.tensor_type.name for name, t in file.tensors.items() if name.startswith("blk."))
    types = ", ".join(f"{name} x {count}" for name, count in sorted(stored.items()))
    warnings.warn(f"pack 'int4' re-quantized {moved} of {total} decoder products to 4 bits, which moved their "
                  f"weights (the file stores its layers as {types}): the model verified is that 4-bit model, "
                  "not the file's; --pack off keeps the file's precision", UserWarning, stacklevel=4)


def maybe_packed(
    model: torch.nn.Module, pack: str, state: ModelState | None, min_rows: int = 1, gguf_path: Path | None = None
) -> torch.nn.Module:
    """`model`'s packed view when `pack` wants it here, else `model` (`gguf_path`: see `packed_view`).

    `state`: that of the loaded model whose module `model` is; the view is made once (per
    `min_rows`) and kept there, so every user of that loaded model runs the same view. None: a
    view of the caller's own (a draft module that no `LoadedModel` holds).
    """
    if not wants_packing(pack, model):
        return model
    int4 = pack == "int4"
    if state is None:
        return packed_view(model, min_rows, int4, gguf_path)
    return state.shared(f"packed_view:{min_rows}:{pack}", lambda: packed_view(model, min_rows, int4, gguf_path))


def pack_of(loaded: LoadedModel) -> str:
    """`loaded.pack` with `auto` settled: a GGUF source (the bundled model, a pulled one, a .gguf file) in bf16 on
    the torch backend verifies on 4-bit weights where exact verification runs the fused pass
    (`specdec.backends.torch.fused`: specdec's block and attention kernels, one C++ call a pass), its
    fastest pass, where the file's layers are of types the block kernels hold as stored here
    (`gguf_blocks.held_types`: Q3_K, Q4_0/Q4_1/Q4_K, Q5_0, Q5_1/Q5_K on 8-bit activations, Q6_K, Q8_0,
    IQ4_NL/IQ4_XS), so
    the model verified is the file's. Elsewhere (a 16-bit file, ...) `auto` keeps its meaning (bf16 / fp16
    packing)."""
    if loaded.pack != "auto" or loaded.gguf_path is None or loaded.backend != "torch" or loaded.exact == "off":
        return loaded.pack
    if loaded.dtype != torch.bfloat16 or loaded.device.type != "cpu" or not fits(loaded.model.config):
        return loaded.pack
    unheld = unheld_types(Path(loaded.gguf_path))
    if unheld:
        loaded.state.shared("unheld_notice", lambda: _say_kept(Path(loaded.gguf_path).name, unheld))
        return loaded.pack
    return "int4" if has_invariant_int4(loaded.dtype) and kernel_runs_here() else loaded.pack


def _say_kept(name: str, unheld: tuple[str, ...]) -> bool:
    """Warn, once a loaded model, that `pack auto` keeps bf16 for a file whose layers 4 bits would move."""
    warnings.warn(f"{name} stores decoder layers as {', '.join(unheld)}, which specdec's block kernels do not hold "
                  "as stored: verifying on them in bf16, several times slower than the fused 4-bit pass; --pack int4 "
                  "runs that pass on a 4-bit copy of them (another model)", UserWarning, stacklevel=5)
    return True


def is_invariant(loaded: LoadedModel) -> bool:
    """Whether the engine verifies `loaded` batch-invariantly (`specdec.backends.torch.invariant`, `loaded.exact`).
    With 4-bit weights that needs products that compute each row alone by construction (specdec's kernel)."""
    if loaded.exact == "auto" and not BACKENDS[loaded.backend].exact:
        return False  # a backend whose pass cannot be batch-invariant (compiled): off, as asked of auto
    pack = pack_of(loaded)
    invariant = wants_invariance(loaded.exact, loaded.dtype, loaded.device, wants_packing(pack, loaded.model))
    if invariant and pack == "int4" and not has_invariant_int4(loaded.dtype):
        if loaded.exact == "auto":
            return False
        raise ValueError("pack 'int4' and exact 'on' cannot be combined here: batch-invariant verification on 4-bit "
                         "weights needs specdec's 4-bit kernel in bf16 ("
                         + (unavailable_reason() or "the model is not bf16") + ")")
    return invariant


def verify_model(loaded: LoadedModel) -> torch.nn.Module:
    """The module the engine verifies on (and cost curves time): `loaded.model` or its packed view,
    whose products run over at least `invariant.MIN_ROWS` rows when verification is invariant."""
    min_rows = MIN_ROWS if is_invariant(loaded) else 1
    return maybe_packed(loaded.model, pack_of(loaded), loaded.state, min_rows, loaded.gguf_path)
