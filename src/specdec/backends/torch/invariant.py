"""Batch-invariant verification: a tree node's logits carry the same bits as a one-token pass's.

Why this exists: lossless is the contract, but in bf16 a many-token
verification pass used to round differently from a one-token decoding step,
so a speculative method's greedy text could differ from plain decoding's
(33-50% of prompts), and the server's text depended on which requests shared
a pass. What broke it was found by comparing a one-token pass with the same
token inside chains, trees and batches, op by op (bf16, oneDNN on a 2-core
AVX-512 CPU with avx512_bf16; `tests/test_invariant.py` repeats the check on
whatever machine runs the suite):

- products by weights: oneDNN's one-row kernel sums in another order than its
  many-row kernel (a matrix-vector product against a matrix product); from two
  rows up, every row of every product we tried (2 to 2,048 rows, SmolLM2's and
  the LM head's shapes) had the bits it has in a two-row product. So every
  packed product runs at least `MIN_ROWS` rows (`specdec.backends.torch.packed`);
- attention: PyTorch's SDPA kernel splits its work by the number of queries;
  eager attention (scores, float32 softmax, probabilities by values) has three
  catches. oneDNN's probabilities-by-values product sums keys in pairs, so a
  tree node whose ancestors sit at other slots than their positions sums in
  another order; it also changes its summation above 1,024 keys; and softmax
  finishes a row that is not a multiple of the vector width in a scalar loop.
  `invariant_attention` therefore splits each query row's keys at a point fixed
  by its position alone: its last `TAIL` keys are gathered in position order,
  the rest (contiguous cache slots from 0) are read in place over at least
  `MIN_KEYS` keys once past `SAFE_KEYS`, and one softmax runs over both, its
  rows padded to a multiple of `COLUMNS` masked columns (masked keys are exact
  zeros after the softmax, so they change no sum). `prefill_attention` runs
  eager's arithmetic with the same padding for prompt passes, whose keys are
  contiguous anyway;
- everything else on the path (embeddings, rotary tables, RMS norms, residual
  sums, SiLU) is computed row by row and was already invariant.

Where it can (bf16, heads of 64 or 128, specdec's extension built: AVX-512 BF16 code, else its portable
AVX2 or scalar code), attention
runs specdec's own kernel instead (`csrc/tree_attention.cpp`, `uses_kernel`): each query row reads
its keys as one sequence in position order (the contiguous prefix, then the gathered tail) and its
arithmetic depends on nothing else, so the split point, padding and row grouping above are not
needed there. The choice is fixed per model and machine, so every pass of a generation (prompt
chunks, one-token steps, trees) runs the same arithmetic.

With these, a node's logits and hidden states equal, bit for bit, those of
one-token passes along its path, whatever tree, batch, cache length or prefill
chunking surrounds it. Plain decoding and every method then verify with the
same arithmetic, so greedy output is token-identical to plain decoding in bf16
as it is in fp32.

Invariants:
- the maths is attention's: only which kernels run, over which padding, is
  chosen; the products are the same packed products;
- the attentions are registered through transformers' public
  `AttentionInterface` / `AttentionMaskInterface` (with eager's mask) under
  `IMPLEMENTATION` and `PREFILL_IMPLEMENTATION`; nothing in transformers is
  patched; the target computes a pass's `Layout` once and hands it to every
  layer as a keyword argument;
- a node whose first non-ancestor lies more than TAIL - 1 positions back cannot
  be read invariantly here: a bare pass refuses it, and the engine cuts such nodes
  first (`verifiable`); the fused pass (`specdec.backends.torch.fused`) reads any
  tree, each node's keys as one sequence;
- `exact="auto"` (the default) turns it on where it is free: bf16 on a CPU where
  attention runs specdec's kernel, which is faster than the attention it replaces
  (docs/results/2026-11-exact-kernel: exact runs at 1.17x the tokens/s of non-exact
  verification there); `on` holds it wherever it was shown to hold (bf16 / fp16 on
  CPU with packed weights), at a cost where the kernel does not run; fp32 is the
  exact reference already and keeps its own kernels.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, eager_mask

from specdec.choices import check_exact
from specdec.tree import DraftTree

IMPLEMENTATION = "specdec_invariant"  # verification passes (trees, batches, one-token steps)
PREFILL_IMPLEMENTATION = "specdec_invariant_prefill"  # prompt passes, in chunks of any size
MIN_ROWS = 2  # oneDNN's one-row kernels sum in another order (module docstring)
MIN_KEYS = 1025  # past oneDNN's single-run reduction length, whose blocks start at key 0
SAFE_KEYS = 512  # rows seeing no more keys than this sum alike in both regimes: no padding needed
COLUMNS = 64  # softmax rows are a multiple of this wide: its vector loop then has no scalar tail
TAIL = 32  # keys gathered per query row in position order: itself and the 31 before it
KERNEL_DIMS = (64, 128)  # the head sizes specdec's tree-attention kernel takes


def wants_invariance(exact: str, dtype: torch.dtype, device: torch.device, packed: bool) -> bool:
    """Whether verification runs batch-invariant: `on` where it was shown to hold (bf16 / fp16 on a
    CPU, packed weights: it pads the packed products), `off` never, `auto` where it is free: bf16 on a
    CPU whose attention runs specdec's kernel (`kernel_runs_here`), packed weights."""
    check_exact(exact)
    if exact == "off":
        return False
    if exact == "auto":
        return packed and device.type == "cpu" and dtype == torch.bfloat16 and kernel_runs_here()
    if not packed or device.type != "cpu" or dtype not in (torch.bfloat16, torch.float16):
        raise ValueError(
            "exact=on needs bf16 (or fp16) on a CPU with oneDNN bf16 and packed weights (pack=auto); "
            f"got {str(dtype).removeprefix('torch.')} on {device.type}{'' if packed else ', unpacked'}"
        )
    return True


