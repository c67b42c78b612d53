"""Token Recycling (Luo et al. 2024, arXiv 2408.08696): draft from the target's own past top-k successors.

Why: every verification pass computes the target's logits at every tree node,
accepted or not, and their top-k tokens are good guesses for what follows that
node's token the next time it appears. Token Recycling keeps them in a [V, k]
successor table ("adjacency matrix") and drafts by walking the table
breadth-first from the root into a tree: no draft model, no datastore. The
table is a list of V rows, each a tuple of up to k ids (about 0.4 MB for
SmolLM2's V = 49,152 before any row is written): a step reads and writes a
few rows, and plain Python on a few rows costs less beside the pass than an
array's indexing (docs/benchmarks.md, "The step around the pass").

Per step:
1. `propose`: expand the table from the root along a static tree shape
   (`static_shape`): the node at rank r below its parent is that parent's r-th
   successor; unknown successors (a row never written) drop their subtree,
   and an end-of-sequence node gets no children (nothing after it is emitted);
2. `observe`: `table.update(tree.tokens, target_logits)`: the row of every
   verified node's token becomes the top-k of the target logits at that node
   (row i of `target_logits` predicts the child of node i). The first step of a
   request also writes the prompt's last token from the prefill logits.

The static shape is chosen best-first under a fixed rank prior: a path's weight
is the product of `RANK_PRIOR / (rank + 1)` over its nodes, and the `budget - 1`
heaviest paths up to `max_depth` levels are kept. With k = 8, 81 nodes and 6
levels this gives level widths (8, 23, 25, 17, 6, 1), close to the authors'
template "2.2.2" (8, 21, 25, 15, 8, 3); the prior was chosen to match that shape,
not fitted to any benchmark's outputs.

Interface for other proposers (LogitSpec uses the table as one of its sources):

    table = RecycleTable.for_loaded(loaded, k)   # shared per loaded model and scope
    table.update(tokens, logits)         # tokens: N ids (a list or an int64 tensor), logits [N, V]
    table.successors(token) -> list[int]   # known successors, best first
    table.branches(root, budget, max_depth, eos_token_ids=()) -> list[list[int]]
        # root-to-leaf token paths (root excluded), depth-first by rank, so that
        # DraftTree.from_branches(root, branches) is exactly the expanded tree and a
        # budget cut keeps the heaviest (lowest-rank) paths

Invariants: the table is shared by every proposer on the same model object and
kept across requests (the paper's "hot start"); it is thread-safe (a row is an
immutable tuple replaced whole, so no draft mixes two versions of a row);
drafts are deterministic (`draft_probs=None`), so verification stays lossless;
trees never exceed `budget` nodes nor `ctx.max_depth` levels, and siblings are
distinct (one table row holds distinct tokens).
"""

from __future__ import annotations

import heapq
import threading
from collections.abc import Iterable, Sequence
from typing import Annotated, Any

import numpy as np
import torch

from specdec.backends.registry import top_tokens
from specdec.engine.generation import ProposalContext
from specdec.engine.verify import VerifyResult
from specdec.models import LoadedModel
from specdec.proposers.base import ProposerBase
from specdec.proposers.plain_lookup import PlainLookup
from specdec.proposers.schema import method_config, option
from specdec.tree import DraftTree

RANK_PRIOR = 0.6  # weight of a rank-r successor: RANK_PRIOR / (r + 1); see the module docstring
MAX_CACHED_SHAPES = 64
Shape = tuple[tuple[int, int, int], ...]  # (parent index, rank, depth) for nodes 1..; node 0 is the root


def static_shape(k: int, budget: int, max_depth: int) -> Shape:
    """The `budget - 1` heaviest rank paths (at most `max_depth` deep), breadth-first.

    Node i + 1 of the tree is `shape[i] = (parent, rank, depth)`; parents come
    before children, and the nodes of depth <= d form a prefix of the shape, so
    a shallower tree is a slice of a deeper one.
    """
    if k < 1 or budget < 1 or max_depth < 0:
        raise ValueError(f"need k >= 1, budget >= 1, max_depth >= 0 (got {k}, {budget}, {max_depth})")
    chosen: list[tuple[int, ...]] = []
    heap: list[tuple[float, tuple[int, ...]]] = []
    if max_depth >= 1:
        heap = [(-RANK_PRIOR / (rank + 1), (rank,)) for rank in range(k)]
        heapq.heapify(heap)
    while heap and len(chosen) < budget - 1:
        score, path = heapq.heappop(heap)
        chosen.append(path)
        if len(path) < max_depth:
            for rank in range(k):  # children weigh less than their parent: the set stays prefix-closed
                heapq.heappush(heap, (score * RANK_PRIOR / (rank + 1), (*path, rank)))
    chosen.sort(key=lambda path: (len(path), path))
    index: dict[tuple[int, ...], int] = {(): 0}
    shape = []
    for i, path in enumerate(chosen, start=1):
        index[path] = i
        shape.append((index[path[:-1]], path[-1], len(path)))
    return tuple(shape)


