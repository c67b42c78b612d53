"""A cross-request store (as in SuffixDecoding, Oliaro et al., arXiv 2411.04975), and the `session` method.

Why: requests served by one model share text: a chat's second turn repeats the
first turn's answer, several questions ask about one document, an agent sends
the same tool output again. Prompt lookup only sees the current request; this
store keeps the prompts and outputs of earlier requests, with frequency counts,
so a continuation seen often across requests can be drafted.

`SessionStore` holds documents (token sequences; one per request, grown as the
request generates) and, for n = 1..max_ngram, a table from each n-gram to the
counts of the tokens that followed it, over all documents held. A lookup takes
the longest suffix of the context (max_ngram .. min_ngram tokens) with counts,
appends its most frequent next token (ties: the smallest id) and repeats from
the extended context: the most frequent path, as SuffixDecoding's suffix tree
gives, with the conditioning window limited to max_ngram tokens.

Interface (for LogitSpec and the server):

    store = SessionStore.for_loaded(loaded, max_tokens, max_ngram)  # shared per loaded model and scope
    doc = store.add(token_ids)             # a new document; returns its id
    store.extend(doc, token_ids)           # append to a document (a request's new tokens)
    store.lookup(context, max_continuation, min_ngram=1) -> list[int]
    store.branches(context, max_continuation, max_branches, min_ngram=1) -> list[list[int]]

Invariants:
- bounded memory: the documents hold at most `max_tokens` tokens in all; adding
  or extending evicts the least recently used documents (by their last add or
  extend) until the total fits, and their counts are removed exactly, so the
  tables always equal the counts over the documents held (at most max_ngram
  entries per held token). A document never grows past `max_tokens` tokens:
  the tokens beyond are dropped;
- thread-safe: one lock around every read and write;
- an n-gram counts only once its next token is there, so a document's final
  n-gram never predicts itself.

The `session` method drafts from the request's own text first (an `NGramIndex`,
as `pld` does with prefer="latest") and from the store only when its own text
has no match; its own prompt and generated tokens are added to the store as it
goes, so later requests on the same loaded model find them.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable, Iterable, Sequence
from typing import Annotated

from specdec.engine.generation import ProposalContext
from specdec.engine.verify import VerifyResult
from specdec.models import LoadedModel
from specdec.proposers.base import ProposerBase
from specdec.proposers.ngram_index import NGramIndex
from specdec.proposers.pld import check_min_ngram, cut_after_eos, synced_index
from specdec.proposers.schema import method_config, option
from specdec.tree import DraftTree

Counts = dict[int, int]


def _ngram(tokens: Sequence[int]) -> Hashable:
    return tokens[0] if len(tokens) == 1 else tuple(tokens)


class SessionStore:
    """Documents of earlier requests with n-gram -> next-token counts; LRU-bounded by total tokens."""

    def __init__(self, max_tokens: int = 1_000_000, max_ngram: int = 4) -> None:
        if max_tokens < 1 or max_ngram < 1:
            raise ValueError(f"need max_tokens >= 1 and max_ngram >= 1 (got {max_tokens}, {max_ngram})")
        self.max_tokens = max_tokens
        self.max_ngram = max_ngram
        self._docs: OrderedDict[int, list[int]] = OrderedDict()  # least recently used first
        self._tables: list[dict[Hashable, Counts]] = [{} for _ in range(max_ngram)]
        self._num_tokens = 0
        self._next_id = 0
        self._lock = threading.Lock()

    @classmethod
    def for_loaded(cls, loaded: LoadedModel, max_tokens: int = 1_000_000, max_ngram: int = 4) -> SessionStore:
        """The store kept in `loaded.state` for these bounds and `loaded.state_scope`, made empty on first use."""
        key = ("session", max_tokens, max_ngram, loaded.state_scope)
        return loaded.state.shared(key, lambda: cls(max_tokens, max_ngram))

    # -------------------------------------------------------------- bookkeeping
    @property
    def num_tokens(self) -> int:
        with self._lock:
            return self._num_tokens

    def __len__(self) -> int:
        with self._lock:
            return len(self._docs)

    def _count(self, doc: list[int], first: int, sign: int) -> None:
        """Add (sign=1) or remove (-1) the n-grams of `doc` whose next token sits at index >= first."""
        for i in range(max(first, 1), len(doc)):
            nxt = doc[i]
            for n in range(1, min(self.max_ngram, i) + 1):
                table = self._tables[n - 1]
                key = _ngram(doc[i - n : i])
                counts = table.setdefault(key, {})
                left = counts.get(nxt, 0) + sign
                if left > 0:
                    counts[nxt] = left
                else:
                    counts.pop(nxt, None)
                    if not counts:
                        del table[key]

    def _evict(self, keep: int) -> None:
        while self._num_tokens > self.max_tokens and len(self._docs) > 1:
            doc_id, doc = next(iter(self._docs.items()))
            if doc_id == keep:  # the newest document is never the one evicted for itself
                self._docs.move_to_end(doc_id)
                continue
            del self._docs[doc_id]
            self._count(doc, 0, -1)
            self._num_tokens -= len(doc)

    # -------------------------------------------------------------- updates
    def add(self, token_ids: Iterable[int]) -> int:
        """Store a new document (its first max_tokens tokens); returns its id for `extend`."""
        doc = [int(t) for t in token_ids][: self.max_tokens]
        with self._lock:
            doc_id = self._next_id
            self._next_id += 1
            self._docs[doc_id] = doc
            self._count(doc, 0, 1)
            self._num_tokens += len(doc)
            self._evict(doc_id)
        return doc_id

    def extend(self, doc_id: int, token_ids: Iterable[int]) -> bool:
        """Append tokens to a document (up to max_tokens in it); False when it was evicted meanwhile."""
        new = [int(t) for t in token_ids]
        with self._lock:
            doc = self._docs.get(doc_id)
            if doc is None:
                return False
            self._docs.move_to_end(doc_id)
            new = new[: self.max_tokens - len(doc)]
            if new:
                first = len(doc)
                doc.extend(new)
                self._count(doc, first, 1)
                self._num_tokens += len(new)
                self._evict(doc_id)
        return True

    # -------------------------------------------------------------- queries
    def _next_counts(self, context: list[int], min_ngram: int) -> Counts:
        for n in range(min(self.max_ngram, len(context)), min_ngram - 1, -1):
            counts = self._tables[n - 1].get(_ngram(context[-n:]))
            if counts:
                return counts
        return {}

    def _path(self, context: list[int], first: int, length: int, min_ngram: int) -> list[int]:
        out = [first]
        window = [*context, first]
        while len(out) < length:
            counts = self._next_counts(window[-self.max_ngram :], min_ngram)
            if not counts:
                break
            token = min(counts, key=lambda t: (-counts[t], t))
            out.append(token)
            window.append(token)
        return out

    def branches(
        self, context: Sequence[int], max_continuation: int, max_branches: int = 1, min_ngram: int = 1
    ) -> list[list[int]]:
        """Up to `max_branches` continuations of `context` with distinct first tokens, most frequent first,
        each followed along its most frequent path; [] when no suffix of min_ngram+ tokens was seen."""
        if max_continuation < 1 or max_branches < 1:
            return []
        tail = [int(t) for t in context[len(context) - self.max_ngram :]]
        with self._lock:
            counts = self._next_counts(tail, max(min_ngram, 1))
            firsts = sorted(counts, key=lambda t: (-counts[t], t))[:max_branches]
            return [self._path(tail, token, max_continuation, max(min_ngram, 1)) for token in firsts]

    def lookup(self, context: Sequence[int], max_continuation: int, min_ngram: int = 1) -> list[int]:
        """The most frequent continuation (up to `max_continuation` tokens) of `context`; [] if none."""
        found = self.branches(context, max_continuation, 1, min_ngram)
        return found[0] if found else []


@method_config("session")
class SessionConfig:
    """Drafts from the request's own text, else from earlier requests on the same model.

    max_ngram: longest suffix matched (own text and store); min_ngram: shortest accepted;
    num_pred_tokens: draft length; max_tokens: the store's capacity in tokens (server-side).
    """

    max_ngram: Annotated[int, option(ge=1)] = 4
    min_ngram: Annotated[int, option(ge=1, request_max=4)] = 2
    num_pred_tokens: Annotated[int, option(ge=1, request_max=20)] = 10
    max_tokens: Annotated[int, option(ge=1)] = 1_000_000

    def __post_init__(self) -> None:
        check_min_ngram(self.min_ngram, self.max_ngram)

    def build(self, loaded: LoadedModel) -> SessionProposer:
        store = SessionStore.for_loaded(loaded, self.max_tokens, self.max_ngram)
        return SessionProposer(self, store, loaded.eos_token_ids)


class SessionProposer(ProposerBase):
    deterministic_drafts = True  # draft_probs None: gated by the floor when sampling too
    draft_source = "session"
    prunable = True  # a batch may cut the tree to its budget

    def __init__(self, config: SessionConfig, store: SessionStore, eos_token_ids: Iterable[int] = ()) -> None:
        self.config = config
        self.store = store
        self.eos_token_ids = frozenset(eos_token_ids)
        self.index = NGramIndex(config.max_ngram, "latest")
        self.doc_id: int | None = None
        self.num_stored = 0

    def begin(self, prompt_ids: list[int]) -> None:
        self.index = NGramIndex(self.config.max_ngram, "latest")
        self.index.extend(prompt_ids)
        self.doc_id = self.store.add(prompt_ids)
        self.num_stored = len(prompt_ids)

    def propose(self, ctx: ProposalContext) -> DraftTree:
        tokens = ctx.token_ids
        self.index = synced_index(self.index, tokens)
        if self.doc_id is None or self.num_stored > len(tokens):  # no `begin`: a store document of its own
            self.doc_id, self.num_stored = self.store.add(tokens), len(tokens)
        elif self.num_stored < len(tokens):
            self.store.extend(self.doc_id, tokens[self.num_stored :])
            self.num_stored = len(tokens)
        length = min(self.config.num_pred_tokens, ctx.max_depth)
        if length <= 0:
            return DraftTree.chain(tokens[-1])
        drafts = self.index.lookup(tokens, length, self.config.min_ngram)  # the request's own text first
        if not drafts:
            drafts = self.store.lookup(tokens, length, self.config.min_ngram)
        return DraftTree.chain(tokens[-1], cut_after_eos(drafts, self.eos_token_ids))

    def observe(self, result: VerifyResult) -> None:
        pass  # accepted tokens reach the index and the store through ctx.token_ids at the next step
