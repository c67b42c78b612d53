"""Plain decoding as a proposer that proposes nothing: the tree is the root alone.

It exists so that plain decoding runs through the very loop the speculative
methods use, which makes "token-identical to plain decoding" a like-for-like claim.
"""

from __future__ import annotations

from specdec.engine.generation import ProposalContext
from specdec.models import LoadedModel
from specdec.proposers.base import ProposerBase
from specdec.proposers.schema import method_config
from specdec.tree import DraftTree


@method_config("plain")
class PlainConfig:
    """No options: one token per forward pass."""

    def build(self, loaded: LoadedModel) -> PlainProposer:
        return PlainProposer()


class PlainProposer(ProposerBase):
    prunable = True  # a batch may cut the tree to its budget

    def propose(self, ctx: ProposalContext) -> DraftTree:
        return DraftTree.chain(ctx.token_ids[-1])
