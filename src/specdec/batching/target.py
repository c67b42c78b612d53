"""The target model verifying B draft trees in one forward pass, each row on its own KV prefix.

Why this exists: on a CPU a pass over 8 tokens costs about what a pass over 1
does (the weights are read once either way), so verifying several sequences'
trees together multiplies throughput. Each row's tree sits below its own
committed prefix; rows are padded to the longest tree of the pass.

Padded rows, not packed ones: packing every row's nodes along one token axis
(batch size 1) would need all rows' KV entries in one sequence, so every query
would attend over every row's context (B times the attention work) and a commit
would move other rows' entries; padding wastes only the pass's padding tokens,
which the shared node budget (`specdec.batching.planner`) keeps few.

Invariants:
- rows are slots 0..B-1 in admission order, kept contiguous: a finished row's
  slot takes the last row (`remove` returns the slot that moved);
- a row's cache holds exactly its committed tokens between passes; `verify_trees`
  then `commit` leaves each row's accepted path contiguous, as `TargetModel` does
  for one sequence, so every row's logits equal (up to float summation order) a
  single-sequence run of that row;
- prefill runs one joining sequence alone (`TargetModel`) and copies its entries
  into the row; the batched pass never prefills.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from specdec.batching.cache import BatchedLayer, BatchLayout, batched_cache
from specdec.target import TargetModel
from specdec.tree import DraftTree


class BatchedTarget:
    """B sequences' KV caches over one model, verified together."""

    def __init__(self, single: TargetModel) -> None:
        """single: the one-sequence target (prefill, model, head and attention plan come from it)."""
        self.single = single
        self.device = single.device
        self.dtype = single.dtype
        self.layout = BatchLayout()
        self.cache = batched_cache(single.num_layers, self.layout)
        self.lengths: list[int] = []  # committed tokens per row
        self._pending: list[int] = []  # tree sizes of the last pass, awaiting commit

    @property
    def num_rows(self) -> int:
        return len(self.lengths)

    @property
    def _layers(self) -> list[BatchedLayer]:
        return self.cache.layers

    @torch.inference_mode()
    def add(self, prompt_ids: Sequence[int]) -> tuple[int, torch.Tensor]:
        """Prefill a new row alone; returns (its slot, the last position's logits [V])."""
        if self._pending:
            raise RuntimeError("commit the running pass before adding a row")
        logits = self.single.prefill(prompt_ids)
        row = self.num_rows
        for mine, theirs in zip(self._layers, self.single.cache.layers, strict=True):
            mine.write_row(row, theirs.keys[0], theirs.values[0])
        self.lengths.append(len(prompt_ids))
        return row, logits

    @torch.inference_mode()
    def remove(self, row: int) -> int | None:
        """Free a row; the last row moves into its slot. Returns the slot that moved (None if none)."""
        if self._pending:
            raise RuntimeError("commit the running pass before removing a row")
        last = self.num_rows - 1
        if row != last:
            for layer in self._layers:
                layer.move_row(last, row, self.lengths[last])
            self.lengths[row] = self.lengths[last]
        self.lengths.pop()
        return last if row != last else None

    @torch.inference_mode()
    def verify_trees(self, trees: Sequence[DraftTree]) -> list[torch.Tensor]:
        """One forward pass over every row's tree (trees[b] for row b); logits [n_b, V] per row."""
        if len(trees) != self.num_rows or not trees:
            raise ValueError(f"need one tree per row ({self.num_rows}), got {len(trees)}")
        if self._pending:
            raise RuntimeError("commit the previous pass before verifying another")
        self.layout.starts = torch.tensor(self.lengths, dtype=torch.int64)
        self.layout.context = max(self.lengths)
        if len(trees) == 1 and trees[0].is_chain:
            # One sequence, a chain: the ordinary causal case; transformers builds its own mask (none at
            # all for one token) from the cache length, as a plain decoding step does.
            tokens, positions, mask = trees[0].tokens[None], None, None
        else:
            tokens, positions, mask = self._tree_inputs(trees)
        logits = self.single.run(
            tokens.to(self.device), positions, mask, self.cache, self.layout.context
        )  # [B, T, V]
        self._pending = [tree.num_nodes for tree in trees]
        return [logits[b, : tree.num_nodes] for b, tree in enumerate(trees)]

    def _tree_inputs(self, trees: Sequence[DraftTree]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """tokens [B, T], positions [B, T] and the additive mask of a pass over rows padded to width T."""
        width = max(tree.num_nodes for tree in trees)
        starts = self.layout.starts
        tokens = torch.zeros(len(trees), width, dtype=torch.int64)  # [B, T]
        positions = starts[:, None].repeat(1, width)  # [B, T]; padding sits at the row's next position
        for b, tree in enumerate(trees):
            tokens[b, : tree.num_nodes] = tree.tokens
            positions[b, : tree.num_nodes] += tree.depths
        return tokens, positions.to(self.device), self._mask(trees, width)

    def _mask(self, trees: Sequence[DraftTree], width: int) -> torch.Tensor:
        """Additive mask [B, 1, T, max(lengths) + T]: own prefix, own ancestors; padding sees itself."""
        keys = max(self.lengths) + width
        blocked = torch.finfo(self.dtype).min
        allowed = torch.zeros(len(trees), width, keys, dtype=torch.bool)
        for b, (tree, start) in enumerate(zip(trees, self.lengths, strict=True)):
            n = tree.num_nodes
            allowed[b, :, :start] = True
            allowed[b, :n, start : start + n] = tree.ancestor_mask
            pad = torch.arange(n, width)
            allowed[b, pad, start + pad] = True
        mask = torch.zeros(allowed.shape, dtype=self.dtype).masked_fill_(~allowed, blocked)
        return mask[:, None].to(self.device)

    @torch.inference_mode()
    def commit(self, paths: Sequence[Sequence[int]]) -> None:
        """Keep each row's accepted path (root first) contiguously after its committed tokens."""
        if len(paths) != len(self._pending):
            raise ValueError(f"need one path per row of the pass ({len(self._pending)}), got {len(paths)}")
        moves: list[tuple[int, list[int]]] = []
        for b, (path, size) in enumerate(zip(paths, self._pending, strict=True)):
            path = list(path)
            if not path or path[0] != 0 or max(path) >= size:
                raise ValueError(f"row {b}: commit needs a root-first path inside the tree, got {path}")
            if path != list(range(len(path))):
                moves.append((b, path))
        if moves:
            self._move(moves)
        for b, path in enumerate(paths):
            self.lengths[b] += len(path)
        self._pending = []

    def _move(self, moves: list[tuple[int, list[int]]]) -> None:
        """Gather the rows' accepted entries to their contiguous places, every layer in one indexed copy."""
        longest = max(len(path) for _, path in moves)
        rows = torch.tensor([b for b, _ in moves], device=self.device)[:, None]  # [R, 1]
        src = torch.tensor([path + path[-1:] * (longest - len(path)) for _, path in moves])  # [R, P]
        dst = torch.tensor(
            [list(range(len(path))) + [len(path) - 1] * (longest - len(path)) for _, path in moves]
        )
        base = torch.tensor([self.lengths[b] for b, _ in moves])[:, None]
        src, dst = (src + base).to(self.device), (dst + base).to(self.device)
        for layer in self._layers:
            layer.keep_paths(rows, src, dst)