def depth_prefix(shape: Shape, max_depth: int) -> Shape:
    """The part of `shape` at most `max_depth` levels deep (a prefix, since the shape is breadth-first)."""
    end = len(shape)
    while end and shape[end - 1][2] > max_depth:
        end -= 1
    return shape[:end]


def output_vocab_size(model: Any) -> int:
    """Width of the model's logits: its output embedding's rows, else `config.vocab_size`."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    weight = getattr(head, "weight", None)
    return int(weight.shape[0]) if weight is not None else int(model.config.vocab_size)


class RecycleTable:
    """The [V, k] successor table of one model: row t holds the top-k tokens seen after t, best first."""

    def __init__(self, vocab_size: int, k: int) -> None:
        if vocab_size < 1 or k < 1:
            raise ValueError(f"need vocab_size >= 1 and k >= 1 (got {vocab_size}, {k})")
        self.vocab_size = vocab_size
        self.k = k
        self._successors: list[tuple[int, ...]] = [()] * vocab_size  # (): not seen yet
        self._lock = threading.Lock()  # the shapes' cache
        self._shapes: dict[tuple[int, int], Shape] = {}

    @classmethod
    def for_loaded(cls, loaded: LoadedModel, k: int) -> RecycleTable:
        """The table kept in `loaded.state` for width `k` and `loaded.state_scope`, made empty on first use."""
        key = ("recycle", k, loaded.state_scope)
        return loaded.state.shared(key, lambda: cls(output_vocab_size(loaded.model), k))

    def update(self, tokens: Sequence[int] | torch.Tensor, logits: torch.Tensor, tops: np.ndarray | None = None
               ) -> None:
        """Row tokens[i] := top-k of logits[i]. tokens: N ids; logits: [N, V] (any float dtype, any device).

        tops: [N, >= k] those top ids already on the host, best first (`VerifyResult.tops`): the logits are
        then not read (on an accelerator, no wait); with fewer columns than the table's k they are ignored."""
        ids = tokens.tolist() if isinstance(tokens, torch.Tensor) else list(tokens)
        if logits.dim() != 2 or logits.shape[0] != len(ids):
            raise ValueError(f"need N tokens and logits [N, V], got {len(ids)} and {tuple(logits.shape)}")
        if logits.shape[1] != self.vocab_size:
            raise ValueError(f"logits have {logits.shape[1]} columns; the table has {self.vocab_size} rows")
        width = min(self.k, self.vocab_size)
        if tops is not None and tops.shape == (len(ids), tops.shape[1]) and tops.shape[1] >= width:
            top = tops[:, :width].tolist()
        else:
            top = top_tokens(logits, width).tolist()
        rows = self._successors
        for token, row in zip(ids, top, strict=True):  # a token seen twice: its last node wins
            rows[token] = tuple(t for t in row if t >= 0)  # -1: the kernel's fill after a row's last number

    def successors(self, token: int) -> list[int]:
        """The successors known for `token`, best first (empty when it was never verified)."""
        return list(self._successors[token])

    def shape(self, budget: int, max_depth: int) -> Shape:
        """`static_shape(self.k, budget, max_depth)`, cached per (budget, max_depth)."""
        key = (budget, max_depth)
        with self._lock:
            cached = self._shapes.get(key)
        if cached is None:
            cached = static_shape(self.k, budget, max_depth)
            with self._lock:
                if len(self._shapes) >= MAX_CACHED_SHAPES:
                    self._shapes.clear()
                self._shapes[key] = cached
        return cached

    def expand(
        self, root: int, shape: Shape, eos_token_ids: Iterable[int] = ()
    ) -> tuple[list[int], list[int]]:
        """(tokens, parents) of the tree grown from `root` along `shape`; missing successors drop subtrees."""
        eos = frozenset(eos_token_ids)
        tokens, parents, where = [int(root)], [-1], [0]  # where[i]: tree node of shape node i, or -1
        rows: dict[int, tuple[int, ...]] = {}  # each row read once: a token's row stays one version in a tree
        for parent, rank, _depth in shape:
            node = where[parent]
            token = tokens[node] if node >= 0 else -1
            if node < 0 or token in eos:
                where.append(-1)
                continue
            row = rows.get(token)
            if row is None:
                row = rows[token] = self._successors[token]
            if rank >= len(row):
                where.append(-1)
                continue
            where.append(len(tokens))
            tokens.append(row[rank])
            parents.append(node)
        return tokens, parents

    def branches(
        self, root: int, budget: int, max_depth: int, eos_token_ids: Iterable[int] = ()
    ) -> list[list[int]]:
        """Root-to-leaf token paths (root excluded) of the tree of at most `budget` nodes and `max_depth`
        levels grown from `root`, depth-first with lower ranks first. [] when nothing is known."""
        tokens, parents = self.expand(root, self.shape(budget, max_depth), eos_token_ids)
        return tree_paths(tokens, parents)