@dataclass(frozen=True)
class Layout:
    """Where each query row of one pass reads its keys (the same for every layer of the pass).

    A row that sees n keys sits at position n - 1. Its keys are split at position n - TAIL (never
    past its first hidden key, so the prefix is contiguous cache slots [0, start)): the tail, the
    keys from the split on, is gathered in position order into TAIL columns; the prefix is read
    in place. A tree node whose first hidden key is more than TAIL - 1 positions back (a branch
    point that deep) is refused (`verifiable` cuts such nodes first); chains pass at any depth.
    """

    tail_slots: torch.Tensor  # [B, T * TAIL] int64 key slots, row-major (padding: a valid slot)
    mask: torch.Tensor  # [B, 1, T, TAIL + width] additive: the tail columns, then prefix slots
    width: int  # prefix slots the pass reads: max(starts), at least MIN_KEYS past SAFE_KEYS
    filler: int  # masked columns after them, so that TAIL + width + filler is a multiple of COLUMNS
    starts: torch.Tensor  # [B, T] int64: each row's contiguous prefix, slots [0, start)
    counts: torch.Tensor  # [B, T] int64: how many of its TAIL tail slots it reads

    @classmethod
    def of(cls, allowed: torch.Tensor, dtype: torch.dtype) -> Layout:
        """From allowed [B, T, K] bool (key visible to query) and the scores' dtype."""
        batch, num_queries, num_keys = allowed.shape
        device = allowed.device
        slots = torch.arange(num_keys, device=device)
        visible = allowed.sum(-1)  # [B, T]
        first_hidden = torch.where(allowed, num_keys, slots).amin(-1)
        starts = torch.minimum((visible - TAIL).clamp(min=0), first_hidden)
        low = int(starts.min())  # no tail starts before it: sort only the slots from there on
        window = slots[low:]
        in_tail = allowed[..., low:] & (window >= starts[..., None])  # [B, T, K - low]
        counts = in_tail.sum(-1)  # [B, T]
        if int(counts.max()) > TAIL:
            raise ValueError(f"a query sees more than {TAIL} keys past its split point (a branch too deep)")
        order = torch.where(in_tail, window, num_keys).sort(-1).values[..., :TAIL]  # kept slots first
        order = torch.nn.functional.pad(order, (0, TAIL - order.shape[-1]))  # fewer keys than TAIL
        live = torch.arange(TAIL, device=device) < counts[..., None]  # [B, T, TAIL]
        tail_slots = torch.where(live, order, 0)
        top = int(starts.max())
        width = top if top <= SAFE_KEYS else max(top, MIN_KEYS)
        filler = _aligned(TAIL + width) - TAIL - width
        in_prefix = torch.arange(width + filler, device=device) < starts[..., None]  # [B, T, width + filler]
        blocked = torch.finfo(dtype).min
        mask = torch.zeros(batch, num_queries, TAIL + width + filler, dtype=dtype, device=device)
        mask.masked_fill_(~torch.cat([live, in_prefix], -1), blocked)
        return cls(tail_slots.reshape(batch, -1), mask[:, None], width, filler, starts.contiguous(), counts.contiguous())


