"""Prompt lookup decoding (PLD): draft the continuation of the context's last n-gram.

Why: in summarization, translation, RAG or code editing the output copies long
spans of the input, so "find the last few tokens earlier in the context and
propose what followed them" is a free and often right guess. This is the method
behind transformers' `prompt_lookup_num_tokens` (and the `max_matching_ngram_size`
it pairs with), and the baseline LogitSpec is compared against.

Semantics, as in transformers' `PromptLookupCandidateGenerator`: look up the last
m tokens of prompt + generated text (the root included) for m = max_ngram down
to min_ngram; the first m with an earlier occurrence wins, by default the
earliest occurrence (transformers scans left to right); the draft is up to
`num_pred_tokens` tokens that followed it, cut after the first end-of-sequence
token (a draft past EOS can never be emitted) and at the engine's `max_depth`.
No match: the root alone (one token per step, like plain decoding).

Invariants: the n-gram index only ever sees each token once (`propose` indexes
the tokens added since the previous step: O(new tokens) per step); drafts are a
chain with `draft_probs=None` (deterministic guesses; verification is lossless).
"""

from __future__ import annotations

from typing import Annotated, Literal

from specdec.engine.generation import ProposalContext
from specdec.engine.verify import VerifyResult
from specdec.models import LoadedModel
from specdec.proposers.base import ProposerBase
from specdec.proposers.ngram_index import NGramIndex
from specdec.proposers.schema import method_config, option
from specdec.tree import DraftTree

PREFER_CHOICES = ("earliest", "latest")


def check_min_ngram(min_ngram: int, max_ngram: int) -> None:
    """The rule across two bounded options that n-gram lookups share."""
    if min_ngram > max_ngram:
        raise ValueError(f"min_ngram must be in [1, max_ngram={max_ngram}], got {min_ngram}")


@method_config("pld")
class PLDConfig:
    """Prompt lookup: chain drafts from the longest earlier match of the context's last n-gram.

    max_ngram: longest suffix matched (transformers' max_matching_ngram_size);
    min_ngram: shortest suffix accepted as a match (1 = single tokens too);
    num_pred_tokens: draft length (transformers' prompt_lookup_num_tokens);
    prefer: which occurrence wins, "earliest" (transformers) or "latest".
    """

    max_ngram: Annotated[int, option(ge=1, request_max=5)] = 3
    min_ngram: Annotated[int, option(ge=1, request_max=5)] = 1
    num_pred_tokens: Annotated[int, option(ge=1, request_max=20)] = 10
    prefer: Annotated[Literal[PREFER_CHOICES], option(request=True)] = "earliest"

    def __post_init__(self) -> None:
        check_min_ngram(self.min_ngram, self.max_ngram)

    def build(self, loaded: LoadedModel) -> PLDProposer:
        return PLDProposer(self, loaded.eos_token_ids)


class PLDProposer(ProposerBase):
    deterministic_drafts = True  # draft_probs None: gated by the floor when sampling too
    prunable = True  # a batch may cut the tree to its budget
    draft_source = "pld"

    def __init__(self, config: PLDConfig, eos_token_ids: tuple[int, ...] = ()) -> None:
        self.config = config
        self.eos_token_ids = frozenset(eos_token_ids)
        self.index = NGramIndex(config.max_ngram, config.prefer)

    def begin(self, prompt_ids: list[int]) -> None:
        self.index = NGramIndex(self.config.max_ngram, self.config.prefer)
        self.index.extend(prompt_ids)

    def propose(self, ctx: ProposalContext) -> DraftTree:
        return DraftTree.chain(ctx.token_ids[-1], self.draft(ctx)[0])

    def draft(self, ctx: ProposalContext) -> tuple[list[int], int]:
        """The chain this step verifies below the root, and the matched m ([] and 0: no match or no room).

        LogitSpec calls this too: it keeps exactly this chain as its floor.
        """
        tokens = ctx.token_ids
        self.index = synced_index(self.index, tokens)
        length = min(self.config.num_pred_tokens, ctx.max_depth)
        if length <= 0:
            return [], 0
        drafts, m = self.index.lookup_with_ngram(tokens, length, self.config.min_ngram)
        return cut_after_eos(drafts, self.eos_token_ids), m

    def observe(self, result: VerifyResult) -> None:
        pass  # the accepted tokens reach the index through ctx.token_ids at the next step


def synced_index(index: NGramIndex, token_ids: list[int]) -> NGramIndex:
    """`index` with the tokens of `token_ids` it has not seen yet added: O(new tokens).

    A sequence that does not continue the indexed one (a new generation without
    `begin`) gets a fresh index instead.
    """
    seen = len(index)
    if seen > len(token_ids) or (seen and index.tokens[seen - 1] != token_ids[seen - 1]):
        index, seen = NGramIndex(index.max_ngram, index.prefer), 0
    if seen < len(token_ids):
        index.extend(token_ids[seen:])
    return index


def cut_after_eos(drafts: list[int], eos_token_ids: frozenset[int]) -> list[int]:
    """Drafts up to and including the first end-of-sequence token."""
    if eos_token_ids:
        for i, token in enumerate(drafts):
            if token in eos_token_ids:
                return drafts[: i + 1]
    return drafts
