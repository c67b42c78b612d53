"""Lookahead decoding (Fu et al., ICML 2024) mapped onto one token tree per step.

Why: Jacobi iteration lets the target itself guess several future tokens, with
no draft model and no datastore. Its guesses rarely converge in one go, but the
n-grams that appear along its trajectory are often right later; lookahead
decoding keeps them in a pool and verifies the ones that start with the current
token.

The paper runs a 2-D lookahead window (W positions x N-1 past Jacobi levels,
with a purpose-built attention mask that is not a tree) beside a verification
branch of G pool n-grams, all in one forward pass. Our verifier runs one
*tree* per pass, so the mapping here differs, honestly stated:
- lookahead branch = one chain root -> g_1 -> ... -> g_W, the current Jacobi
  guess for the W tokens after the root. Its target logits (which come back in
  `VerifyResult.target_logits` anyway) give the next Jacobi iterate in the same
  pass: g'_j = argmax at node g_{j-1} (root for j = 1), for j = 1..W+1. Only
  the newest level is fed to the model; the older levels are kept on the side;
- n-grams are collected along the diagonals of the last N-1 levels, as in the
  paper: (level t-N+2 at position p-N+2, ..., level t at p-1, the new token at
  p): each token was predicted with the previous one as its immediate context.
  They go into a pool keyed by their first token (most recent first, at most
  `pool_size` per key);
- verification branch = up to G pool continuations of the root token, merged
  with the lookahead chain into one trie. The lookahead chain is itself a
  draft, so its guesses are accepted whenever they are right;
- after a step that emitted e tokens the window slides by e: the new iterate's
  guesses for positions past the new root are kept, and the freed slots at the
  end are filled from the pool (continuations of the last guess) or by
  repeating the last guess.
All acceptance goes through `verify` (greedy, or the deterministic rule when
sampling: the drafts carry no probabilities), so the output is lossless. The
tree is capped at `max_nodes` nodes: on this CPU every node costs a few
percent of a target pass (see the machine notes in DESIGN.md).
"""

from __future__ import annotations

from collections import deque
from typing import Annotated

import torch

from specdec.backends.registry import argmax_rows
from specdec.engine.generation import ProposalContext
from specdec.engine.verify import VerifyResult
from specdec.models import LoadedModel
from specdec.proposers.base import ProposerBase
from specdec.proposers.plain_lookup import PlainLookup
from specdec.proposers.schema import method_config, option
from specdec.tree import DraftTree


@method_config("lookahead")
class LookaheadConfig:
    """Jacobi window W, n-gram size N, G verified n-grams per step (see module docstring)."""

    window: Annotated[int, option(ge=1, request_max=8)] = 4  # W: Jacobi guesses per step
    # N: pool n-grams are a key token + N-1 continuation tokens
    ngram: Annotated[int, option(ge=2, request_max=6)] = 4
    guesses: Annotated[int, option(ge=0, request_max=8)] = 2  # G: pool n-grams verified per step
    pool_size: Annotated[int, option(ge=1, request_max=16)] = 8  # continuations kept per key token
    max_nodes: Annotated[int, option(ge=2, request_max=64)] = 16  # tree budget, root included

    def __post_init__(self) -> None:
        if self.max_nodes < self.window + 1:
            raise ValueError(f"max_nodes ({self.max_nodes}) must hold the root and the window ({self.window})")

    def build(self, loaded: LoadedModel) -> LookaheadProposer:
        return LookaheadProposer(self, PlainLookup.for_loaded(loaded))