def tree_paths(tokens: list[int], parents: list[int]) -> list[list[int]]:
    """Leaf paths (root excluded) of a tree whose children are listed in rank order, depth-first."""
    children: list[list[int]] = [[] for _ in tokens]
    for node in range(1, len(tokens)):
        children[parents[node]].append(node)
    paths: list[list[int]] = []
    stack: list[tuple[int, list[int]]] = [(child, [tokens[child]]) for child in reversed(children[0])]
    while stack:
        node, path = stack.pop()
        if not children[node]:
            paths.append(path)
        stack.extend((child, [*path, tokens[child]]) for child in reversed(children[node]))
    return paths


@method_config("recycle")
class RecycleConfig:
    """Token Recycling: a tree grown from the target's recycled top-k successors.

    k: successors kept per token (paper: 8); budget: most tree nodes, root included
    (the paper's template has 81); max_depth: deepest level below the root (paper: 6).
    """

    # one successor table per k and model, so a request's k is capped tightly
    k: Annotated[int, option(ge=1, request_max=16)] = 8
    budget: Annotated[int, option(ge=1, request_max=96)] = 32
    max_depth: Annotated[int, option(ge=1, request_max=8)] = 6

    def build(self, loaded: LoadedModel) -> RecycleProposer:
        table = RecycleTable.for_loaded(loaded, self.k)
        return RecycleProposer(self, table, loaded.eos_token_ids, PlainLookup.for_loaded(loaded))


class RecycleProposer(ProposerBase):
    deterministic_drafts = True  # draft_probs None: gated by the floor when sampling too
    draft_source = "recycle"
    prunable = True  # a batch may cut the tree to its budget

    def __init__(
        self,
        config: RecycleConfig,
        table: RecycleTable,
        eos_token_ids: Iterable[int] = (),
        lookup: PlainLookup | None = None,
    ) -> None:
        self.config = config
        self.lookup = lookup  # what the floor's plain steps verify (`plain_lookup`)
        self.table = table
        self.eos_token_ids = frozenset(eos_token_ids)
        self.shape = static_shape(config.k, config.budget, config.max_depth)
        self.top_wanted = table.k  # every verified node's row of the table
        self.tops_at_every_node = True
        self._first_step = True

    def begin(self, prompt_ids: list[int]) -> None:
        self._first_step = True
        if self.lookup is not None:
            self.lookup.begin(prompt_ids)

    def propose(self, ctx: ProposalContext) -> DraftTree:
        tokens = ctx.token_ids
        if self._first_step and len(tokens) >= 2:  # the prefill's logits follow the prompt's last token
            self.table.update(tokens[-2:-1], ctx.last_logits[None])
        self._first_step = False
        if ctx.max_depth <= 0 and self.lookup is not None:  # the floor's plain step: a looked-up chain at most
            return self.lookup.propose(ctx)
        shape = depth_prefix(self.shape, min(self.config.max_depth, ctx.max_depth))
        nodes, parents = self.table.expand(tokens[-1], shape, self.eos_token_ids)
        return DraftTree.of_lists(nodes, parents)

    def node_sources(self) -> list[str] | None:
        """"lookup" for a plain step's looked-up chain; else None (`draft_source` for every node)."""
        return self.lookup.node_sources() if self.lookup is not None else None

    def observe(self, result: VerifyResult) -> None:
        if self.lookup is not None:
            self.lookup.observe(result)
        self.table.update(result.tree.token_list, result.target_logits, result.tops)  # a looked-up tree's rows too