def verifiable(tree: DraftTree) -> DraftTree:
    """The tree without the nodes an invariant pass cannot read invariantly (and their descendants).

    A node is kept when every node placed before it in the tree is one of its ancestors, or the
    first that is not sits within TAIL - 1 positions of it: its split point then falls in the
    cached prefix, as a one-token pass at its position would put it. A dropped node was only a
    guess, so the cut tree verifies to the same text (at most fewer tokens a step); a descendant
    of a dropped node fails the same test, so what is kept is a tree."""
    if tree.is_chain or tree.max_depth < TAIL:  # the common case: nothing can be that deep
        return tree
    nodes = torch.arange(tree.num_nodes)
    others = ~tree.ancestor_mask & (nodes[None, :] < nodes[:, None])  # [N, N] earlier non-ancestors
    first_other = torch.where(others.any(1), others.int().argmax(1), nodes + 1)
    keep = first_other >= tree.depths + 1 - TAIL  # [N] bool
    if bool(keep.all()):
        return tree
    index = keep.cumsum(0) - 1  # new index of each kept node
    parents = torch.where(tree.parents[keep] >= 0, index[tree.parents[keep].clamp(min=0)], -1)
    probs = tree.draft_probs[keep] if tree.draft_probs is not None else None
    return DraftTree(tree.tokens[keep], parents, probs)


def causal_allowed(batch: int, context: int, num_queries: int, device: torch.device) -> torch.Tensor:
    """[B, T, context + T] bool: query t sees every cached key and the new ones up to itself."""
    keys = torch.arange(context + num_queries, device=device)
    queries = torch.arange(context, context + num_queries, device=device)
    return (keys[None, :] <= queries[:, None]).expand(batch, -1, -1)


