"""Host time to build a graphed pass's mask input: before (the additive mask over the cache's capacity,
`BatchedTarget._mask`) and after (the trees' ancestry, `graphs.padded_ancestry`; the mask is then made in the
graph). Run from the repository root, alone on the machine:

    .venv/bin/python benchmarks/results/2026-12-gpu-graph-inputs/host_mask.py
"""

from __future__ import annotations

import timeit
from types import SimpleNamespace

import torch

from specdec.backends.torch.graphs import padded_ancestry
from specdec.backends.torch.rows import BatchedTarget
from specdec.tree import DraftTree

CASES = ((1, 1, 1, 1024), (1, 64, 40, 2048), (1, 128, 100, 2048), (8, 16, 12, 4096))  # rows, width, nodes, slots


def tree(nodes: int) -> DraftTree:
    """A binary tree of `nodes` nodes."""
    return DraftTree.of_lists(list(range(nodes)), [-1] + [(i - 1) // 2 for i in range(1, nodes)])


def clock(call, reps: int = 300) -> float:  # noqa: ANN001
    """Microseconds a call, after 30 warm-up calls."""
    timeit.timeit(call, number=30)
    return timeit.timeit(call, number=reps) / reps * 1e6


def main() -> None:
    for rows, width, nodes, slots in CASES:
        trees, starts = [tree(nodes)] * rows, [500] * rows
        host = SimpleNamespace(dtype=torch.float32, device=torch.device("cpu"), lengths=starts)
        before = clock(lambda: BatchedTarget._mask(host, trees, width, slots, starts))  # noqa: B023
        after = clock(lambda: padded_ancestry(trees, width))  # noqa: B023
        print(f"rows {rows} width {width} nodes {nodes} keys {slots}: mask {before:.1f} us "
              f"({rows * width * slots * 4 / 1024:.0f} KiB) -> ancestry {after:.1f} us "
              f"({rows * width * width / 1024:.1f} KiB)")


if __name__ == "__main__":
    main()
