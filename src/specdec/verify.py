"""One verification step: a single target forward pass over a draft tree.

Why a module of its own: every method (retrieval, draft model, lookahead, plain
decoding) goes through exactly this, so losslessness lives in one place. The
target scores every node at once, the acceptance rule picks the path the target
itself would have produced, the KV cache keeps only that path, and the logits at
the last accepted node are handed on: the emitted final token was drawn from
them, and LogitSpec reads its next-next candidates from them.

Invariant: `result.tokens` is never empty (at least the bonus/recovered token)
and `result.tokens[:-1]` are the tokens of `result.path[1:]`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specdec.sampling import SamplingParams, accept
from specdec.target import TargetModel
from specdec.tree import DraftTree
from specdec.uniforms import PositionUniforms


@dataclass(frozen=True)
class VerifyResult:
    tokens: list[int]  # emitted: accepted draft tokens, then one bonus or recovered token
    path: list[int]  # accepted node indices, root first
    target_logits: torch.Tensor  # [N, V] target logits at every tree node (row i predicts i's child)
    tree: DraftTree

    @property
    def next_logits(self) -> torch.Tensor:
        """[V] logits at the last accepted node: tokens[-1] was drawn from them."""
        return self.target_logits[self.path[-1]]

    @property
    def num_accepted(self) -> int:
        return len(self.path) - 1


def verify(
    target: TargetModel,
    tree: DraftTree,
    sampling: SamplingParams,
    generator: torch.Generator | None,
    positions: PositionUniforms | None = None,
) -> VerifyResult:
    """positions: the request's uniforms by output position (see `specdec.uniforms`)."""
    target_logits = target.forward_tree(tree.tokens, tree.parents)  # [N, V]
    acceptance = accept(tree, target_logits, sampling, generator, positions)
    target.commit(acceptance.path)
    return VerifyResult(acceptance.tokens, acceptance.path, target_logits, tree)
