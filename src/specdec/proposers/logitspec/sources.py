"""Draft sources beyond the request's own text, as nodes of LogitSpec's tree.

Why: retrieval from the request's own text (prompt lookup, LogitSpec's root and
next-next branches) finds nothing where the text does not repeat itself. Three
other sources can still guess, each a method of its own elsewhere and here
one more supplier of candidate nodes, each node weighed by the acceptance rate
learned for its source (`learn`), so the planner keeps a source's
nodes only where they pay:

- `recycle` (Token Recycling, `proposers.recycle.RecycleTable`): the target's
  own top-k successors of each token, refreshed from every verified node. It
  extends branches whose retrieval ran out (a bare candidate, a chain cut short)
  and supplies branches below the root when nothing is retrieved;
- `session` (`proposers.session_store.SessionStore`, as in SuffixDecoding):
  the prompts and outputs of earlier requests on the same loaded model. The
  request's own text ranks first: its branches enter the tree before the
  store's, win every shared node, and the store offers one branch where the
  request's own text matched, two where it did not;
- `datastore` (`specdec.datastore.Datastore`, as in REST): an on-disk corpus,
  consulted only when the context has no match of its own.

"Matched" means a match of at least two tokens (`STRONG_MATCH` in `proposer`):
in a long prompt almost every single token occurred before, and a one-token
match is a weak guess that should not keep the other sources out.

Invariants: sources only add nodes to the pool (the planner decides what is
verified; drafts stay deterministic, so verification stays lossless); the
recycle table and the session store are shared per loaded model (its `state`) and
thread-safe (their own locks); a session document is fed exactly the tokens of
its request, in order; branches are cut after an end-of-sequence token.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Hashable
from dataclasses import dataclass

import torch

from specdec.datastore import Datastore
from specdec.models import LoadedModel
from specdec.proposers.logitspec.learn import RECYCLE_K
from specdec.proposers.logitspec.plan import NodePool
from specdec.proposers.pld import cut_after_eos
from specdec.proposers.recycle import RecycleTable
from specdec.proposers.session_store import SessionConfig, SessionStore

SESSION_MIN_NGRAM = 2  # store matches of one token are mostly noise across requests
DATASTORE_MAX_NGRAM = 8  # as the `datastore` method's defaults
DATASTORE_MIN_NGRAM = 2
MAX_BRANCHES = 2  # branches a store or datastore offers when the request's own text has no match


@dataclass(frozen=True)
class Sources:
    """The extra sources one proposer drafts from (None: not used)."""

    recycle: RecycleTable | None = None
    session: SessionStore | None = None
    datastore: Datastore | None = None

    @classmethod
    def for_loaded(cls, loaded: LoadedModel, recycle: bool, session: bool, datastore: Datastore | None) -> Sources:
        """The recycle table and session store kept in `loaded.state` for its scope (shared with the
        `recycle` and `session` methods' defaults in the same scope), and an opened datastore."""
        store_config = SessionConfig()
        return cls(
            RecycleTable.for_loaded(loaded, RECYCLE_K) if recycle else None,
            SessionStore.for_loaded(loaded, store_config.max_tokens, store_config.max_ngram) if session else None,
            datastore,
        )


class SessionFeed:
    """One request's document in the session store: its prompt at `begin`, then its new tokens."""

    def __init__(self, store: SessionStore) -> None:
        self.store = store
        self.doc_id: int | None = None
        self.num_stored = 0

    def begin(self, prompt_ids: list[int]) -> None:
        self.doc_id, self.num_stored = self.store.add(prompt_ids), len(prompt_ids)

    def sync(self, token_ids: list[int]) -> None:
        """Store the tokens of `token_ids` not stored yet (a sequence without `begin` gets a new document)."""
        if self.doc_id is None or self.num_stored > len(token_ids):
            self.begin(token_ids)
        elif self.num_stored < len(token_ids):
            self.store.extend(self.doc_id, token_ids[self.num_stored :])
            self.num_stored = len(token_ids)


def store_branches(
    sources: Sources, token_ids: list[int], length: int, own_match: bool, eos: frozenset[int]
) -> list[tuple[str, int, list[int]]]:
    """(source, matched n-gram size, branch) from the session store (always) and the datastore (only
    without an own match). The store's n-gram size is told apart only as its longest vs shorter."""
    out: list[tuple[str, int, list[int]]] = []
    if length <= 0:
        return out
    count = 1 if own_match else MAX_BRANCHES
    store = sources.session
    if store is not None:
        for m in (store.max_ngram, SESSION_MIN_NGRAM):
            found = store.branches(token_ids, length, count, max(min(m, store.max_ngram), 1))
            if found:
                out += [("session", m, cut_after_eos(branch, eos)) for branch in found]
                break
    datastore = sources.datastore
    if datastore is not None and not own_match:
        m = datastore.match(token_ids, DATASTORE_MAX_NGRAM, DATASTORE_MIN_NGRAM)[0]
        if m:
            found = datastore.branches(token_ids, m, length, count, m)
            out += [("datastore", min(m, 4), cut_after_eos(branch, eos)) for branch in found]
    return out


def add_recycled(
    pool: NodePool,
    table: RecycleTable,
    anchors: list[int],
    rate: Callable[[Hashable], float],
    max_new: int,
    min_prob: float,
    eos: frozenset[int],
) -> dict[int, list[int]]:
    """Grow recycled successors below `anchors` (pool node ids), most likely nodes first; the rows used.

    A child's probability is its parent's times rate(("recycle", rank)); expansion
    stops after `max_new` new nodes, below `min_prob`, at the pool's depth and size
    limits, and at end-of-sequence tokens.
    """
    rows: dict[int, list[int]] = {}
    heap = [(-pool.probs[node], node) for node in anchors]
    heapq.heapify(heap)
    rank_rates = [rate(("recycle", rank)) for rank in range(table.k)]
    num_new = 0
    while heap and num_new < max_new:
        neg_prob, node = heapq.heappop(heap)
        token = pool.tokens[node]
        if pool.depths[node] >= pool.max_depth or token in eos:
            continue
        row = rows.get(token)
        if row is None:
            row = rows[token] = table.successors(token)
        for rank, successor in enumerate(row):
            prob = -neg_prob * rank_rates[rank]
            if prob < min_prob:
                continue
            size = len(pool)
            ids = pool.add(node, [successor], [prob], "recycle")
            if ids and len(pool) > size:
                num_new += 1
                heapq.heappush(heap, (-pool.probs[ids[0]], ids[0]))
    return rows


def prefill_row(table: RecycleTable, token_ids: list[int], last_logits: torch.Tensor) -> None:
    """The first step of a request: the prompt's last token gets its row from the prefill logits ([V])."""
    if len(token_ids) >= 2:
        table.update(token_ids[-2:-1], last_logits[None])
