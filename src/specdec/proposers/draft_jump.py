"""Prompt lookup as a draft model's lookahead: one draft pass over the text's continuation.

Why: a draft model guesses everywhere but pays a pass per token, and on a CPU
those passes are a large part of a step (with Qwen2.5-Coder-1.5B and its int8
0.5B draft, a draft pass costs about a fifth of a verification). Where
the output copies the context, the draft's next tokens are predictable from the
text itself. So after the draft picks a chain token, the n-gram index is asked
what follows the context plus the chain; when a match of at least `min_ngram`
tokens predicted that very token (the draft's pick confirms the match), the
draft is fed the token *and* the text's continuation in one pass, which yields
its logits after each of them. While the draft goes on picking the copied
tokens, their passes are already done; at the first pick that differs, the
copied tokens after it leave the draft's cache and drafting goes on as usual.

So the chain is the draft's own: every token is still the draft's pick (its
argmax, or a draw from its row when sampling), from the same logits (up to the
last bits of a multi-token pass), with the same stopping rule. Only passes are
saved, and the speculative-sampling rule needs nothing new. A wrong copy costs
the extra rows of one pass.

Invariants: the lookup reads only the context and the chain so far; the index
holds exactly the context (synced each step, O(new tokens)); copies never run
past the chain's length limit; copied tokens the draft did not pick never stay
in its cache.
"""

from __future__ import annotations

from collections.abc import Sequence

from specdec.proposers.logitspec.retrieval import continue_match
from specdec.proposers.ngram_index import NGramIndex
from specdec.proposers.pld import cut_after_eos, synced_index

MAX_NGRAM = 3  # the index's longest matched suffix (prompt lookup's default)


class RetrievalJump:
    """The n-gram index a draft consults after each chain token, and what it saved."""

    def __init__(self, min_ngram: int, length: int, eos_token_ids: Sequence[int] = ()) -> None:
        if not 1 <= min_ngram <= MAX_NGRAM:
            raise ValueError(f"jump must be in [1, {MAX_NGRAM}] (the matched n-gram), got {min_ngram}")
        if length < 1:
            raise ValueError(f"jump_length must be >= 1, got {length}")
        self.min_ngram = min_ngram
        self.length = length
        self.eos_token_ids = frozenset(eos_token_ids)
        self.index = NGramIndex(MAX_NGRAM, "latest")
        self.copies = 0  # draft passes that carried copied tokens (over the proposer's life)
        self.saved = 0  # chain tokens whose draft pass a copy had already made

    def begin(self) -> None:
        self.index = NGramIndex(MAX_NGRAM, "latest")

    def sync(self, token_ids: list[int]) -> None:
        """Index the context's tokens not seen yet (once per step, before `after`)."""
        self.index = synced_index(self.index, token_ids)

    def after(self, chain: list[int], room: int) -> list[int]:
        """The text's continuation after `chain` (the chain's tokens below the root so far), at most `room`.

        [] unless the match of the context plus chain[:-1] predicts chain[-1].
        """
        if room <= 0 or not chain or chain[-1] in self.eos_token_ids:
            return []
        continuation, m = continue_match(self.index, chain[:-1], min(self.length, room) + 1)
        if m < self.min_ngram or not continuation or continuation[0] != chain[-1]:
            return []
        return cut_after_eos(continuation[1:], self.eos_token_ids)
