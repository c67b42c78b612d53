"""LogitSpec's retrieval (next and next-next token, optionally next-next-next) and the paper's fixed tree.

Why a module of its own: the adaptive proposer (`proposer`) and the faithful
paper mode share the retrieval; the paper mode's tree policy lives here too, so
it can be read against the authors' code in one place.

Retrieval per step (Liu et al., arXiv 2507.01449, Algorithm 1):
1. root branch: the continuation of the longest matching m-gram (m = max_ngram .. 1)
   of context + root;
2. candidates: the top-k tokens of the logits the root was drawn from, each a
   guess for the token after the root; each gets the continuation of context +
   root + candidate;
3. (optional, `third`) below a first-level guess c, the top tokens t of the same
   logits for which the index has seen the pair (c, t): guesses for the token
   after c, each with the continuation of that pair.

Periodic continuation: a match whose latest occurrence runs into the end of the
text (a repeated run, e.g. a row of dashes or "1, 2, 1, 2") is continued as an
overlapping copy: if the text ended in the occurrence's continuation, that
continuation would repeat with period (end of text - its start). So repeated
runs give full-length drafts instead of drafts that shrink to the few tokens
left before the end.

The paper mode (`adaptive=false`), compared with the authors' code
(github.com/smart-lty/LogitSpec, model/logitspec/generate_drafts_util.py):
- same: n-grams of 3 down to 1; continuations of up to 20 tokens for the root
  (their `num_pred_tokens`); candidates are the top tokens of the last logit
  minus the root, with branch lengths by their position in that top list (4
  tokens up to position 8, 3 up to 32, else the bare candidate), the root
  branch first, then candidates in rank order until 64 nodes (root included);
  a candidate equal to the root branch's first token is kept (not skipped);
- differs: (a) their pool keeps, per n-gram, the latest occurrence unless its
  continuation is shorter than the one already stored (an earlier, longer one
  then stays); we always take the latest occurrence and continue it
  periodically (see above); on exactly repeating text both give the same
  draft. (b) Their root is the argmax of the last logit (greedy only); ours is
  the engine's token (sampled at temperature > 0, verified losslessly). (c) They
  take the top-64 (the tree capacity) of the logit; we take the top `k` (60 by
  default); the 64-node tree is full long before either limit. (d) We merge
  identical siblings into a trie (theirs verifies, e.g., a candidate equal to
  the root branch's first token as a second node), so a 64-node budget holds
  as many or more distinct guesses. (e) Branches are cut at the engine's
  `max_depth` (max_new_tokens, context length); theirs verify past the end and trim.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import torch

from specdec.backends.registry import top_tokens
from specdec.proposers.logitspec.plan import ROOT, NodePool
from specdec.proposers.ngram_index import NGramIndex
from specdec.tree import DraftTree

SELF_RANK = -1  # the root token itself among the top-k (a repeated token, e.g. a digit)
THIRD_FIRSTS = 8  # third-level guesses are looked for below at most this many first-level guesses
THIRD_K = 16  # ... among this many top tokens of the last logit


def periodic_continuation(tokens: Sequence[int], extra: Sequence[int], pos: int, length: int) -> list[int]:
    """Up to `length` tokens of the text `tokens + extra` from `pos`, continued periodically past its end.

    Past the end, token j of the continuation repeats token j - period, where
    period = len(tokens) + len(extra) - pos: the overlapping copy a match at the
    end of a repeated run implies. `0 <= pos < len(tokens) + len(extra)`.
    """
    out = list(tokens[pos : pos + length])
    if len(out) >= length:
        return out
    out.extend(extra[max(0, pos - len(tokens)) : max(0, pos - len(tokens)) + length - len(out)])
    period = len(out)
    while len(out) < length:
        out.extend(out[: min(period, length - len(out))])
    return out


def continue_match(index: NGramIndex, extra: Sequence[int], length: int) -> tuple[list[int], int]:
    """The continuation (up to `length`, periodic) of the longest match of `index.tokens + extra`, and m.

    `index` must hold the whole context (`extra` are tokens after it that are not
    indexed, e.g. a candidate); ([], 0) when nothing matches or length <= 0.
    """
    tail = [*index.tokens[max(0, len(index) - index.max_ngram) :], *extra]
    pos, m = index.find(tail)
    if not m or length <= 0:
        return [], m
    return periodic_continuation(index.tokens, extra, pos, length), m


def ranked_candidates(top: Sequence[int], root: int, keep_self: bool) -> Iterator[tuple[int, int]]:
    """(token, rank) for the top tokens of the last logits, best first: ranks count the tokens other
    than the root; the root token itself (SELF_RANK) only with `keep_self`."""
    rank = 0
    for token in top:
        if token != root:
            yield token, rank
            rank += 1
        elif keep_self:
            yield token, SELF_RANK


@dataclass(frozen=True)
class Retrieval:
    """One step's retrieval: the root branch and every next-next candidate with its continuation."""

    root_branch: list[int]  # tokens after the root
    root_ngram: int  # matched m (0: no match)
    cand_tokens: list[int]
    cand_ranks: list[int]  # rank among the top-k, the root token excluded (SELF_RANK for the root itself)
    cand_conts: list[list[int]]  # retrieved tokens after root + candidate
    cand_ngrams: list[int]  # matched m for context + root + candidate (0: none)
    top: list[int]  # the top-k tokens of the last logits, best first (root included)


