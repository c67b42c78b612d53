"""Classic speculative decoding with a small draft model (Leviathan et al. 2023; Chen et al. 2023).

Why: a draft model that shares the target's tokenizer guesses a chain of tokens
one by one (cheap passes); the target checks the whole chain in one pass. With
greedy decoding the draft takes its argmax; with sampling it *draws* each token
from `logits_to_probs(draft_logits, sampling)` and hands those rows on as
`draft_probs`, so the speculative-sampling rule keeps the output distributed
exactly as the target's.

Invariants:
- the draft keeps its own KV cache (a `TargetModel` wrapper around the draft
  model) holding a prefix of the context; each step it is rolled back (`trim`)
  to the longest prefix shared with the accepted context, then the missing
  tokens are fed, so the draft never re-reads what it has already seen and
  never keeps KV of rejected drafts. The target's cache is never touched;
- `draft_probs` row i (i >= 1) is the distribution draft token i was drawn
  from (row 0 unused, zeros); it is built only when sampling (the greedy rule
  ignores it), over the target's vocabulary size (draft logits cut or padded);
- the chain's length is a stopping time: whether token i joins the chain depends
  on the draft distributions and tokens before it, never on token i's own
  value (that would bias the kept draws and break losslessness when sampling);
- all randomness comes from the proposer's own `torch.Generator`, seeded from
  the sampling seed through a fixed mixing step so its stream differs from the
  verifier's (the draft draws must be independent of the acceptance draws);
- the draft's dtype and device are the target's, and its Linear weights are
  prepacked as the target's are (`specdec.packed`); `quantize=int8` swaps the
  draft's Linear layers for dynamic int8 ones (CPU): a cheaper, slightly worse
  guesser, and still lossless since only the draft changes. `quantize=auto`
  (the default) does so on CPU for drafts of at least `AUTO_INT8_PARAMS`
  (measured on Qwen2.5-Coder-1.5B with its 0.5B draft, bf16: `draft` 1.60x
  faster with the int8 draft, same run); a smaller draft loses more agreement
  than its cheaper pass buys (SmolLM2-135M as its own int8 draft: 43-74%).

The chain's length (fixed `k`, transformers' heuristic, or the cost-aware
`cost` / `timed` rules) is decided by `specdec.proposers.chain_length`.
"""

from __future__ import annotations

import copy
import time
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from transformers.modeling_outputs import CausalLMOutputWithPast

from specdec.engine import ProposalContext
from specdec.models import LoadedModel, load_model
from specdec.packed import PackedLinear, maybe_packed
from specdec.proposers.chain_length import ChainSettings, DraftLength, PassTimes
from specdec.proposers.draft_jump import RetrievalJump
from specdec.sampling import SamplingParams, logits_to_probs, point_mass_rows
from specdec.target import FAST_HEAD_TYPES, TargetModel
from specdec.tree import DraftTree
from specdec.verify import VerifyResult

if TYPE_CHECKING:
    from specdec.proposers.universal import UniversalDraftProposer

QUANTIZE = ("auto", "none", "int8")
AUTO_INT8_PARAMS = 300e6  # `compute_params` from which `quantize=auto` picks int8 on CPU
TEXT_CHOICES = ("auto", "always", "never")
# One more verified token, in units of a one-token target pass (the `cost` rule, and the prior of
# the `timed` fit). Measured on the dev CPU in fp32: SmolLM2-135M 0.05 (52 ms for 1 token, 94 ms
# for 16); Qwen2.5-Coder-1.5B, one thread under load, about 0.3. A middle value:
VERIFY_COST_PER_TOKEN = 0.1
# A transformers decoder layer costs some fixed Python/dispatch time on top of its
# matmuls; on the dev CPU (fp32, 1 token) that is about as much as 2M parameters' worth.
LAYER_OVERHEAD_PARAMS = 2_000_000
# An int8 draft's pass against the same draft in the target's dtype (the cost ratio's prior; the
# `timed` schedule then measures). Qwen2.5-Coder-0.5B, one decode pass at 300 tokens of context,
# 2-core AVX-512 CPU: int8 30 ms, bf16 95 ms, fp32 169 ms.
INT8_COST_FACTOR = {torch.float32: 0.18, torch.bfloat16: 0.32, torch.float16: 0.32}
SAMPLE_SIZE = 512  # token -> id pairs compared between tokenizers
_SEED_MIX = 0x9E3779B97F4A7C15


class TokenizerMismatchError(ValueError):
    """The draft model's tokenizer does not map tokens to the same ids as the target's."""


