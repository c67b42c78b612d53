"""Draft token trees: the one shape every proposer hands to verification.

A tree holds `tokens[N]` and `parents[N]`. Node 0 is the root: the token that is
already decided for this step (sampled or argmaxed from the previous step's last
logits) and is not yet in the target's KV cache. Every other node is a guess.

Invariants (checked on construction, so a bad proposer fails loudly, not subtly):
- `parents[0] == -1` and `0 <= parents[i] < i` for i > 0: a parent comes before
  its children, which also rules out cycles;
- token ids and parents are int64, one-dimensional, of the same length N >= 1;
- `draft_probs`, when present, is float32 `[N, V]`: row i is the draft
  distribution token i was drawn from (row 0 is unused). `None` means the drafts
  are deterministic guesses (retrieval), which the acceptance rules treat as such.

A chain is the tree `parents = [-1, 0, 1, ...]`. Trees built from branches
(`from_branches`) merge identical siblings into a trie. Trees with draft
probabilities are never merged: the multi-draft rule needs every sibling as it
was drawn, duplicates included.

The derived views (depths, ancestor-or-self mask, children) are computed once,
lazily, with a loop over depth rather than over node pairs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

import torch


class TreeError(ValueError):
    """A draft tree that breaks the invariants above."""


def ancestry(parents: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Ancestor-or-self mask and depths of a tree given by its parent array.

    parents: [N] int64 with parents[0] == -1 and parents[i] < i.
    Returns (mask [N, N] bool with mask[i, j] = j is i or an ancestor of i,
             depths [N] int64 with depths[0] == 0).
    """
    return _as_tensors(ancestor_lines(parents.tolist()), parents.device)


