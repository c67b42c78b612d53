"""One verification step: a single target forward pass over every row's draft tree.

Why a module of its own: every method (retrieval, draft model, lookahead, plain
decoding) goes through exactly this, so losslessness lives in one place. The
target scores every node of every row at once, the acceptance rule picks, per
row, the path the target itself would have produced, the KV cache keeps only
those paths, and the logits at each row's last accepted node are handed on: the
emitted final token was drawn from them, and LogitSpec reads its next-next
candidates from them.

Invariants: a row's result depends only on its own tree, logits and draws (its
own generator and position uniforms), never on what shares the pass;
`result.tokens` is never empty (at least the bonus/recovered token) and
`result.tokens[:-1]` are the tokens of `result.path[1:]`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from specdec.engine.accept import accept
from specdec.engine.uniforms import PositionUniforms
from specdec.sampling import SamplingParams
from specdec.tree import DraftTree

if TYPE_CHECKING:
    from specdec.backends.contract import Rows


@dataclass(frozen=True)
class Draws:
    """How one row draws its tokens: its sampling settings and its own random numbers."""

    sampling: SamplingParams
    generator: torch.Generator | None
    positions: PositionUniforms  # token t of the row is drawn with the t-th uniform (`uniforms`)
    multi_draft: str = "specinfer"  # drawn siblings: "specinfer" (one by one) or "spectr" (`spectr`)


@dataclass(frozen=True)
class VerifyResult:
    tokens: list[int]  # emitted: accepted draft tokens, then one bonus or recovered token
    path: list[int]  # accepted node indices, root first
    target_logits: torch.Tensor  # [N, V] target logits at every tree node (row i predicts i's child)
    tree: DraftTree
    features: torch.Tensor | None = None  # [N, F] the target's captured features at every node, if asked

    @property
    def next_logits(self) -> torch.Tensor:
        """[V] logits at the last accepted node: tokens[-1] was drawn from them."""
        return self.target_logits[self.path[-1]]

    @property
    def num_accepted(self) -> int:
        return len(self.path) - 1


def verify(target: Rows, trees: Sequence[DraftTree], draws: Sequence[Draws]) -> list[VerifyResult]:
    """trees[b], draws[b]: row b's tree and draws -> row b's result, its accepted path committed."""
    passes = target.verify_trees(trees)  # per row: logits [n_b, V], features; one forward pass
    results = []
    for tree, (target_logits, features), row in zip(trees, passes, draws, strict=True):
        acceptance = accept(tree, target_logits, row.sampling, row.generator, row.positions, row.multi_draft)
        results.append(VerifyResult(acceptance.tokens, acceptance.path, target_logits, tree, features))
    target.commit([result.path for result in results])
    return results
