"""Where each emitted token came from: a draft source of the proposer's tree, or the target itself.

Why: speculation's whole point is which guesses were right, and a picture of it (the server's
playground colours every token by its source) needs that per token, not as totals. The engine
records it only for a row that asks (`Batch.add(on_piece=...)`), so nothing is paid otherwise.

Vocabulary (`Piece.source`): "target" for a token no draft supplied (the prefill's token, and each
step's bonus or recovered token); else the proposer's name for the node the token was accepted at.
LogitSpec names its nodes "pld" (prompt lookup, its floor), "root" (retrieval continuing the last
token), "cand" (next-next retrieval from the last logit's top-k), "third", "recycle", "session",
"datastore", and "draft" (hybrid's draft model); EAGLE with retrieval "head" or "retrieval";
proposers with one source their `draft_source` ("pld", "draft", "head", "lookahead", ...).

Invariants:
- a step's tokens are its accepted path's nodes, then one token the target drew: the former get
  the source of their node in the tree the proposer proposed, found by walking that tree by token
  from the root, so a tree the batch cut or made verifiable maps back (identical siblings are
  merged, so a token path names one node); the last one gets "target";
- a proposer's sources are read right after it proposes (before it observes the result and moves
  on): `node_sources()` (one per node, root first) where it has them, else its `draft_source`
  for every node; a list of the wrong length falls back to `draft_source`;
- a piece of text is the text a token's push released (the text stream may hold text back until
  a later token completes it), so it carries the source of the token that released it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from specdec.tree import DraftTree

TARGET = "target"
DEFAULT_DRAFT_SOURCE = "draft"


@dataclass(frozen=True)
class Piece:
    """A piece of streamed text, with where its token came from."""

    text: str
    source: str  # a draft source, or TARGET
    step: int  # the forward pass that emitted the token (0: the prefill's)
    token: int  # the token's index among the generated ones


def node_sources(proposer: Any, tree: DraftTree) -> list[str]:
    """The source of each node of the tree `proposer` just proposed (root first)."""
    named = getattr(proposer, "node_sources", None)  # proposers outside the registry may lack it
    sources = named() if named is not None else None
    if sources is None or len(sources) != tree.num_nodes:
        return [TARGET] + [getattr(proposer, "draft_source", DEFAULT_DRAFT_SOURCE)] * (tree.num_nodes - 1)
    return list(sources)


class Provenance:
    """One row's last proposed tree and its node sources; tags each step's emitted tokens."""

    def __init__(self) -> None:
        self.tree: DraftTree | None = None
        self.sources: list[str] = []

    def drafted(self, proposer: Any, tree: DraftTree) -> None:
        self.tree, self.sources = tree, node_sources(proposer, tree)

    def tag(self, tokens: Sequence[int], step: int) -> list[str]:
        """The source of each of a step's emitted tokens (step 0, the prefill's: the target's)."""
        accepted = walk(self.tree, tokens[:-1]) if step > 0 and self.tree is not None else []
        return [self.sources[node] for node in accepted] + [TARGET] * (len(tokens) - len(accepted))


def walk(tree: DraftTree, tokens: Sequence[int]) -> list[int]:
    """The nodes of `tree` below the root along `tokens` (stops where the tree has no such child)."""
    child: dict[tuple[int, int], int] = {}
    for node, (token, parent) in enumerate(zip(tree.token_list, tree.parent_list, strict=True)):
        child.setdefault((parent, token), node)
    nodes: list[int] = []
    node = 0
    for token in tokens:
        node = child.get((node, int(token)), -1)
        if node < 0:
            break
        nodes.append(node)
    return nodes