def compute_params(model: torch.nn.Module, num_layers: int | None = None) -> float:
    """Cost of one 1-token pass in parameter units: matmul weights plus a per-layer overhead.

    The input embedding is a lookup, not a matmul, so it counts only when it is tied to
    the output head (then it *is* the head). `num_layers` defaults to the config's.
    """
    total = sum(p.numel() for p in model.parameters())  # shared (tied) tensors count once
    embedding = model.get_input_embeddings().weight
    head = model.get_output_embeddings()
    if head is None or head.weight is not embedding:
        total -= embedding.numel()
    layers = model.config.num_hidden_layers if num_layers is None else num_layers
    return float(total + LAYER_OVERHEAD_PARAMS * layers)


def check_same_tokenizer(draft_tokenizer, target_tokenizer, draft_name: str = "the draft") -> None:
    """Raise TokenizerMismatchError unless both tokenizers have the same size and token -> id map.

    Compares the sizes and an evenly spaced sample of SAMPLE_SIZE vocabulary entries
    (plus the special tokens), which catches a different tokenizer in practice while
    staying cheap for 150k-entry vocabularies.
    """
    draft_size, target_size = len(draft_tokenizer), len(target_tokenizer)
    if draft_size != target_size:
        raise TokenizerMismatchError(
            f"{draft_name} has a tokenizer of {draft_size} tokens but the target's has {target_size}: "
            "a draft model must share the target's tokenizer"
        )
    draft_vocab, target_vocab = draft_tokenizer.get_vocab(), target_tokenizer.get_vocab()
    entries = sorted(target_vocab.items(), key=lambda item: item[1])
    step = max(1, len(entries) // SAMPLE_SIZE)
    sample = entries[::step] + [(t, target_vocab[t]) for t in target_tokenizer.all_special_tokens]
    for token, token_id in sample:
        if draft_vocab.get(token) != token_id:
            raise TokenizerMismatchError(
                f"{draft_name}'s tokenizer maps {token!r} to {draft_vocab.get(token)} but the target's "
                f"maps it to {token_id}: a draft model must share the target's tokenizer"
            )


def quantize_int8(model: torch.nn.Module) -> torch.nn.Module:
    """A float32 copy of `model` with dynamic int8 Linear layers (weights int8, activations quantized per pass).

    Only ever applied to a *draft*: its guesses get a little worse, the output stays
    lossless because the target verifies every token. CPU only (fbgemm / onednn kernels).
    The dynamic int8 kernels take float32 activations only, so a bf16 draft (the target's
    dtype) is copied to float32 first; the rest of the draft (embeddings, norms,
    attention) then runs in float32 too. Measured on a 2-core AVX-512 CPU, one decode
    pass of Qwen2.5-Coder-0.5B at 300 tokens of context: bf16 95 ms, int8 30 ms.
    """
    if next(model.parameters()).device.type != "cpu":
        raise ValueError("quantize=int8 runs on CPU only")
    model = copy.deepcopy(model).float()  # the caller's module (maybe the target itself) stays as it was
    with warnings.catch_warnings():  # torch.ao.quantization announces its move to torchao
        warnings.simplefilter("ignore")
        return torch.ao.quantization.quantize_dynamic(model, {torch.nn.Linear}, dtype=torch.qint8, inplace=True)


def wants_int8(quantize: str, draft_model: torch.nn.Module, min_params: float = AUTO_INT8_PARAMS) -> bool:
    """Whether the draft runs with int8 Linear layers: asked for, or `auto` with a large draft on CPU."""
    if quantize != "auto":
        return quantize == "int8"
    on_cpu = next(draft_model.parameters()).device.type == "cpu"
    return on_cpu and compute_params(draft_model) >= min_params


def last_row_head(model: torch.nn.Module) -> tuple[torch.nn.Module, torch.nn.Module] | None:
    """(decoder, output head) when the last position's logits may be computed as head(decoder(...)[:, -1:]).

    Why not transformers' own `logits_to_keep=1`: see `last_logits`.
    """
    if model.config.model_type not in FAST_HEAD_TYPES or not hasattr(model, "get_decoder"):
        return None
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    return (model.get_decoder(), head) if isinstance(head, (torch.nn.Linear, PackedLinear)) else None


def last_logits(head: torch.nn.Module, hidden: torch.Tensor) -> torch.Tensor:
    """hidden [B, T, H] -> the last position's logits [B, 1, V], the head run over the last two rows.

    Why two: in bf16 on the AVX-512 CPU we measured (torch 2.13), the head's product over a single
    row of a multi-token pass took 0.55-0.9 s and over two rows 0.02 s (Qwen2.5-Coder-0.5B, vocab
    152k); transformers' `logits_to_keep=1` takes the one-row path, so every draft catch-up and draft
    prompt paid it (the target's own prefill measured no different, so it keeps transformers' path).
    Used for drafts only: the kept row may differ from a one-row product in its last bits, and
    drafts are guesses that verification keeps lossless.
    """
    return head(hidden[:, -2:])[:, -1:]


class LastLogitsOnly(torch.nn.Module):
    """A causal LM that returns only its last position's logits (a draft never needs the others).

    Saves the output head over every prompt position when the draft reads the prompt. Where the
    model allows it, the head runs on the decoder's last rows itself (`last_logits`:
    transformers' `logits_to_keep=1` cost ~0.7 s more per multi-token bf16 pass here).
    """

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model
        self.config = model.config
        self._last_row = last_row_head(model)

    def forward(self, **kwargs):
        kwargs.pop("logits_to_keep", None)
        if self._last_row is None:
            return self.model(**kwargs, logits_to_keep=1)
        decoder, head = self._last_row
        return CausalLMOutputWithPast(logits=last_logits(head, decoder(**kwargs).last_hidden_state))


@dataclass(frozen=True)
class DraftConfig:
    """A small draft model sharing the target's tokenizer; dtype and device follow the target."""

    draft_model: str = ""  # name or path for load_model, e.g. qwen2.5-coder-0.5b (required)
    k: int = 4  # draft length (the starting one for the heuristic)
    adaptive: bool = True
    schedule: str = "timed"  # timed | cost | heuristic (see specdec.proposers.chain_length)
    max_k: int = 12
    cost_ratio: float = 0.0  # draft pass / target pass; 0 = from parameter counts
    verify_cost: float = VERIFY_COST_PER_TOKEN
    cache_dir: str = ""  # where load_model keeps converted models ("" = its default)
    quantize: str = "auto"  # none: the target's dtype; int8: dynamic int8 Linear layers (CPU); auto: int8 for large drafts on CPU
    text: str = "auto"  # drafts through text (another tokenizer): auto (when they differ) | always | never
    jump: int = 0  # >0: copy the text where a match of >= this many tokens agrees with the draft (draft_jump)
    jump_length: int = 10  # most tokens one jump copies

    def __post_init__(self) -> None:
        self.chain_settings(0.5)  # validates k, max_k, schedule
        if self.cost_ratio < 0 or self.verify_cost < 0:
            raise ValueError("cost_ratio and verify_cost must be >= 0")
        if self.quantize not in QUANTIZE:
            raise ValueError(f"quantize must be one of {', '.join(QUANTIZE)} (got {self.quantize!r})")
        if self.text not in TEXT_CHOICES:
            raise ValueError(f"text must be one of {', '.join(TEXT_CHOICES)} (got {self.text!r})")
        if self.jump:
            RetrievalJump(self.jump, self.jump_length)  # validates both

    def chain_settings(self, cost_ratio: float) -> ChainSettings:
        cost = max((self.cost_ratio or cost_ratio) + self.verify_cost, 1e-3)
        return ChainSettings(self.k, self.max_k, self.adaptive, self.schedule, cost, self.verify_cost)

    def build(self, loaded: LoadedModel) -> DraftProposer | UniversalDraftProposer:
        """Load the draft model; a draft with another tokenizer drafts through text (`text=auto`)."""
        if not self.draft_model:
            raise ValueError("draft: give the draft model, e.g. draft:draft_model=qwen2.5-coder-0.5b")
        draft = load_model(
            self.draft_model, dtype=loaded.dtype, device=str(loaded.device), cache_dir=self.cache_dir or None
        )
        return self.build_loaded(loaded, draft)

    def build_loaded(self, loaded: LoadedModel, draft: LoadedModel) -> DraftProposer | UniversalDraftProposer:
        name = f"draft model {self.draft_model!r}"
        try:
            check_same_tokenizer(draft.tokenizer, loaded.tokenizer, name)
            via_text = self.text == "always"
        except TokenizerMismatchError:
            if self.text == "never":
                raise
            via_text = True
        if not via_text:
            return self.build_with(loaded, draft.model)
        from specdec.proposers.universal import UniversalDraftProposer  # it imports this module

        inner = self.build_with(loaded, draft.model, draft.model.config.vocab_size)
        return UniversalDraftProposer(inner, draft.tokenizer, loaded.tokenizer)

    def build_with(
        self, loaded: LoadedModel, draft_model: torch.nn.Module, vocab_size: int | None = None
    ) -> DraftProposer:
        """A proposer for an already loaded draft module (the caller vouches for its tokenizer).

        `vocab_size`: of the drafted rows (default: the target's, which a shared tokenizer implies).
        """
        return self.build_prepared(loaded, self.prepare(loaded, draft_model), vocab_size)

    def prepare(self, loaded: LoadedModel, draft_model: torch.nn.Module) -> PreparedDraft:
        """The draft module as it will run (int8 when `quantize` asks for it) and its cost ratio.

        The server prepares once and builds a proposer per concurrent request from it, so the
        int8 copy (seconds, and a float32 copy of the draft's weights on the way) is made once.
        """
        ratio = compute_params(draft_model) / compute_params(loaded.model)
        if wants_int8(self.quantize, draft_model):
            draft_model = quantize_int8(draft_model)
            ratio *= INT8_COST_FACTOR.get(loaded.dtype, 0.32)
        else:  # packed as the target is, so the cost ratio still holds
            draft_model = maybe_packed(draft_model, loaded.pack)
        return PreparedDraft(draft_model, ratio)

    def build_prepared(
        self, loaded: LoadedModel, prepared: PreparedDraft, vocab_size: int | None = None
    ) -> DraftProposer:
        """A proposer (its own KV cache and schedule) around a prepared draft module, which it may share."""
        vocab_size = vocab_size or loaded.model.config.vocab_size
        jump = RetrievalJump(self.jump, self.jump_length, loaded.eos_token_ids) if self.jump else None
        settings = self.chain_settings(prepared.cost_ratio)
        return DraftProposer(LastLogitsOnly(prepared.module), settings, vocab_size, jump)


@dataclass(frozen=True)
class PreparedDraft:
    """A draft module ready to run (maybe an int8 copy) and its pass cost relative to the target's."""

    module: torch.nn.Module
    cost_ratio: float


class DraftProposer:
    """Drafts a chain with any causal LM (a separate draft model or a layer-skipping view)."""

    def __init__(
        self, draft_model: torch.nn.Module, settings: ChainSettings, vocab_size: int, jump: RetrievalJump | None = None
    ) -> None:
        self.runner = TargetModel(draft_model)  # the draft's own KV cache
        self.jump = jump
        # with a jump, the chain has two sources (counted for bench's per-source table)
        self.source_stats = {s: {"offered": 0, "accepted": 0} for s in ("draft", "lookup")} if jump else None
        self._copied = 0  # tokens this step's chain copied from the text (after the draft's own)
        self.settings = settings
        self.vocab_size = vocab_size
        self.length = DraftLength(settings)
        self.cached: list[int] = []  # tokens whose KV the draft cache holds, in order
        self.num_checked = 0  # cached[:num_checked] is known to equal the context
        self.generator: torch.Generator | None = None
        self._step = (0, 0.0, 0.0, 0, PassTimes())  # drafted, summed chain probability, seconds, passes, steady
        self._proposed_at = 0.0
        self._refused: tuple[int, float] | None = None  # greedy: a first token the stop rule refused

    def begin(self, prompt_ids: list[int]) -> None:
        self.runner.reset()
        if self.jump is not None:
            self.jump.begin()
        self.cached, self.num_checked, self.generator = [], 0, None
        if len(prompt_ids) > 1:  # the prompt's last token is fed with the first root
            self.runner.append(prompt_ids[:-1])
            self.cached = list(prompt_ids[:-1])
            self.num_checked = len(self.cached)

    def sync(self, token_ids: list[int]) -> tuple[torch.Tensor, int]:
        """Roll the draft cache back to the part shared with the context, feed the rest.

        Returns the last position's logits [V] and how many tokens were fed.
        """
        shared = self.num_checked
        limit = min(len(self.cached), len(token_ids) - 1)  # always feed at least the root
        while shared < limit and self.cached[shared] == token_ids[shared]:
            shared += 1
        shared = min(shared, limit)
        if shared < len(self.cached):
            self.runner.trim(shared)
            del self.cached[shared:]
        new = token_ids[shared:]
        logits = self.runner.append(new)[-1]
        self.cached.extend(new)
        self.num_checked = len(token_ids)
        return logits, len(new)

    def _generator(self, sampling: SamplingParams) -> torch.Generator:
        if self.generator is None:
            seed = sampling.seed
            if seed is None:
                seed = int(torch.randint(0, 2**62, (1,), dtype=torch.int64))
            self.generator = torch.Generator(device=self.runner.device)
            self.generator.manual_seed((seed * _SEED_MIX + 1) % 2**63)
        return self.generator

    def _pick(self, logits: torch.Tensor, sampling: SamplingParams) -> tuple[int, float, torch.Tensor | None]:
        """(token, the draft's confidence, the row it was drawn from or None when greedy).

        The confidence is the draft distribution's largest probability, never the drawn
        token's own: whether a token joins the chain must not depend on which token was
        drawn, or the kept tokens would no longer be draws from their rows and the
        speculative-sampling rule would stop being lossless. (Greedy: the same number.)
        """
        logits = self._fit_vocab(logits)
        if sampling.greedy:
            token = int(logits.argmax())
            if not self.length.uses_confidence:
                return token, 1.0, None
            return token, float(torch.softmax(logits.float(), -1)[token]), None
        probs = logits_to_probs(logits, sampling)  # [V] float32
        token = int(torch.multinomial(probs, 1, generator=self._generator(sampling)))
        return token, float(probs.max()), probs

    def _fit_vocab(self, logits: torch.Tensor) -> torch.Tensor:
        """Draft logits [V_draft] -> [V_target]: cut extra (padding) rows, pad missing ones with -inf."""
        size = logits.shape[-1]
        if size == self.vocab_size:
            return logits
        if size > self.vocab_size:
            return logits[: self.vocab_size]
        return torch.cat([logits, logits.new_full((self.vocab_size - size,), float("-inf"))])

    @torch.inference_mode()
    def propose(self, ctx: ProposalContext) -> DraftTree:
        start = time.perf_counter()
        self._refused = None
        root = ctx.token_ids[-1]
        limit = min(self.length.begin_step(ctx.sampling.greedy), ctx.max_depth)
        drafts: list[int] = []
        copied: list[int] = []  # from the text, after the draft's tokens (`jump`)
        rows: list[torch.Tensor] = []
        predicted, passes, steady = 0.0, 0, PassTimes()
        if limit > 0:
            if self.jump is not None:
                self.jump.sync(ctx.token_ids)
            sync_start = time.perf_counter()
            logits, fed = self.sync(ctx.token_ids)
            if fed <= self.settings.max_k + 1:  # a catch-up over skipped steps is no per-token cost
                steady.add(time.perf_counter() - sync_start)
            passes, chain_prob = 1, 1.0
            while True:
                token, prob, row = self._pick(logits, ctx.sampling)
                chain_prob *= prob
                if not self.length.keep_going(chain_prob):
                    if not drafts and ctx.sampling.greedy:
                        self._refused = (token, chain_prob)
                    break
                drafts.append(token)
                predicted += chain_prob
                if row is not None:
                    rows.append(row)
                if self.jump is not None:
                    copied = self.jump.after(drafts, ctx.max_depth - len(drafts))
                if copied or len(drafts) >= limit:
                    break
                pass_start = time.perf_counter()
                logits = self.runner.append([token])[-1]
                steady.add(time.perf_counter() - pass_start)
                self.cached.append(token)
                passes += 1
        if copied and rows:  # deterministic guesses: point-mass draft rows
            rows.extend(point_mass_rows(torch.tensor(copied, device=rows[0].device), self.vocab_size).unbind(0))
        draft_probs = torch.stack([torch.zeros_like(rows[0]), *rows]) if rows else None  # [n + 1, V]
        self._proposed_at = time.perf_counter()
        self._copied = len(copied)
        self._step = (len(drafts), predicted, self._proposed_at - start, passes, steady)
        return DraftTree.chain(root, drafts + copied, draft_probs)

    def observe(self, result: VerifyResult) -> None:
        self.record(result.num_accepted, first_token=result.tokens[0])

    def record(self, num_accepted: int, tree_size: int = 0, first_token: int | None = None) -> None:
        """Teach the length schedule how many of this step's drafts were accepted (right after verifying).

        `first_token`: the target's first emitted token, when it is in the draft's vocabulary.
        """
        if self._refused is not None and first_token is not None:  # would the refused token have passed?
            token, prob = self._refused
            self.length.learn_refused(prob, first_token == token)
        verify_s = time.perf_counter() - self._proposed_at  # the engine verifies right after propose
        drafted, predicted, draft_s, passes, steady = self._step
        self._step = (0, 0.0, 0.0, 0, PassTimes())
        if self.source_stats is not None:
            for source, offered, accepted in (("draft", drafted, min(num_accepted, drafted)),
                                              ("lookup", self._copied, max(num_accepted - drafted, 0))):  # fmt: skip
                self.source_stats[source]["offered"] += offered
                self.source_stats[source]["accepted"] += accepted
        if self._copied:  # the schedule learns the draft's own tokens; verification priced at the chain's size
            tree_size = tree_size or drafted + self._copied + 1
            num_accepted = min(num_accepted, drafted)
        self.length.update(drafted, num_accepted, predicted, draft_s, passes, verify_s, tree_size, steady)