def _as_tensors(lines: list[list[int]], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """`ancestry`'s (mask, depths) from `ancestor_lines`."""
    size = len(lines)
    rows = [node for node, line in enumerate(lines) for _ in line]
    columns = [ancestor for line in lines for ancestor in line]
    mask = torch.zeros(size, size, dtype=torch.bool)
    mask[torch.tensor(rows, dtype=torch.int64), torch.tensor(columns, dtype=torch.int64)] = True
    depths = torch.tensor([len(line) - 1 for line in lines], dtype=torch.int64)
    return mask.to(device), depths.to(device)


def ancestor_lines(parents: Sequence[int]) -> list[list[int]]:
    """Each node's ancestors and itself, root first, from its parent list (parents[i] < i).

    On lists: a step's tree has a few to 64 nodes, where each tensor op would cost more than the walk."""
    lines: list[list[int]] = []
    for node, parent in enumerate(parents):
        if parent >= node:
            raise ValueError(f"node {node}'s parent {parent} must come before it (parents[i] < i)")
        lines.append([*lines[parent], node] if parent >= 0 else [node])
    return lines


@dataclass(frozen=True, eq=False)
class DraftTree:
    tokens: torch.Tensor  # [N] int64
    parents: torch.Tensor  # [N] int64
    draft_probs: torch.Tensor | None = None  # [N, V] float32 or None

    def __post_init__(self) -> None:
        tokens, parents = self.tokens, self.parents
        if tokens.dim() != 1 or parents.dim() != 1:
            raise TreeError("tokens and parents must be one-dimensional")
        if tokens.shape[0] == 0:
            raise TreeError("a draft tree needs at least the root node")
        if tokens.shape != parents.shape:
            raise TreeError(f"tokens ({tokens.shape[0]}) and parents ({parents.shape[0]}) differ in length")
        if tokens.dtype != torch.int64 or parents.dtype != torch.int64:
            raise TreeError("tokens and parents must be int64")
        # checked on the list (a step's tree has a few to 64 nodes: tensor ops would cost more than the checks)
        listed = self.parent_list
        if listed[0] != -1:
            raise TreeError("node 0 is the root: parents[0] must be -1")
        if not all(0 <= parent < node for node, parent in enumerate(listed[1:], start=1)):
            raise TreeError("every parent must come before its child (0 <= parents[i] < i)")
        if self.draft_probs is not None:
            if self.draft_probs.dim() != 2 or self.draft_probs.shape[0] != tokens.shape[0]:
                raise TreeError("draft_probs must be [N, V] with one row per node")

    # ----------------------------------------------------------------- builders
    @classmethod
    def of_lists(
        cls, tokens: Sequence[int], parents: Sequence[int], draft_probs: torch.Tensor | None = None
    ) -> DraftTree:
        """A tree from its token and parent lists (ints), both in one tensor: every step builds a tree, and in
        the work around a pass each tensor made costs tens of microseconds (docs/benchmarks.md). The token
        list is kept as `token_list`, which acceptance reads."""
        tokens = [int(token) for token in tokens]
        if len(tokens) != len(parents):
            raise TreeError(f"tokens ({len(tokens)}) and parents ({len(parents)}) differ in length")
        both = torch.tensor([tokens, list(parents)], dtype=torch.int64)
        tree = cls(both[0], both[1], draft_probs)
        tree.__dict__["token_list"] = tokens  # the cached property's value, as `tokens.tolist()` would give it
        return tree

    @classmethod
    def chain(cls, root: int, drafts: Sequence[int] = (), draft_probs: torch.Tensor | None = None) -> DraftTree:
        """A chain root -> drafts[0] -> drafts[1] -> ...; draft_probs [1 + len(drafts), V] if given."""
        return cls.of_lists([root, *drafts], range(-1, len(drafts)), draft_probs)

    @classmethod
    def from_branches(
        cls, root: int, branches: Sequence[Sequence[int]], max_nodes: int | None = None
    ) -> DraftTree:
        """Merge token branches below `root` into a trie of at most `max_nodes` nodes (root included).

        Branches earlier in the list win the budget: nodes are added branch by branch
        and a branch is cut where the budget runs out.
        """
        if max_nodes is not None and max_nodes < 1:
            raise TreeError(f"max_nodes must be >= 1 (got {max_nodes})")
        tokens, parents = [root], [-1]
        child_of: dict[tuple[int, int], int] = {}
        for branch in branches:
            node = 0
            for token in branch:
                key = (node, int(token))
                if key not in child_of:
                    if max_nodes is not None and len(tokens) >= max_nodes:
                        break
                    child_of[key] = len(tokens)
                    tokens.append(int(token))
                    parents.append(node)
                node = child_of[key]
        return cls.of_lists(tokens, parents)

    def merged(self) -> DraftTree:
        """The same tree with identical siblings merged (a trie); deterministic trees only."""
        if self.draft_probs is not None:
            raise TreeError("trees with draft_probs are not merged: the multi-draft rule needs every sibling")
        return DraftTree.from_branches(self.token_list[0], [self.path_tokens(leaf)[1:] for leaf in self.leaves])

    # ------------------------------------------------------------ derived views
    @property
    def num_nodes(self) -> int:
        return self.tokens.shape[0]

    @cached_property
    def token_list(self) -> list[int]:
        return self.tokens.tolist()

    @cached_property
    def parent_list(self) -> list[int]:
        return self.parents.tolist()

    @cached_property
    def is_chain(self) -> bool:
        """Every node's parent is the node before it (the ordinary causal case)."""
        return self.parent_list == list(range(-1, self.num_nodes - 1))

    @cached_property
    def _ancestry(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self.is_chain:  # plain decoding's root alone, prompt lookup's chains: no walk needed
            size, device = self.num_nodes, self.parents.device
            return torch.ones(size, size, dtype=torch.bool, device=device).tril_(), torch.arange(size, device=device)
        return _as_tensors(self.ancestor_lines, self.parents.device)

    @cached_property
    def ancestor_lines(self) -> list[list[int]]:
        """Each node's ancestors and itself, root first (`ancestor_lines`)."""
        return ancestor_lines(self.parent_list)

    @property
    def ancestor_mask(self) -> torch.Tensor:
        """[N, N] bool: mask[i, j] is True when node j is node i or one of its ancestors."""
        return self._ancestry[0]

    @property
    def depths(self) -> torch.Tensor:
        """[N] int64: edges from the root (the root has depth 0)."""
        return self._ancestry[1]

    @cached_property
    def children(self) -> list[list[int]]:
        kids: list[list[int]] = [[] for _ in range(self.num_nodes)]
        for node, parent in enumerate(self.parent_list[1:], start=1):
            kids[parent].append(node)
        return kids

    @cached_property
    def leaves(self) -> list[int]:
        return [node for node, kids in enumerate(self.children) if not kids]

    @cached_property
    def max_depth(self) -> int:
        """Edges from the root to the deepest node. From the node lists, not `depths`: the engine asks
        every step, and the fused pass never needs the [N, N] tensors that `depths` comes with."""
        if self.is_chain:
            return self.num_nodes - 1
        return max(map(len, self.ancestor_lines)) - 1

    def path(self, node: int) -> list[int]:
        """Node indices from the root down to `node`, both included."""
        nodes = []
        while node >= 0:
            nodes.append(node)
            node = self.parent_list[node]
        return nodes[::-1]

    def path_tokens(self, node: int) -> list[int]:
        return [self.token_list[i] for i in self.path(node)]

    def paths(self) -> list[list[int]]:
        """Every root-to-leaf path as node indices."""
        return [self.path(leaf) for leaf in self.leaves]
