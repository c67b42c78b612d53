"""The target model verifying B draft trees in one forward pass, each row on its own KV prefix.

Why this exists: on a CPU a pass over 8 tokens costs about what a pass over 1
does (the weights are read once either way), so verifying several sequences'
trees together multiplies throughput. Each row's tree sits below its own
committed prefix; rows are padded to the longest tree of the pass.

Padded rows, not packed ones: packing every row's nodes along one token axis
(batch size 1) would need all rows' KV entries in one sequence, so every query
would attend over every row's context (B times the attention work) and a commit
would move other rows' entries; padding wastes only the pass's padding tokens,
which the shared node budget (`specdec.engine.planner`) keeps few.

Invariants:
- rows are slots 0..B-1 in admission order, kept contiguous: a finished row's
  slot takes the last row (`remove` returns the slot that moved);
- a row's cache holds exactly its committed tokens between passes; `verify_trees`
  then `commit` leaves each row's accepted path contiguous, as `TargetModel` does
  for one sequence, so every row's logits equal (up to float summation order) a
  single-sequence run of that row;
- prefill runs one joining sequence alone and copies its entries into the row;
  the batched pass never prefills. `add` prefills in one piece on the single
  target's cache; `PromptFill` runs a prompt a chunk at a time on a staging cache
  of this batch's own (between batched passes, so a long prompt never holds the
  other rows for more than one chunk), one prompt at a time: the staging cache
  belongs to the last `PromptFill` that advanced, and a new one starts it afresh.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from transformers.cache_utils import Cache

from specdec.backends.contract import PromptFill
from specdec.backends.torch.attention_plan import MATERIALIZED_CHUNK
from specdec.backends.torch.batch_cache import BatchedLayer, BatchLayout, batched_cache, keep_paths
from specdec.backends.torch.fused import KeySequences
from specdec.backends.torch.graphs import GraphedPass, padded_ancestry
from specdec.backends.torch.kv_cache import preallocated_cache
from specdec.backends.torch.prompt_cache import DEFAULT_MAX_BYTES, Prefilled, PromptCache
from specdec.backends.torch.target import TargetModel
from specdec.tree import DraftTree

# A compiled pass (`specdec.backends.compiled.CompiledPass`): (transformers inputs, capture, the layout's window)
# -> (logits, features).
Pass = Callable[[dict, tuple[int, ...], torch.Tensor], tuple[torch.Tensor, torch.Tensor | None]]


class BatchedTarget:
    """B sequences' KV caches over one model, verified together."""

    def __init__(
        self, single: TargetModel, compiled: Pass | None = None, graphed: GraphedPass | None = None,
        prompt_bytes: int = DEFAULT_MAX_BYTES,
    ) -> None:
        """single: the one-sequence target (prefill, model, head and attention plan come from it);
        compiled: the pass that verifies trees when the backend is "compiled" (`specdec.backends.compiled`);
        graphed: the bucketed static pass that verifies them on a GPU (`specdec.backends.torch.graphs`);
        prompt_bytes: what whole-prompt prefills kept for the same prompt again may hold (`prompt_cache`)."""
        self.single = single
        self.prompts = PromptCache(prompt_bytes)
        self.compiled = compiled
        self.graphed = graphed
        self.device = single.device
        self.dtype = single.dtype
        self.layout = BatchLayout()
        self.cache = batched_cache(single.num_layers, self.layout)
        self.lengths: list[int] = []  # committed tokens per row
        self._pending: list[int] = []  # tree sizes of the last pass, awaiting commit
        self._staging: Cache | None = None  # a chunked prefill's entries (`PromptFill`), made on first use
        self._staged_for: PromptFill | None = None  # whose entries the staging cache holds
        # Hidden-state indices every pass returns as features (`TargetModel.run`): what the rows' draft
        # heads read (`Proposer.feature_layers`); empty for methods that read none.
        self.capture: tuple[int, ...] = ()
        self.invariant = single.attention is not None and single.attention.is_invariant
        # Invariant passes on transformers' modules run at least 2 rows (see `_tree_inputs`); the fused pass
        # (`specdec.backends.torch.fused`) is row-independent at any row count, so it takes no padding.
        self.padded = self.invariant and not single.runs_fused

    @property
    def num_rows(self) -> int:
        return len(self.lengths)

    @property
    def _layers(self) -> list[BatchedLayer]:
        return self.cache.layers

    def add(self, prompt_ids: Sequence[int]) -> tuple[int, torch.Tensor, torch.Tensor | None]:
        """Prefill a new row in one piece; returns what `fill` returns for its last chunk."""
        return self.fill(PromptFill(prompt_ids), len(prompt_ids))

    @torch.inference_mode()
    def fill(self, prompt: PromptFill, max_tokens: int) -> tuple[int, torch.Tensor, torch.Tensor | None] | None:
        """Run the next `max_tokens` (at most) of a prompt on the staging cache. When that was its last
        chunk, the prompt becomes a new row: returns (its slot, the last position's logits [V], the
        captured features at every prompt position [L, F] or None); else None. A prompt run in one piece
        is kept in `prompts`, and the same prompt in one piece again is taken from there, not run."""
        if self._pending:
            raise RuntimeError("commit the running pass before adding a row")
        if self._staged_for is not prompt or prompt.done == 0:  # a new prompt (an earlier one left)
            whole = max_tokens >= prompt.ids.numel()  # in one piece: what the prompt cache holds
            key = PromptCache.key(prompt.ids, self.capture) if whole and self.prompts.max_bytes else None
            cached = self.prompts.get(key) if key is not None else None
            if cached is not None:
                self._staged_for, prompt.done = None, prompt.ids.numel()
                features = None if cached.features is None else cached.features.clone()
                return self._take(cached.entries, prompt.done), cached.logits.clone(), features
            if self._staging is None:
                self._staging = preallocated_cache(self.single.num_layers, self.single.capacity)
            self._staging.reset()
            self._staged_for, prompt.done, prompt.features = prompt, 0, []
        else:
            key = None
        per_pass = MATERIALIZED_CHUNK if self.invariant else max_tokens
        end = min(prompt.done + max_tokens, prompt.ids.numel())
        while prompt.done < end:  # passes of at most `per_pass` tokens (see TargetModel.prefill)
            ids = prompt.ids[prompt.done : min(end, prompt.done + per_pass)][None].to(self.device)
            logits, features = self.single.run(ids, None, None, self._staging, prompt.done, True, self.capture)
            prompt.done += ids.shape[1]
            if features is not None:
                prompt.features.append(features[0])
        if prompt.done < prompt.ids.numel():
            return None
        self._staged_for = None
        features = torch.cat(prompt.features) if prompt.features else None
        length = prompt.done
        entries = tuple((layer.keys[0, :, :length], layer.values[0, :, :length]) for layer in self._staging.layers)
        if key is not None:
            self.prompts.put(key, Prefilled(entries, logits[0, -1], features))
        return self._take(entries, length), logits[0, -1], features

    def _take(self, entries: Sequence[tuple[torch.Tensor, torch.Tensor]], length: int) -> int:
        """Put a prompt's `length` entries (per layer keys and values [kv_heads, L, D]) into a new row;
        returns its slot."""
        row = self.num_rows
        for mine, (keys, values) in zip(self._layers, entries, strict=True):
            mine.write_row(row, keys, values)
        self.lengths.append(length)
        return row

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
    def verify_trees(self, trees: Sequence[DraftTree]) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
        """One forward pass over every row's tree (trees[b] for row b); per row, logits [n_b, V] and the
        captured features [n_b, F] (None when `capture` is empty)."""
        if len(trees) != self.num_rows or not trees:
            raise ValueError(f"need one tree per row ({self.num_rows}), got {len(trees)}")
        if self._pending:
            raise RuntimeError("commit the previous pass before verifying another")
        self.layout.starts = torch.tensor(self.lengths, dtype=torch.int64)
        self.layout.context = max(self.lengths)
        if self.compiled is not None:
            logits, features = self._run_compiled(trees)
        elif self.graphed is not None and self.graphed.fits(len(trees), max(tree.num_nodes for tree in trees)):
            logits, features = self._run_graphed(trees)
        else:
            keys = None
            if len(trees) == 1 and trees[0].is_chain and (trees[0].num_nodes > 1 or not self.padded):
                # One sequence, a chain: the ordinary causal case; transformers builds its own mask (none
                # at all for one token) from the cache length, as a plain decoding step does.
                tokens, positions, mask = trees[0].tokens[None], None, None
            elif self.single.runs_fused:  # the fused pass reads each row's key sequence: no mask needed
                tokens, positions = self._tree_tokens(trees)
                mask, keys = None, KeySequences.of_trees(trees, self.lengths, tokens.shape[1])
            else:
                tokens, positions, mask = self._tree_inputs(trees)
            logits, features = self.single.run(
                tokens.to(self.device), positions, mask, self.cache, self.layout.context, capture=self.capture,
                keys=keys,
            )  # [B, T, V], [B, T, F] or None
        self._pending = [tree.num_nodes for tree in trees]
        return [
            (logits[b, : tree.num_nodes], None if features is None else features[b, : tree.num_nodes])
            for b, tree in enumerate(trees)
        ]

    @torch.inference_mode()
    def verify_token(self, token: torch.Tensor) -> torch.Tensor:
        """The one row's graphed pass over one node whose token is a device tensor [1], never read on the host
        (a draft's chain picked on the device: `GraphedSequence.greedy_chain`); the logits after it [V].
        Committed as any pass's (`commit([[0]])`)."""
        if self.num_rows != 1 or self.graphed is None:
            raise ValueError("a token on the device is verified on one row of the graphed pass")
        if self._pending:
            raise RuntimeError("commit the previous pass before verifying another")
        self.layout.starts = torch.tensor(self.lengths, dtype=torch.int64)
        self.layout.context = self.lengths[0]
        logits, _ = self._run_graphed([DraftTree.chain(0)], tokens=token.reshape(1, 1))
        self._pending = [1]
        return logits[0, 0]

    def _run_compiled(self, trees: Sequence[DraftTree]) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The pass on the compiled path: the rows' trees and the layout's window as tensors."""
        width = max(max(tree.num_nodes for tree in trees), 2)  # see `specdec.backends.compiled.CompiledPass.mark`
        for layer in self._layers:
            layer.ensure(self.num_rows, self.layout.context + width)
        tokens, positions, mask = self._tree_inputs(trees, width)
        self.layout.window = torch.arange(self.layout.context + width, device=self.device)
        inputs = dict(input_ids=tokens.to(self.device), position_ids=positions, attention_mask=mask,
                      past_key_values=self.cache, use_cache=True)
        try:
            return self.compiled(inputs, self.capture, self.layout.window)
        finally:
            self.layout.window = None  # the other passes on this cache (prefill copies) are eager

    def _run_graphed(self, trees: Sequence[DraftTree], tokens: torch.Tensor | None = None
                     ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The pass padded to its bucket (`specdec.backends.torch.graphs`): padded rows and nodes see only
        themselves, every row attends over the cache's whole capacity. Returns the live rows' outputs,
        copied out of the graph's (its next replay overwrites them). tokens: the padded tokens [B', T'] on
        the device, in place of the trees' (which then give the shape alone)."""
        live = len(trees)
        rows, width = self.graphed.shape(live, max(tree.num_nodes for tree in trees))
        for layer in self._layers:
            layer.ensure(rows, self.layout.context + width)
        padded = [*trees, *[DraftTree.chain(0)] * (rows - live)]
        starts = torch.tensor([*self.lengths, *[0] * (rows - live)], dtype=torch.int64)
        host_tokens, positions = _padded_tokens(padded, width, starts)
        tokens = host_tokens if tokens is None else tokens
        inputs = dict(tokens=tokens, positions=positions, ancestry=padded_ancestry(padded, width), starts=starts)
        try:
            logits, features = self.graphed.run(inputs, self.cache, self.layout, self.capture)
        finally:
            self.layout.starts = starts[:live]
        return logits[:live].clone(), None if features is None else features[:live].clone()

    def _tree_inputs(
        self, trees: Sequence[DraftTree], min_width: int = 1
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """tokens [B, T], positions [B, T] and the additive mask of a pass over rows padded to width T
        (at least 2 when `padded`: a one-token step then runs the many-row kernels as a tree does,
        its padding node costing next to nothing, and no product needs padding of its own)."""
        tokens, positions = self._tree_tokens(trees, min_width)
        return tokens, positions, self._mask(trees, tokens.shape[1])

    def _tree_tokens(self, trees: Sequence[DraftTree], min_width: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
        """`_tree_inputs`'s tokens [B, T] and positions [B, T]."""
        width = max(max(tree.num_nodes for tree in trees), 2 if self.padded else min_width)
        if len(trees) == 1 and trees[0].num_nodes == width:  # one row, no padding: no tensor ops per row
            tree, start = trees[0], self.lengths[0]
            positions = [start + len(line) - 1 for line in tree.ancestor_lines]  # a node's depth: its line less one
            return tree.tokens[None], torch.tensor([positions], device=self.device)
        tokens, positions = _padded_tokens(trees, width, self.layout.starts)
        return tokens, positions.to(self.device)

    def _mask(self, trees: Sequence[DraftTree], width: int, keys: int | None = None,
              starts: Sequence[int] | None = None) -> torch.Tensor:
        """Additive mask [B, 1, T, K] (K: max(lengths) + T unless given): own prefix, own ancestors;
        padding sees itself. starts: the rows' committed lengths (the live rows' by default)."""
        starts = self.lengths if starts is None else starts
        keys = max(starts) + width if keys is None else keys
        blocked = torch.finfo(self.dtype).min
        allowed = torch.zeros(len(trees), width, keys, dtype=torch.bool)
        for b, (tree, start) in enumerate(zip(trees, starts, strict=True)):
            n = tree.num_nodes
            allowed[b, :, :start] = True
            allowed[b, :n, start : start + n] = tree.ancestor_mask
            pad = torch.arange(n, width)
            allowed[b, pad, start + pad] = True
        mask = torch.zeros(allowed.shape, dtype=self.dtype).masked_fill_(~allowed, blocked)
        return mask[:, None].to(self.device)

    def truncate(self, row: int, length: int) -> None:
        """Keep row `row`'s first `length` committed tokens. The entries past them stay in place, where no
        pass reads them: each pass attends to its row's committed slots and its own tree, written over them."""
        if self._pending:
            raise RuntimeError("commit the running pass before truncating a row")
        if not 0 <= length <= self.lengths[row]:
            raise ValueError(f"cannot truncate a row of {self.lengths[row]} tokens to {length}")
        self.lengths[row] = length

    def rollback(self) -> None:
        """Drop the running pass's trees: every row keeps its committed tokens only."""
        self._pending = []

    def release(self) -> None:
        """Drop every row (their buffers stay allocated for the next ones)."""
        self.rollback()
        while self.num_rows:
            self.remove(self.num_rows - 1)

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
        """Gather the rows' accepted entries to their contiguous places, every layer at once (`keep_paths`)."""
        longest = max(len(path) for _, path in moves)
        src, dst = [], []
        for b, path in moves:  # padded to the longest path by repeating a row's last move
            base, pad = self.lengths[b], longest - len(path)
            src.append([base + node for node in path + path[-1:] * pad])
            dst.append([base + i for i in range(len(path))] + [base + len(path) - 1] * pad)
        keep_paths(self._layers, [b for b, _ in moves], src, dst)


def _padded_tokens(trees: Sequence[DraftTree], width: int, starts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """tokens [B, T] and positions [B, T] (on the CPU) of rows padded to width T after `starts` [B] committed
    tokens: a padding node sits at its row's next position, token 0."""
    tokens = torch.zeros(len(trees), width, dtype=torch.int64)
    positions = starts[:, None].repeat(1, width)
    for b, tree in enumerate(trees):
        tokens[b, : tree.num_nodes] = tree.tokens
        positions[b, : tree.num_nodes] += tree.depths
    return tokens, positions


class OneSequence:
    """One sequence with `TargetModel`'s prefill / forward_tree / trim over a batch's rows (a
    `BatchedTarget` on the compiled pass, or llama.cpp's `LlamaCppBatch`): what the cost curve times
    (`proposers.budget`) where passes run through batch rows, so trees are sized by those passes' costs."""

    def __init__(self, rows: BatchedTarget, config: object, device: torch.device, max_length: int) -> None:
        """rows: anything with `add`, `verify_trees`, `lengths`, `rollback` and `release` as `BatchedTarget`."""
        self.rows = rows
        self.config, self.device, self.max_length = config, device, max_length

    @property
    def num_cached(self) -> int:
        return self.rows.lengths[0] if self.rows.lengths else 0

    def prefill(self, token_ids: Sequence[int] | torch.Tensor) -> torch.Tensor:
        self.rows.release()
        return self.rows.add(torch.as_tensor(token_ids).tolist())[1]

    def forward_tree(self, tokens: torch.Tensor, parents: torch.Tensor) -> torch.Tensor:
        return self.rows.verify_trees([DraftTree(tokens.to(torch.int64), parents.to(torch.int64))])[0][0]

    def trim(self, length: int) -> None:
        """Drop the pending tree; only the committed length is supported (what a timing needs)."""
        if length != self.num_cached:
            raise ValueError("a batch-row sequence is trimmed back to its committed tokens only")
        self.rows.rollback()

    def close(self) -> None:
        self.rows.release()
