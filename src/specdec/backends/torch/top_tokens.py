"""The k highest-scoring token ids of logits rows, for drafting: specdec's extension where it is loaded.

Why: drafting takes the top-k of a logits row every step (LogitSpec's next-next candidates) and of every
tree node's row (the recycled successor table); on a CPU `torch.topk` is several times slower than one
pass over the row (docs/benchmarks.md). `csrc/top_tokens.cpp` reads each row once against the k-th best
score so far.

Invariants: ids best first; with the extension, equal scores in order of id (torch.topk's order for ties
is its own); never builds the extension (it uses it where this process loaded it: the int4 pass does), so
a proposer on any backend keeps working. The order feeds drafts only, never what is emitted. Greedy
acceptance's argmax (`argmax_rows`, and `greedy_walk`: the whole walk down a tree in one call) comes from
the same scan.
"""

from __future__ import annotations

import torch

from specdec.kernels import q4_kernel


def top_tokens(logits: torch.Tensor, k: int) -> torch.Tensor:
    """logits [V] or [N, V] -> int64 ids [k] or [N, k], best first (k <= V; with the extension, -1 fills a row
    with fewer than k scores that are not NaN)."""
    rows = logits if logits.dim() == 2 else logits.reshape(1, -1)
    ids = torch.ops.specdec_top.top_tokens(rows, k) if _kernel_takes(rows) else torch.topk(rows, k, dim=-1).indices
    return ids if logits.dim() == 2 else ids[0]


def argmax_rows(logits: torch.Tensor) -> list[int] | None:
    """Each row's argmax of logits [N, V], the lowest id among equal scores (torch.argmax's and numpy's
    choice), in one pass over the rows; None where the extension is not loaded (torch.topk's tie order
    is its own) or a row holds no score that is not NaN. A NaN is never taken (torch and numpy take the
    first one): plain decoding goes through the same acceptance, so it still emits what plain does.
    Greedy acceptance reads it a row at a time: a bf16 row read as it is costs less than one converted
    for numpy (docs/benchmarks.md)."""
    if not _kernel_takes(logits):
        return None
    ids = torch.ops.specdec_top.top_tokens(logits, 1)[:, 0].tolist()
    return None if min(ids) < 0 else ids


def greedy_walk(logits: torch.Tensor, tokens: list[int], parents: list[int]) -> tuple[list[int], list[int]] | None:
    """Greedy acceptance down a draft tree in one kernel call: (the path's nodes root first, the emitted tokens),
    each node's argmax as `argmax_rows` takes it; None where the extension is not loaded or a row on the path
    holds no number (the caller walks it itself). logits [N, V]; tokens, parents: the tree's, as lists."""
    if not _kernel_takes(logits):
        return None
    walked = torch.ops.specdec_top.greedy_walk(logits, tokens, parents)
    if not walked:
        return None
    half = len(walked) // 2
    return walked[:half], walked[half:]


def _kernel_takes(logits: torch.Tensor) -> bool:
    """Whether `csrc/top_tokens.cpp` reads these rows: bf16 or fp32 on the CPU, the extension loaded."""
    return logits.device.type == "cpu" and logits.dtype in (torch.bfloat16, torch.float32) and q4_kernel.is_loaded()
