"""Prompt lookup inside a draft model's chain: where the draft agrees with the text, copy the text.

Why: a draft model guesses everywhere but pays a pass per token, and on a CPU
those passes are most of a step (Qwen2.5-Coder-1.5B with its int8 0.5B draft,
2 cores: ~30 ms per draft pass, ~160 ms per verification); retrieval is free
and excellent where the output copies the context. LogitSpec's tree puts both
side by side and pays verification rows for the retrieval branches beside the
chain (the tree hybrid, `hybrid`). Here retrieval instead *replaces* draft
passes, inside the one chain: after the draft picks chain token i, the n-gram
index is asked what follows the context plus the chain before token i; when a
match of at least `min_ngram` tokens predicts exactly token i, the draft's own
guess confirms the match, so the chain takes the rest of that match's
continuation (up to `length` tokens, periodic past the end of the text as in
LogitSpec) and the draft model stops for this step. The next step's catch-up
feeds the copied tokens the target accepted to the draft in one pass.

Invariants:
- the lookup reads only the context and the chain's tokens so far, so every
  copied token is a deterministic function of the chain before it: a point-mass
  draft row when sampling (`sampling.point_mass_rows`), and the
  speculative-sampling rule stays lossless;
- whether the chain jumps after token i depends on token i's value, which is
  allowed (it decides only what is drafted *after* token i), never on what
  follows;
- the index holds exactly the context (synced each step, O(new tokens));
- copied tokens are cut after an end-of-sequence token.
"""

from __future__ import annotations

from collections.abc import Sequence

from specdec.proposers.logitspec_retrieval import continue_match
from specdec.proposers.ngram_index import NGramIndex
from specdec.proposers.pld import cut_after_eos, synced_index

MAX_NGRAM = 3  # the index's longest matched suffix (prompt lookup's default)


class RetrievalJump:
    """The n-gram index a draft chain consults after each of its tokens."""

    def __init__(self, min_ngram: int, length: int, eos_token_ids: Sequence[int] = ()) -> None:
        if not 1 <= min_ngram <= MAX_NGRAM:
            raise ValueError(f"jump must be in [1, {MAX_NGRAM}] (the matched n-gram), got {min_ngram}")
        if length < 1:
            raise ValueError(f"jump_length must be >= 1, got {length}")
        self.min_ngram = min_ngram
        self.length = length
        self.eos_token_ids = frozenset(eos_token_ids)
        self.index = NGramIndex(MAX_NGRAM, "latest")

    def begin(self) -> None:
        self.index = NGramIndex(MAX_NGRAM, "latest")

    def sync(self, token_ids: list[int]) -> None:
        """Index the context's tokens not seen yet (once per step, before `after`)."""
        self.index = synced_index(self.index, token_ids)

    def after(self, chain: list[int], room: int) -> list[int]:
        """Tokens to copy after `chain` (the draft's tokens below the root so far), at most `room`.

        [] unless the match of the context plus chain[:-1] predicts chain[-1].
        """
        if room <= 0 or not chain:
            return []
        continuation, m = continue_match(self.index, chain[:-1], min(self.length, room) + 1)
        if m < self.min_ngram or not continuation or continuation[0] != chain[-1]:
            return []
        return cut_after_eos(continuation[1:], self.eos_token_ids) if chain[-1] not in self.eos_token_ids else []
