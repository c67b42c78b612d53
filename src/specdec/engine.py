"""The decode loop shared by every method, plain decoding included.

    prompt --prefill--> KV cache, last logits, first token (the first root)
    until EOS / stop string / max_new_tokens / context full:
        proposer.propose(ctx) -> DraftTree     (root = last emitted token)
        verify(target, tree)  -> VerifyResult  (one forward pass, KV committed)
        proposer.observe(result)
        emit result.tokens one by one (streaming, stop checks)

Invariants:
- output never overshoots: emission stops at the first EOS (kept in token_ids,
  like transformers' generate), at a stop string (cut from the text), or at
  exactly `max_new_tokens`, even inside a run of accepted tokens;
- MAT counts decode steps only: the prefill's forward pass and the first token it
  yields are left out, so plain decoding has MAT = 1.00 exactly and a proposer
  whose every draft of depth d is accepted has MAT = d + 1 exactly.
  `num_forward_passes` = decode steps + 1 (the prefill) for one prompt;
- randomness comes only from one `torch.Generator` seeded from the sampling params;
  the t-th sampled token is drawn with its t-th uniform (`specdec.uniforms`), so
  with drafts that carry no probabilities a seed gives plain sampling's tokens.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Protocol

import torch

from specdec.attention import AttentionPlan, resolve_plan
from specdec.models import LoadedModel
from specdec.packed import verify_model
from specdec.sampling import SamplingParams, draw_next, make_generator
from specdec.target import TargetModel
from specdec.text import TextStream
from specdec.tree import DraftTree
from specdec.uniforms import PositionUniforms
from specdec.verify import VerifyResult, verify


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


class Proposer(Protocol):
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


class Engine:
    """Runs the decode loop of any proposer against one loaded target model."""

    def __init__(self, loaded: LoadedModel, attention: str | AttentionPlan = "auto") -> None:
        """attention: "auto" (the plan measured once per machine, see `specdec.attention`), an
        implementation name for every pass ("sdpa", "eager"), or an `AttentionPlan`. Verification
        runs on `specdec.packed.verify_model(loaded)`: prepacked Linear weights as `loaded.pack` says."""
        self.loaded = loaded
        self.tokenizer = loaded.tokenizer
        self.target = TargetModel(verify_model(loaded), attention=resolve_plan(loaded, attention))
        self.eos_token_ids = frozenset(loaded.eos_token_ids)

    def generate(
        self,
        prompt_ids: list[int],
        proposer: Proposer,
        config: GenerationConfig,
        on_text: Callable[[str], None] | None = None,
    ) -> GenerationOutput:
        prompt_ids = [int(t) for t in prompt_ids]
        self.check_prompt(prompt_ids)
        sampling = config.sampling
        generator = make_generator(sampling, self.target.device)
        positions = PositionUniforms(generator, self.target.device)  # token t is drawn with the t-th uniform
        stats = GenerationStats(num_prompt_tokens=len(prompt_ids))
        out = Emitter(self, config, on_text)
        start = time.perf_counter()
        proposer.begin(prompt_ids)
        logits = self.target.prefill(prompt_ids)
        stats.num_forward_passes = 1
        tokens = [*prompt_ids, draw_next(logits, sampling, positions)]
        stats.prefill_s = time.perf_counter() - start
        done = out.emit(tokens[-1:])
        while not done and len(tokens) < self.context_limit:
            ctx = ProposalContext(tokens, logits, len(prompt_ids), sampling, self.max_depth(tokens, out))
            t0 = time.perf_counter()
            tree = proposer.propose(ctx)
            t1 = time.perf_counter()
            if len(tokens) + tree.max_depth >= self.context_limit:  # past max_new_tokens is only cut
                raise RuntimeError(f"{type(proposer).__name__} drafted past the model's context")
            result = verify(self.target, tree, sampling, generator, positions)
            t2 = time.perf_counter()
            proposer.observe(result)
            stats.num_forward_passes += 1
            stats.steps.append(StepStats(tree.num_nodes, result.num_accepted, t1 - t0, t2 - t1))
            tokens.extend(result.tokens)
            logits = result.next_logits
            done = out.emit(result.tokens)
        stats.wall_time_s = time.perf_counter() - start
        stats.num_new_tokens = len(out.stream.token_ids)
        return GenerationOutput(out.stream.token_ids, out.finish(), out.finish_reason, stats)

    @property
    def context_limit(self) -> int | float:
        """Most tokens a sequence may hold: the model's `max_position_embeddings`; 0 there means unbounded."""
        return self.target.max_length or math.inf

    def max_depth(self, tokens: list[int], out: Emitter) -> int:
        """Deepest draft that can still be emitted: within max_new_tokens, and with every tree node and
        the bonus token after the deepest one at a position below the context limit."""
        room = self.context_limit - len(tokens) - 1
        return int(max(0, min(out.remaining - 1, room)))

    def check_prompt(self, prompt_ids: list[int]) -> None:
        if not prompt_ids:
            raise ValueError("the prompt is empty: give at least one token")
        limit = self.target.max_length
        if limit and len(prompt_ids) >= limit:
            raise ValueError(f"the prompt has {len(prompt_ids)} tokens; the model's context is {limit}")
        vocab = self.target.config.vocab_size
        if min(prompt_ids) < 0 or max(prompt_ids) >= vocab:
            raise ValueError(f"prompt token ids must lie in [0, {vocab})")


class Emitter:
    """Hands emitted tokens to the text stream one by one and decides when to stop."""

    def __init__(self, engine: Engine, config: GenerationConfig, on_text: Callable[[str], None] | None):
        self.stream = TextStream(engine.tokenizer, config.stop)
        self.eos = frozenset() if config.ignore_eos else engine.eos_token_ids
        self.max_new_tokens = config.max_new_tokens
        self.on_text = on_text
        self.finish_reason = "length"

    @property
    def remaining(self) -> int:
        return self.max_new_tokens - len(self.stream.token_ids)

    def emit(self, tokens: list[int]) -> bool:
        """Emit tokens in order; True once generation must end."""
        for token in tokens:
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