class LookaheadProposer(ProposerBase):
    draft_source = "lookahead"
    deterministic_drafts = True  # draft_probs None: gated by the floor when sampling too
    # The Jacobi window's nodes are read back by position in `observe`: a batch must not cut the tree.
    top_wanted = 1  # the next Jacobi iterate: the target's best token at the window's nodes

    def __init__(self, config: LookaheadConfig, lookup: PlainLookup | None = None) -> None:
        self.config = config
        self.lookup = lookup  # what the floor's plain steps verify (`plain_lookup`)
        self.pool: dict[int, deque[tuple[int, ...]]] = {}
        self.levels: deque[dict[int, int]] = deque(maxlen=config.ngram - 1)  # position -> token, oldest first
        self.window: list[int] = []  # current Jacobi guess for the positions after the root
        self.root_position = 0  # position of this step's root in the sequence
        self._chain_nodes: list[int] = []  # tree node of root, g_1, ..., g_W

    def begin(self, prompt_ids: list[int]) -> None:
        if self.lookup is not None:
            self.lookup.begin(prompt_ids)
        self.pool.clear()
        self.levels.clear()
        # First guess: the prompt's last W tokens (the paper starts from tokens of the prompt).
        self.window = list(prompt_ids[-self.config.window :])
        while len(self.window) < self.config.window:
            self.window.append(self.window[-1])

    def propose(self, ctx: ProposalContext) -> DraftTree:
        root = ctx.token_ids[-1]
        self.root_position = len(ctx.token_ids) - 1
        depth = max(ctx.max_depth, 0)
        if depth == 0 and self.lookup is not None:  # the floor's plain step: the window's chain is the root alone,
            self._chain_nodes = [0]  # node 0 of the looked-up chain too, so `observe` reads the root's row
            return self.lookup.propose(ctx)
        chain = self.window[:depth]
        branches = [chain] + [list(cont[:depth]) for cont in list(self.pool.get(root, ()))[: self.config.guesses]]
        tree = DraftTree.from_branches(root, branches, max_nodes=self.config.max_nodes)
        self._chain_nodes = self._walk(tree, chain)
        return tree

    def node_sources(self) -> list[str] | None:
        """"lookup" for a plain step's looked-up chain; else None (`draft_source` for every node)."""
        return self.lookup.node_sources() if self.lookup is not None else None

    @staticmethod
    def _walk(tree: DraftTree, chain: list[int]) -> list[int]:
        """Tree nodes of the root and of each chain token (the chain is the first branch, never cut)."""
        nodes = [0]
        for token in chain:
            nodes.append(next(c for c in tree.children[nodes[-1]] if tree.token_list[c] == token))
        return nodes

    def observe(self, result: VerifyResult) -> None:
        if self.lookup is not None:
            self.lookup.observe(result)
        tree, start = result.tree, self.root_position
        chain = [tree.token_list[n] for n in self._chain_nodes]  # root, g_1..g_m
        new_iterate = _iterate(result, self._chain_nodes)  # token j is the guess for position start + j + 1
        level = {start + j: token for j, token in enumerate(chain)}
        self.levels.append(level)
        self._collect(new_iterate, start)
        emitted = len(result.tokens)
        # Slide: new guesses for positions after the new root (start + emitted), then fill from the pool.
        kept = new_iterate[emitted:]
        self.window = self._fill(kept, result.tokens[-1])

    def _collect(self, new_iterate: list[int], start: int) -> None:
        """Add the diagonal n-grams ending in each newly predicted token to the pool."""
        size = self.config.ngram
        levels = list(self.levels)  # oldest first; levels[-1] is the chain fed this step
        if len(levels) < size - 1:
            return
        for j, token in enumerate(new_iterate):
            position = start + j + 1
            gram = []
            for back in range(size - 1, 0, -1):  # level -back holds position - back
                value = levels[-back].get(position - back)
                if value is None:
                    break
                gram.append(value)
            else:
                gram.append(token)
                self._add(gram[0], tuple(gram[1:]))

    def _add(self, key: int, continuation: tuple[int, ...]) -> None:
        entries = self.pool.setdefault(key, deque(maxlen=self.config.pool_size))
        if continuation in entries:
            entries.remove(continuation)
        entries.appendleft(continuation)

    def _fill(self, guesses: list[int], root: int) -> list[int]:
        """Extend the guesses to the window size from the pool, else by repeating the last token."""
        out = list(guesses[: self.config.window])
        while len(out) < self.config.window:
            last = out[-1] if out else root
            continuation = self.pool.get(last)
            out.extend(continuation[0] if continuation else (last,))
        return out[: self.config.window]


def _iterate(result: VerifyResult, nodes: list[int]) -> list[int]:
    """The target's best token at each of `nodes`: read with the step's decisions where it was
    (`VerifyResult.tops`), else from the logits."""
    if result.tops is not None:
        best = result.tops[nodes, 0].tolist()
        if min(best) >= 0:  # -1: a row without a number (the kernel's top ids), read as the logits say
            return best
    rows = _rows(result.target_logits, nodes)  # [m + 1, V]
    # specdec's kernel where loaded: torch's argmax over a vocabulary-wide CPU row is not vectorised (every step)
    return argmax_rows(rows) or rows.float().argmax(-1).tolist()


def _rows(logits: torch.Tensor, nodes: list[int]) -> torch.Tensor:
    """logits[nodes]: a view where the nodes are consecutive (the chain is the tree's first branch), else one copy per
    row. Indexing with the list was the dearest part of a plain step (docs/benchmarks.md, design choices)."""
    first = nodes[0]
    if nodes == list(range(first, first + len(nodes))):
        return logits[first : first + len(nodes)]
    return logits.index_select(0, torch.tensor(nodes, device=logits.device))
