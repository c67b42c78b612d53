"""A step's commit in one C++ call (csrc/kv_paths.cpp, `batch_cache.keep_paths`) against the indexed copies it
replaces: every buffer's contents after random paths, overlapping moves included, and on the real model's
batched cache after a tree pass."""

from __future__ import annotations

import pytest
import torch

from specdec.backends.torch import batch_cache
from specdec.backends.torch.batch_cache import BatchedLayer, BatchLayout, keep_paths
from specdec.backends.torch.rows import BatchedTarget
from specdec.backends.torch.target import TargetModel
from specdec.kernels import q4_kernel
from specdec.tree import DraftTree


@pytest.fixture(scope="module", autouse=True)
def extension():
    if not q4_kernel.load_extension():
        pytest.skip(q4_kernel.unavailable_reason())


def _layers(data: torch.Generator, dtype: torch.dtype, count: int = 3) -> list[BatchedLayer]:
    layers = []
    for _ in range(count):
        layer = BatchedLayer(BatchLayout(), capacity=40)
        layer.lazy_initialization(*(torch.empty(4, 3, 0, 8, dtype=dtype) for _ in range(2)))
        for buffer in layer.buffers:
            buffer.copy_(torch.randn(buffer.shape, generator=data))
        layers.append(layer)
    return layers


def _moves(data: torch.Generator, rows: list[int]) -> tuple[list[list[int]], list[list[int]]]:
    """Per row a root-first increasing path in a tree of up to 12 nodes after a random committed length,
    padded as `BatchedTarget._move` pads it."""
    paths = []
    for _ in rows:
        nodes = torch.randperm(11, generator=data)[: int(torch.randint(0, 6, (1,), generator=data))] + 1
        paths.append([0, *sorted(nodes.tolist())])
    longest = max(map(len, paths))
    src, dst = [], []
    for path in paths:
        base, pad = int(torch.randint(0, 20, (1,), generator=data)), longest - len(path)
        src.append([base + node for node in path + path[-1:] * pad])
        dst.append([base + i for i in range(len(path))] + [base + len(path) - 1] * pad)
    return src, dst


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_one_call_moves_what_the_indexed_copies_move(monkeypatch, dtype):
    data = torch.Generator().manual_seed(3)
    for trial in range(30):
        rows = sorted(torch.randperm(4, generator=data)[: 1 + trial % 4].tolist())
        src, dst = _moves(data, rows)
        mine, python = (_layers(torch.Generator().manual_seed(trial), dtype) for _ in range(2))
        keep_paths(mine, rows, src, dst)
        with monkeypatch.context() as patch:
            patch.setattr(batch_cache.q4_kernel, "is_loaded", lambda: False)
            keep_paths(python, rows, src, dst)
        for a, b in zip(mine, python, strict=True):
            assert torch.equal(a._keys, b._keys) and torch.equal(a._values, b._values)
        moved = any(s != d for row_src, row_dst in zip(src, dst, strict=True) for s, d in zip(row_src, row_dst, strict=True))
        assert moved == (not torch.equal(mine[0]._keys, _layers(torch.Generator().manual_seed(trial), dtype)[0]._keys))


def test_positions_outside_the_buffer_are_refused():
    layers = _layers(torch.Generator().manual_seed(0), torch.float32, 1)
    with pytest.raises(RuntimeError, match="outside the buffer"):
        keep_paths(layers, [0], [[40]], [[0]])
    with pytest.raises(RuntimeError, match="out of range"):
        keep_paths(layers, [4], [[1]], [[0]])


def test_a_commit_on_the_real_model_keeps_the_same_entries(monkeypatch, default_model, spec_bench_subset):
    """Two batched targets, one committing through the kernel and one through the indexed copies: after
    the same tree passes and branch paths, every layer's buffers are equal and so are the next logits."""
    prompts = [list(range(100, 130)), list(range(200, 211))]
    targets = []
    for kernel in (True, False):
        with monkeypatch.context() as patch:
            patch.setattr(batch_cache.q4_kernel, "is_loaded", lambda kernel=kernel: kernel)
            target = BatchedTarget(TargetModel(default_model.model))
            for prompt in prompts:
                target.add(prompt)
            for trees, paths in [
                ([DraftTree.from_branches(5, [[1, 2, 3], [4, 5, 6]]), DraftTree.from_branches(7, [[8], [9, 10]])],
                 [[0, 4, 5, 6], [0, 2, 3]]),
                ([DraftTree.from_branches(3, [[4], [5, 6]]), DraftTree.chain(2, [1])], [[0, 2], [0, 1]]),
            ]:
                target.verify_trees(trees)
                target.commit(paths)
            targets.append(target)
    kernel, python = targets
    assert kernel.lengths == python.lengths == [36, 16]  # the prompts, then 4 and 2 / 3 and 2 kept
    for a, b in zip(kernel.cache.layers, python.cache.layers, strict=True):
        assert torch.equal(a._keys, b._keys) and torch.equal(a._values, b._values)
    trees = [DraftTree.chain(11), DraftTree.chain(12)]
    for (a, _), (b, _) in zip(kernel.verify_trees(trees), python.verify_trees(trees), strict=True):
        assert torch.equal(a, b)