def invariant_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float,
    dropout: float = 0.0,
    specdec_layout: Layout | None = None,
    **kwargs: object,
) -> tuple[torch.Tensor, None]:
    """Attention whose every query row gets the bits it would get alone at its position; [B, T, H, D].

    query [B, H, T, D]; key, value [B, KV, K, D]; the pass's `Layout` (made from `attention_mask`,
    additive [B, 1, T, K] or None for all visible, when not given). One float32 softmax over each
    row's tail columns then its prefix slots (padded to a multiple of COLUMNS); the tail's product
    by values per row (gathered in position order), the prefix's over at least MIN_ROWS rows and,
    past SAFE_KEYS, MIN_KEYS keys.
    """
    batch, heads, num_queries, dim = query.shape
    kv_heads, num_keys = key.shape[1], key.shape[2]
    groups = heads // kv_heads
    layout = specdec_layout
    if layout is None:
        allowed = torch.ones(batch, num_queries, num_keys, dtype=torch.bool, device=query.device)
        if attention_mask is not None:
            allowed = (attention_mask[..., :num_keys] == 0).expand(batch, 1, -1, -1)[:, 0]
        layout = Layout.of(allowed, query.dtype)
    if uses_kernel(query, key):
        tail = layout.tail_slots.view(batch, num_queries, TAIL)
        return _kernel(query, key, value, layout.starts, tail, layout.counts, scaling), None
    # Query rows grouped by the key head they read: [B, KV, G, T, D].
    grouped = query.reshape(batch, kv_heads, groups, num_queries, dim).contiguous()
    tail_keys = _gather(key, layout.tail_slots, num_queries)  # [B, KV, T, TAIL, D]
    tail_values = _gather(value, layout.tail_slots, num_queries)
    scores = (grouped.transpose(2, 3) @ tail_keys.transpose(-1, -2)).transpose(2, 3)  # [B, KV, G, T, TAIL]
    if layout.width:
        rows = grouped.view(batch, kv_heads, groups * num_queries, dim)
        prefix_scores = _at_least_rows(rows) @ _prefix(key, layout.width).transpose(2, 3)
        prefix_scores = prefix_scores[:, :, : groups * num_queries].view(batch, kv_heads, groups, num_queries, -1)
        scores = torch.cat([scores, prefix_scores], -1)
    if layout.filler:  # masked by the layout's mask; any finite value will do
        scores = torch.nn.functional.pad(scores, (0, layout.filler))
    scores = scores.reshape(batch, heads, num_queries, -1) * scaling + layout.mask
    probs = torch.softmax(scores, dim=-1).view(batch, kv_heads, groups, num_queries, -1)  # float32 inside
    out = (probs[..., :TAIL].transpose(2, 3) @ tail_values).transpose(2, 3)  # [B, KV, G, T, D]
    if layout.width:
        prefix_probs = probs[..., TAIL : TAIL + layout.width].reshape(batch, kv_heads, groups * num_queries, -1)
        prefix_out = _at_least_rows(prefix_probs) @ _prefix(value, layout.width)
        out = prefix_out[:, :, : groups * num_queries].view(batch, kv_heads, groups, num_queries, dim) + out
    return out.reshape(batch, heads, num_queries, dim).transpose(1, 2).contiguous(), None


def prefill_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float,
    dropout: float = 0.0,
    **kwargs: object,
) -> tuple[torch.Tensor, None]:
    """Eager attention's arithmetic over at least MIN_ROWS rows, at least MIN_KEYS keys once past
    SAFE_KEYS, softmax rows padded to a multiple of COLUMNS; output [B, T, H, D].

    For prompt passes, whose rows see contiguous keys from slot 0: a row's bits then depend neither
    on the rows beside it nor on the masked keys after its own, so a prompt prefilled in chunks of
    any size (the server's) gets the bits of one prefilled whole.
    """
    batch, heads, num_queries, dim = query.shape
    kv_heads, num_keys = key.shape[1], key.shape[2]
    groups, width = heads // kv_heads, num_keys if num_keys <= SAFE_KEYS else max(num_keys, MIN_KEYS)
    if attention_mask is None:
        attention_mask = query.new_zeros(batch, 1, num_queries, num_keys)
    if uses_kernel(query, key):  # each row's keys are the slots [0, start): contiguous, in position order
        starts = (attention_mask[:, 0, :, :num_keys] == 0).sum(-1).expand(batch, -1).contiguous()
        empty = torch.zeros(batch, num_queries, 0, dtype=torch.int64)
        return _kernel(query, key, value, starts, empty, torch.zeros_like(starts), scaling), None
    blocked = torch.finfo(query.dtype).min
    columns = _aligned(width)
    mask = torch.nn.functional.pad(attention_mask[..., :num_keys], (0, columns - num_keys), value=blocked)
    rows = query.reshape(batch, kv_heads, groups * num_queries, dim)
    keys, values = _prefix(key, width), _prefix(value, width)
    scores = _at_least_rows(rows) @ keys.transpose(2, 3)
    scores = scores[:, :, : groups * num_queries].reshape(batch, heads, num_queries, width)
    scores = torch.nn.functional.pad(scores, (0, columns - width)) * scaling + mask  # masked filler columns
    probs = torch.softmax(scores, dim=-1)[..., :width].reshape(batch, kv_heads, groups * num_queries, width)
    out = (_at_least_rows(probs) @ values)[:, :, : groups * num_queries]
    return out.reshape(batch, heads, num_queries, dim).transpose(1, 2).contiguous(), None