def top_of(
    last_logits: torch.Tensor,
    num: int,
    known: Sequence[int] | None,
    top: Callable[[torch.Tensor, int], torch.Tensor] = top_tokens,
) -> list[int]:
    """The top `num` ids of last_logits [V], best first: `known`'s (the step's read-back top ids,
    `ProposalContext.last_top`) where it holds them, so the logits are not read; else `top(last_logits, num)`."""
    if known is not None and len(known) >= num:
        return list(known[:num])
    return top(last_logits, num).tolist() if num else []


def retrieve(
    index: NGramIndex,
    token_ids: list[int],
    last_logits: torch.Tensor,
    k: int,
    max_continuation: int,
    cand_continuation: int,
    keep_self: bool,
    skip: frozenset[int] = frozenset(),
    known_top: Sequence[int] | None = None,
) -> Retrieval:
    """Algorithm 1, steps 1-2. `token_ids` ends with the root and must be fully indexed.

    last_logits: [V]. Candidates equal to the root branch's first token or in
    `skip` are left out (already covered); the root token itself only with `keep_self`.
    known_top: the top ids of last_logits already on the host (`top_of`).
    """
    root = token_ids[-1]
    root_branch, root_ngram = continue_match(index, (), max_continuation)
    covered = {*skip, root_branch[0]} if root_branch else skip
    top = top_of(last_logits, min(k, last_logits.shape[-1]), known_top)
    candidates = [(token, rank) for token, rank in ranked_candidates(top, root, keep_self) if token not in covered]
    tokens = [token for token, _ in candidates]
    ranks = [rank for _, rank in candidates]
    conts, ngrams = [], []
    for token, (pos, m) in zip(tokens, index.find_next(tokens), strict=True):  # what continue_match finds
        conts.append(periodic_continuation(index.tokens, (token,), pos, cand_continuation)
                     if m and cand_continuation > 0 else [])
        ngrams.append(m)
    return Retrieval(root_branch, root_ngram, tokens, ranks, conts, ngrams, top)


@dataclass(frozen=True)
class Third:
    """A next-next-next guess: `token` after the first-level guess `first`, and what followed the pair."""

    first: int  # the first-level token it hangs below
    token: int
    position: int  # position in the logits' top list (0 = best)
    cont: list[int]  # tokens that followed (first, token) in the text


def retrieve_thirds(
    index: NGramIndex, firsts: Sequence[tuple[int, int]], top: Sequence[int], length: int
) -> list[Third]:
    """Third-level guesses below first-level tokens, only where the index has seen the pair.

    firsts: (first-level token, the token its own retrieval already puts below it
    or -1); top: the last logits' top tokens, best first. Looks at most
    THIRD_FIRSTS x THIRD_K pairs: the tree cannot explode, and the step stays cheap.
    """
    if index.max_ngram < 2:
        return []
    out = []
    tokens = index.tokens
    for first, taken in firsts[:THIRD_FIRSTS]:
        for position, token in enumerate(top[:THIRD_K]):
            if token == taken:
                continue
            pos, m = index.find((first, token), min_ngram=2)
            if m:
                out.append(Third(first, token, position, list(tokens[pos : pos + length])))
    return out


def _torch_top(logits: torch.Tensor, num: int) -> torch.Tensor:
    return torch.topk(logits, num).indices


def paper_branch_length(position: int) -> int:
    """The authors' policy by position in the logit's top list: 4 tokens up to 8, 3 up to 32, else 1."""
    if position <= 8:
        return 4
    if position <= 32:
        return 3
    return 1


def paper_retrieve(
    index: NGramIndex,
    token_ids: list[int],
    last_logits: torch.Tensor,
    k: int,
    max_continuation: int,
    known_top: Sequence[int] | None = None,
) -> Retrieval:
    """The paper mode's retrieval: the root's continuation (the paper: up to 20 tokens), candidates' by rank.

    last_logits: [V]. The candidate equal to the root branch's first token is kept. known_top: see `top_of`.
    """
    root = token_ids[-1]
    root_branch, root_ngram = continue_match(index, (), max_continuation)
    top = top_of(last_logits, min(k, last_logits.shape[-1]), known_top, _torch_top)
    tokens, ranks, conts, ngrams = [], [], [], []
    for position, token in enumerate(top):
        if token == root:
            continue
        cont, m = continue_match(index, (token,), paper_branch_length(position) - 1)
        tokens.append(token)
        ranks.append(position)
        conts.append(cont)
        ngrams.append(m)
    return Retrieval(root_branch, root_ngram, tokens, ranks, conts, ngrams, top)


def paper_pool(root: int, retrieval: Retrieval, budget: int, max_depth: int) -> NodePool:
    """The paper's tree as a pool: the root branch, then candidates by rank, cut at `budget` nodes.

    For `paper_retrieve` output `cand_ranks` are top-list positions; for `retrieve`
    output they are ranks without the root (lengths then follow those ranks).
    """
    pool = NodePool(root, max_depth, budget)
    if retrieval.root_branch:
        pool.add(ROOT, retrieval.root_branch, None, "root")
    for token, rank, cont in zip(retrieval.cand_tokens, retrieval.cand_ranks, retrieval.cand_conts, strict=True):
        if len(pool) >= budget:
            break
        pool.add(ROOT, [token, *cont[: paper_branch_length(max(rank, 0)) - 1]], None, "cand")
    return pool


def paper_tree(root: int, retrieval: Retrieval, budget: int, max_depth: int) -> DraftTree:
    """The paper's tree (see `paper_pool`)."""
    return paper_pool(root, retrieval, budget, max_depth).whole()[0]
