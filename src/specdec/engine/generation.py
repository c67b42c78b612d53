"""What one generation is asked for and what it gives back: the decode loop's vocabulary.

Why a module of its own: proposers, the server, the bench and the engine all
speak these types; keeping them apart from the loop (`specdec.engine.loop`) means a
proposer imports its context type without importing the engine.

Invariants:
- `GenerationConfig` is frozen and validated on construction;
- MAT counts decode steps only: the prefill's forward pass and the first token it
  yields are left out, so plain decoding has MAT = 1.00 exactly;
- `Emitter` never overshoots: it stops at the first EOS (kept in token_ids, like
  transformers' generate), at a stop string (cut from the text), or at exactly
  `max_new_tokens`, even inside a run of accepted tokens.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Collection
from dataclasses import asdict, dataclass, field
from typing import Protocol

import torch

from specdec.engine.provenance import TARGET, Piece, Provenance
from specdec.engine.verify import VerifyResult
from specdec.sampling import SamplingParams
from specdec.text import TextStream
from specdec.tree import DraftTree


@dataclass(frozen=True)
class GenerationConfig:
    max_new_tokens: int = 128
    sampling: SamplingParams = field(default_factory=SamplingParams)
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.max_new_tokens, int) or self.max_new_tokens <= 0:
            raise ValueError(f"max_new_tokens must be a positive integer (got {self.max_new_tokens!r})")


@dataclass(frozen=True)
class ProposalContext:
    token_ids: list[int]  # prompt + generated so far (read-only); the last one is this step's root
    last_logits: torch.Tensor  # [V] target logits the root was drawn from
    num_prompt_tokens: int
    sampling: SamplingParams
    max_depth: int  # drafts deeper than this cannot be emitted (max_new_tokens, the model's context)
    # [K, F] the target's features (`Proposer.feature_layers`) at the K tokens committed since the last
    # proposal (at the first: the whole prompt), from the passes that committed them; None when the
    # proposer asks for none
    features: torch.Tensor | None = None
    # an extra draft node's cost as a share of a plain step, from this row's own steps
    # (`specdec.engine.node_price`); None: the cost curve's probe alone prices nodes
    node_price: float | None = None
    # on a step the floor keeps plain (max_depth 0): the depth a draft found by a lookup alone may still fill
    # (prompt lookup's n-gram match, a plain step's cost beyond it); 0: none
    lookup_depth: int = 0
    # the top ids of last_logits, best first, read with the last step's decisions (`VerifyResult.tops`: as
    # many as the proposer's `top_wanted`); None: read them from last_logits
    last_top: list[int] | None = None


class Proposer(Protocol):
    """What the engine asks of every method.

    `prunable`: whether the batch's node budget may cut the proposer's tree to a prefix of its node
    order (False where the tree's shape is the algorithm, e.g. lookahead's Jacobi window).
    `source_stats`: per draft source, the nodes offered and accepted over the proposer's life (the
    bench's per-source table), or None for a proposer with one source.
    `feature_layers`: the target hidden states (`TargetModel.run`'s capture) the proposer reads from
    `ProposalContext.features`; empty for proposers that read none (no cost then).
    `multi_draft`: the rule for drawn siblings at temperature > 0, "specinfer" or "spectr"
    (`specdec.engine.accept.accept`).
    `features_optional`: whether the proposer drafts on with features missing for some committed tokens (a
    plain step's pass under the floor then captures none, `Batch._capture_for_next`), proposing the root
    alone where the last step's are missing.
    `sized_by_costs`: whether the proposer sizes its trees by this machine's pass costs itself (LogitSpec's
    planner, the heads' paying count, a draft model's adaptive length); a row alone in its pass under the floor
    (`Engine.generate`, a lone request in the server) then keeps them whole, else they are cut to the width the
    row's acceptance pays for (`Batch._budget`).
    `top_wanted` (optional, 0 when absent): how many top target ids at every node the proposer reads from a
    step's logits (LogitSpec's candidates, the recycle table's rows). They come with the step's result
    (`VerifyResult.tops`, `ProposalContext.last_top`): on an accelerator in its one transfer, so reading them
    costs the proposer no wait on the device; on a CPU only for a proposer that reads them at every node
    (`tops_at_every_node`, optional, False when absent: the recycle table's rows), in one read right after the
    pass (`verify`); a CPU proposer that reads a few rows reads them from the logits itself.
    """

    prunable: bool
    source_stats: dict[str, dict[str, int]] | None
    feature_layers: tuple[int, ...]
    features_optional: bool
    multi_draft: str
    sized_by_costs: bool

    def begin(self, prompt_ids: list[int]) -> None: ...
    def propose(self, ctx: ProposalContext) -> DraftTree: ...
    def observe(self, result: VerifyResult) -> None: ...


@dataclass
class StepStats:
    tree_size: int
    num_accepted: int
    draft_s: float
    verify_s: float


@dataclass
class GenerationStats:
    num_prompt_tokens: int = 0
    num_new_tokens: int = 0
    num_forward_passes: int = 0
    prefill_s: float = 0.0
    wall_time_s: float = 0.0
    steps: list[StepStats] = field(default_factory=list)

    @property
    def num_decode_steps(self) -> int:
        return len(self.steps)

    @property
    def mat(self) -> float:
        """Mean tokens emitted per decoding forward pass (prefill and its token excluded)."""
        return (self.num_new_tokens - 1) / self.num_decode_steps if self.steps else 1.0

    @property
    def tokens_per_s(self) -> float:
        return self.num_new_tokens / self.wall_time_s if self.wall_time_s > 0 else 0.0

    @property
    def decode_tokens_per_s(self) -> float:
        """Tokens after the prefill's over the time after it: what decoding itself gives (a prompt whose
        prefill the prompt cache held, or a head's captured prefill, does not tilt it)."""
        seconds = self.wall_time_s - self.prefill_s
        return (self.num_new_tokens - 1) / seconds if seconds > 0 and self.num_new_tokens > 1 else 0.0

    @property
    def draft_time_s(self) -> float:
        return sum(s.draft_s for s in self.steps)

    @property
    def verify_time_s(self) -> float:
        return sum(s.verify_s for s in self.steps)

    @property
    def retrieval_success(self) -> float:
        """Share of steps whose proposer offered at least one draft token."""
        return sum(s.tree_size > 1 for s in self.steps) / len(self.steps) if self.steps else 0.0

    @property
    def acceptance_rate(self) -> float:
        """Accepted draft tokens over drafted tokens (tree nodes below the root)."""
        drafted = sum(s.tree_size - 1 for s in self.steps)
        return sum(s.num_accepted for s in self.steps) / drafted if drafted else 0.0

    @property
    def accepted_histogram(self) -> dict[int, int]:
        return dict(sorted(Counter(s.num_accepted for s in self.steps).items()))

    def to_dict(self, with_steps: bool = False) -> dict:
        out = {
            "num_prompt_tokens": self.num_prompt_tokens,
            "num_new_tokens": self.num_new_tokens,
            "num_forward_passes": self.num_forward_passes,
            "num_decode_steps": self.num_decode_steps,
            "mat": self.mat,
            "wall_time_s": self.wall_time_s,
            "tokens_per_s": self.tokens_per_s,
            "prefill_s": self.prefill_s,
            "draft_time_s": self.draft_time_s,
            "verify_time_s": self.verify_time_s,
            "acceptance_rate": self.acceptance_rate,
            "retrieval_success": self.retrieval_success,
            "accepted_histogram": self.accepted_histogram,
        }
        if with_steps:
            out["steps"] = [asdict(s) for s in self.steps]
        return out


@dataclass
class GenerationOutput:
    token_ids: list[int]  # new tokens only (EOS included when it ended the generation)
    text: str
    finish_reason: str  # "stop" (EOS or stop string) or "length"
    stats: GenerationStats


class Emitter:
    """Hands emitted tokens to the text stream one by one and decides when to stop."""

    def __init__(
        self,
        tokenizer: object,
        eos_token_ids: Collection[int],
        config: GenerationConfig,
        on_text: Callable[[str], None] | None,
        on_piece: Callable[[Piece], None] | None = None,
    ) -> None:
        """on_piece: also hand each piece of text on with its token's source (`specdec.engine.provenance`);
        only then are sources recorded."""
        self.stream = TextStream(tokenizer, config.stop)
        self.eos = frozenset() if config.ignore_eos else frozenset(eos_token_ids)
        self.max_new_tokens = config.max_new_tokens
        self.on_text = on_text
        self.on_piece = on_piece
        self.provenance = Provenance() if on_piece is not None else None
        self._tag = (TARGET, 0)  # the source and step of the last token pushed
        self.finish_reason = "length"

    @property
    def remaining(self) -> int:
        return self.max_new_tokens - len(self.stream.token_ids)

    def drafted(self, proposer: object, tree: DraftTree) -> None:
        """The tree `proposer` just proposed: its node sources are read now (only where pieces are wanted)."""
        if self.provenance is not None:
            self.provenance.drafted(proposer, tree)

    def emit(self, tokens: list[int], step: int = 0) -> bool:
        """Emit the tokens of forward pass `step` (0: the prefill's) in order; True once it must end."""
        sources = self.provenance.tag(tokens, step) if self.provenance is not None else None
        for i, token in enumerate(tokens):
            if sources is not None:
                self._tag = (sources[i], step)
            self._send(self.stream.push(token))
            if token in self.eos or self.stream.stopped:
                self.finish_reason = "stop"
                return True
            if self.remaining <= 0:
                return True
        return False

    def finish(self) -> str:
        self._send(self.stream.finish())
        if self.stream.stopped:
            self.finish_reason = "stop"
        return self.stream.text

    def _send(self, text: str) -> None:
        if text and self.on_text is not None:
            self.on_text(text)
        if text and self.on_piece is not None:
            self.on_piece(Piece(text, *self._tag, len(self.stream.token_ids) - 1))