def uses_kernel(query: torch.Tensor, key: torch.Tensor) -> bool:
    """Whether this pass's attention runs specdec's tree-attention kernel (`csrc/tree_attention.cpp`): bf16,
    heads of 64 or 128, the extension built (its AVX-512 BF16 or portable path). Fixed for a model on a machine, so every
    pass of a generation (prefill, one-token steps, trees) runs the same arithmetic."""
    if query.dtype != torch.bfloat16 or query.shape[-1] not in KERNEL_DIMS or query.device.type != "cpu":
        return False
    return kernel_runs_here()


@functools.cache
def kernel_runs_here() -> bool:
    """Whether specdec's tree-attention kernel runs on this machine (the extension built: AVX-512 BF16 code, or the
    portable code: AVX2 or scalar on other x86-64 CPUs, NEON-vectorized by the compiler on Arm)."""
    from specdec.kernels.q4_kernel import load_extension  # the one extension: built once a process

    return load_extension() and bool(torch.ops.specdec_attention.tree_attention_available())


def _kernel(query, key, value, starts, tail, counts, scaling: float) -> torch.Tensor:  # noqa: ANN001
    """The kernel's attention, [B, T, H, D]: each row over its slots [0, start), then its `count` tail slots."""
    return torch.ops.specdec_attention.tree_attention(query.contiguous(), key, value, starts, tail, counts, scaling)


def _gather(states: torch.Tensor, slots: torch.Tensor, num_queries: int) -> torch.Tensor:
    """states [B, KV, K, D], slots [B, T * TAIL] -> [B, KV, T, TAIL, D]."""
    batch, kv_heads, _, dim = states.shape
    if batch == 1:
        return states.index_select(2, slots[0]).view(1, kv_heads, num_queries, TAIL, dim)
    rows = torch.arange(batch, device=slots.device)[:, None]
    picked = states[rows, :, slots]  # [B, T * TAIL, KV, D]: advanced indices around a slice go first
    return picked.view(batch, num_queries, TAIL, kv_heads, dim).permute(0, 3, 1, 2, 4)


def _aligned(columns: int) -> int:
    """`columns` rounded up to a multiple of COLUMNS."""
    return -(-columns // COLUMNS) * COLUMNS


def _at_least_rows(matrix: torch.Tensor) -> torch.Tensor:
    """matrix [..., M, N] with zero rows appended up to MIN_ROWS (the caller drops their results)."""
    extra = MIN_ROWS - matrix.shape[-2]
    return torch.nn.functional.pad(matrix, (0, 0, 0, extra)) if extra > 0 else matrix


def _prefix(states: torch.Tensor, width: int) -> torch.Tensor:
    """The first `width` slots of states [B, KV, K, D], zeros past K."""
    head = states[:, :, :width]
    return torch.nn.functional.pad(head, (0, 0, 0, width - head.shape[2])) if head.shape[2] < width else head


AttentionInterface.register(IMPLEMENTATION, invariant_attention)
AttentionMaskInterface.register(IMPLEMENTATION, eager_mask)
AttentionInterface.register(PREFILL_IMPLEMENTATION, prefill_attention)
AttentionMaskInterface.register(PREFILL_IMPLEMENTATION, eager_mask)
