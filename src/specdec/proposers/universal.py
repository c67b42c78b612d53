"""Universal assisted generation: a draft model whose tokenizer differs from the target's.

Why: the best small model for a target often comes from another family (e.g.
SmolLM2-135M drafting for Qwen2.5-Coder-1.5B), and the classic rule needs a
shared vocabulary. Here the drafts pass through text, as in transformers'
universal assisted generation: the target's context is decoded to text and
re-tokenized with the draft's tokenizer, the draft model guesses a chain of its
own tokens (greedily), and their text is re-tokenized with the target's
tokenizer into the chain the target verifies.

Invariants:
- the drafts are deterministic guesses (no `draft_probs`), so verification is
  lossless at any temperature: greedy output is token-identical to plain
  decoding, and sampling uses the deterministic rule (the draft's own
  probabilities live on another vocabulary and cannot enter the rule);
- the draft's context is `encode_draft(decode_target(context))` in full every
  step, so a re-tokenization that changes earlier draft tokens is never missed;
  the draft's KV cache (`DraftProposer.sync`) keeps the longest prefix shared
  with it and feeds the rest. Cost: one decode and one encode of the context per
  step (Rust tokenizers: about a millisecond for 2k tokens);
- a drafted text is mapped to target tokens by re-encoding it behind the last
  `WINDOW` context tokens' text; when that does not reproduce those tokens (a
  merge across the boundary) the text is encoded alone. The chain's last target
  token is dropped (unless it is the only one): its text may be the start of a
  longer token that the draft had not finished;
- both tokenizers must round-trip text (`decode(encode(s)) == s`, checked on
  `ROUND_TRIP_TEXTS` at build time), else drafts would be garbled text:
  `TokenizerRoundTripError` says which one fails, on what.
"""

from __future__ import annotations

from typing import Protocol

from specdec.engine.generation import ProposalContext
from specdec.engine.verify import VerifyResult
from specdec.proposers.base import ProposerBase
from specdec.proposers.chain_length import DraftLength
from specdec.proposers.draft_module import TokenizerMismatchError
from specdec.sampling import SamplingParams
from specdec.tree import DraftTree

WINDOW = 8  # context tokens re-encoded with the drafted text, so merges at the seam come out right
ROUND_TRIP_TEXTS = (
    "Hello, world! It's 3:45 pm; 12 + 30 = 42.\n",
    "def area(r: float) -> float:\n    return 3.14159 * r ** 2\n",
    "naïve café, Straße, 東京, emoji 🙂 and tabs\tinside.",
    "  two leading spaces, and trailing ones  ",
)
GREEDY = SamplingParams()


class TokenizerRoundTripError(TokenizerMismatchError):
    """A tokenizer that cannot give back the text it encoded, so drafts cannot pass through text."""


def check_round_trip(tokenizer, name: str) -> None:
    """Raise TokenizerRoundTripError unless decode(encode(text)) == text for every ROUND_TRIP_TEXTS entry."""
    for text in ROUND_TRIP_TEXTS:
        back = decode(tokenizer, encode(tokenizer, text))
        if back != text:
            raise TokenizerRoundTripError(
                f"{name}'s tokenizer does not round-trip text ({text!r} came back as {back!r}), so drafts "
                "cannot pass through text: use a draft model that shares the target's tokenizer"
            )


def encode(tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False)


def decode(tokenizer, ids: list[int]) -> str:
    return tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)


class ChainDrafter(Protocol):
    """What drafting through text needs of the inner drafter (`draft.DraftProposer` is one): this
    module does not import `draft`, which builds it."""

    length: DraftLength
    sized_by_costs: bool  # its chain's length follows the passes' measured costs

    def begin(self, prompt_ids: list[int]) -> None: ...
    def propose(self, ctx: ProposalContext) -> DraftTree: ...
    def record(self, num_accepted: int) -> None: ...


class UniversalDraftProposer(ProposerBase):
    """Drafts with `inner` (a drafter over the draft model's own vocabulary) through text."""
    deterministic_drafts = True  # draft_probs None: gated by the floor when sampling too

    prunable = True  # a batch may cut the tree to its budget

    def __init__(self, inner: ChainDrafter, draft_tokenizer, target_tokenizer) -> None:
        check_round_trip(target_tokenizer, "the target")
        check_round_trip(draft_tokenizer, "the draft model")
        self.inner = inner
        self.draft_tokenizer = draft_tokenizer
        self.target_tokenizer = target_tokenizer
        self._drafted: list[int] = []  # this step's draft tokens (draft vocabulary)
        self._chain: list[int] = []  # this step's chain (target vocabulary)
        self._ran = False  # the draft model was asked this step

    def to_draft(self, token_ids: list[int]) -> list[int]:
        """The target context re-tokenized for the draft model (never empty)."""
        return encode(self.draft_tokenizer, decode(self.target_tokenizer, token_ids)) or [0]

    def to_target(self, token_ids: list[int], text: str) -> list[int]:
        """Target tokens of `text` written after the context `token_ids`."""
        window = token_ids[-WINDOW:]
        ids = encode(self.target_tokenizer, decode(self.target_tokenizer, window) + text)
        if ids[: len(window)] == window:
            return ids[len(window) :]
        return encode(self.target_tokenizer, text)

    def begin(self, prompt_ids: list[int]) -> None:
        self.inner.begin(self.to_draft(prompt_ids))

    @property
    def sized_by_costs(self) -> bool:
        """As its drafter: an adaptive draft model's chain follows the passes' measured costs."""
        return self.inner.sized_by_costs

    def propose(self, ctx: ProposalContext) -> DraftTree:
        root = ctx.token_ids[-1]
        self._drafted, self._chain, self._ran = [], [], ctx.max_depth > 0
        if not self._ran:
            return DraftTree.chain(root)
        draft_ids = self.to_draft(ctx.token_ids)
        sub = ProposalContext(draft_ids, ctx.last_logits, min(ctx.num_prompt_tokens, len(draft_ids)), GREEDY,
                              ctx.max_depth)  # fmt: skip
        self._drafted = self.inner.propose(sub).token_list[1:]
        if not self._drafted:
            return DraftTree.chain(root)
        chain = self.to_target(ctx.token_ids, decode(self.draft_tokenizer, self._drafted))
        if len(chain) > 1:
            chain = chain[:-1]  # the last token's text may be the start of a longer target token
        self._chain = chain[: ctx.max_depth]
        return DraftTree.chain(root, self._chain)

    def observe(self, result: VerifyResult) -> None:
        if self._ran:
            self.inner.record(self.accepted_drafts(result.num_accepted))

    def accepted_drafts(self, num_accepted: int) -> int:
        """How many draft-vocabulary tokens the accepted target tokens cover (by text length)."""
        if not num_accepted or not self._drafted:
            return 0
        covered = len(decode(self.target_tokenizer, self._chain[:num_accepted]))
        count, length = 0, 0
        for token in self._drafted:
            length += len(decode(self.draft_tokenizer, [token]))
            if length > covered:
                break
            count += 1
        return count
