"""Classic speculative decoding with a small draft model (Leviathan et al. 2023; Chen et al. 2023).

Why: a draft model that shares the target's tokenizer guesses a chain of tokens
one by one (cheap passes); the target checks the whole chain in one pass. With
greedy decoding the draft takes its argmax; with sampling it *draws* each token
from `logits_to_probs(draft_logits, sampling)` and hands those rows on as
`draft_probs`, so the speculative-sampling rule keeps the output distributed
exactly as the target's.

Invariants:
- the draft keeps its own KV cache (a `TargetModel` wrapper around the draft
  model; on CUDA a `GraphedSequence`, whose passes replay as CUDA graphs:
  `registry.draft_runner`) holding a prefix of the context; each step it is rolled back (`trim`)
  to the longest prefix shared with the accepted context, then the missing
  tokens are fed, so the draft never re-reads what it has already seen and
  never keeps KV of rejected drafts. The target's cache is never touched;
- a greedy chain of fixed length (no confidence rule: `adaptive=false` or the heuristic
  schedule; no `fill` or `jump`) is drafted on the device where the draft's passes replay as
  graphs (`GraphedSequence.greedy_chain`): the same picks, read back once, not one a token;
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
  prepacked as the target's are (`specdec.backends.torch.packed`); `quantize=int8` swaps the
  draft's Linear layers for dynamic int8 ones (CPU): a cheaper, slightly worse
  guesser, and still lossless since only the draft changes. `quantize=auto`
  (the default) does so on CPU for drafts of at least `draft_module.AUTO_INT8_PARAMS`
  (with Qwen2.5-Coder-1.5B's 0.5B draft `draft` ran well faster with the int8 draft);
  a smaller draft loses more agreement than its cheaper pass buys (docs/benchmarks.md).
  Where the target verifies on 4-bit weights batch-invariantly (a GGUF target in bf16 on
  an AVX-512 BF16 CPU, the fused pass) and the draft is a GGUF too, `auto` runs the draft
  on the same path, on its own file's blocks: one C++ call a draft pass;
- with `vocab=N` the draft's head scores the first N token ids only (`with_head_rows`):
  a cheaper draft pass; logits past N are -inf, so neither its picks nor its draws ever
  leave them, and the rule that verifies them needs nothing else.

The chain's length (fixed `k`, transformers' heuristic, or the cost-aware
`cost` / `timed` rules) is decided by `specdec.proposers.chain_length`; which
module drafts and what its pass costs, by `specdec.proposers.draft_module`.
With `jump=N` prompt lookup is the draft's lookahead (`specdec.proposers.draft_jump`):
where a match of at least N tokens had predicted the draft's own pick, the pick
and the text's continuation are fed in one draft pass, so while later picks
follow the text their logits are already made; at the first pick that differs
the unpicked copies leave the draft's cache. Every chain token is still the
draft's own pick from its own row, so acceptance is unchanged. Greedy only: a
pick that follows the text joins the chain whatever the length rule's
confidence says (when sampling, joining must not depend on the token's value).
With `fill=N` (greedy only) the chain is verified as a tree of up to N nodes: the
spare nodes hold the draft's runner-up at chain positions and its picks where the
chain stopped, as leaves, most likely first (on a CPU a pass over a few tokens
costs about what a one-token pass does). A leaf only adds a path the
target may take; the accepted path is still the target's argmax chain. Drafts
through text (another tokenizer) hand on their chain only.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Annotated, Literal

import torch

from specdec.backends.registry import (
    AttentionPlan,
    SequencePool,
    draft_runner,
    pack_draft,
    runs_graphed,
    verifies_on_int4,
    verify_model,
)
from specdec.engine.generation import ProposalContext
from specdec.engine.read_back import read_back
from specdec.engine.verify import VerifyResult
from specdec.models import LoadedModel, load_model
from specdec.proposers.base import ProposerBase
from specdec.proposers.chain_length import SCHEDULES, ChainSettings, DraftLength, PassTimes
from specdec.proposers.draft_jump import MAX_NGRAM as JUMP_MAX_NGRAM
from specdec.proposers.draft_jump import RetrievalJump
from specdec.proposers.draft_module import (
    LastLogitsOnly,
    TokenizerMismatchError,
    check_same_tokenizer,
    compute_params,
    quantize_int8,
    wants_int8,
    with_head_rows,
)
from specdec.proposers.schema import Preparation, method_config, option
from specdec.proposers.universal import UniversalDraftProposer
from specdec.sampling import SamplingParams, logits_to_probs
from specdec.tree import DraftTree

QUANTIZE = ("auto", "none", "int8")
TEXT_CHOICES = ("auto", "always", "never")
# One more verified token, in units of a one-token target pass (the `cost` rule, and the prior of
# the `timed` fit). Measured values ran from 0.05 (SmolLM2-135M, fp32) to about 0.3 (Qwen2.5-Coder-1.5B,
# one thread under load); a middle value:
VERIFY_COST_PER_TOKEN = 0.1
# An int8 draft's pass against the same draft in the target's dtype (the cost ratio's prior; the
# `timed` schedule then measures): the ratios of Qwen2.5-Coder-0.5B's int8 pass to its fp32 and bf16 ones.
INT8_COST_FACTOR = {torch.float32: 0.18, torch.bfloat16: 0.32, torch.float16: 0.32}
_SEED_MIX = 0x9E3779B97F4A7C15
MAX_FILL = 64


@method_config("draft")
class DraftConfig:
    """A small draft model sharing the target's tokenizer; dtype and device follow the target."""

    draft_model: str = ""  # name or path for load_model, e.g. qwen2.5-coder-0.5b (required)
    k: Annotated[int, option(ge=1, request_max=16)] = 4  # draft length (the starting one for the heuristic)
    adaptive: Annotated[bool, option(request=True)] = True
    # see specdec.proposers.chain_length
    schedule: Annotated[Literal[SCHEDULES], option(request=True)] = "timed"
    max_k: Annotated[int, option(ge=1, request_max=16)] = 12
    cost_ratio: Annotated[float, option(ge=0.0)] = 0.0  # draft pass / target pass; 0 = from parameter counts
    verify_cost: Annotated[float, option(ge=0.0)] = VERIFY_COST_PER_TOKEN
    cache_dir: str = ""  # where load_model keeps converted models ("" = its default)
    # none: the target's dtype; int8: dynamic int8 Linear layers (CPU); auto: int8 for large drafts on CPU
    quantize: Literal[QUANTIZE] = "auto"
    # drafts through text (another tokenizer): auto (when they differ) | always | never
    text: Literal[TEXT_CHOICES] = "auto"
    # >0: copy the text where a match of >= this many tokens agrees with the draft (draft_jump)
    jump: Annotated[int, option(ge=0, le=JUMP_MAX_NGRAM)] = 0
    jump_length: Annotated[int, option(ge=1)] = 10  # most tokens one jump copies
    # greedy: verify up to this many nodes, spare ones holding the draft's runner-up picks (0 = the chain)
    fill: Annotated[int, option(ge=0, le=MAX_FILL)] = 0
    # >0: the draft scores only the first this many token ids (a cheaper head; see draft_module.with_head_rows)
    vocab: Annotated[int, option(ge=0)] = 0

    def __post_init__(self) -> None:
        self.chain_settings(0.5)  # k <= max_k

    def chain_settings(self, cost_ratio: float) -> ChainSettings:
        cost = max((self.cost_ratio or cost_ratio) + self.verify_cost, 1e-3)
        return ChainSettings(self.k, self.max_k, self.adaptive, self.schedule, cost, self.verify_cost)

    def preparation(self) -> Preparation:
        """The draft model, loaded (and quantized, when `quantize` asks for it) once."""
        return Preparation(
            ("draft", self.draft_model, self.cache_dir, self.quantize, self.vocab),
            self._prepare_loaded,
            self.build_prepared,
            "draft needs a draft model set by the server, and this server has none "
            "(operator: specdec serve --method-config draft:draft_model=NAME)",
        )

    def _prepare_loaded(self, loaded: LoadedModel) -> PreparedDraft:
        if not self.draft_model:
            raise ValueError("draft: give the draft model, e.g. --method-config draft:draft_model=qwen2.5-coder-0.5b")
        draft = self._load(loaded)
        check_same_tokenizer(draft.tokenizer, loaded.tokenizer, f"draft model {self.draft_model!r}")
        return self.prepare(loaded, draft.model, draft)

    def _load(self, loaded: LoadedModel) -> LoadedModel:
        """The draft model, loaded with the target's dtype, device, pack and exactness (so a GGUF draft
        beside a GGUF target verified on the fused pass runs that pass too: `prepare`). Loaded once per
        target, kept in its state: later builds (a proposer a request) reuse it and the views made of it."""
        key = ("draft model", self.draft_model, self.cache_dir)
        return loaded.state.shared(key, lambda: load_model(
            self.draft_model, dtype=loaded.dtype, device=str(loaded.device), cache_dir=self.cache_dir or None,
            pack=loaded.pack, exact=loaded.exact))

    def build(self, loaded: LoadedModel) -> DraftProposer | UniversalDraftProposer:
        """Load the draft model; a draft with another tokenizer drafts through text (`text=auto`)."""
        if not self.draft_model:
            raise ValueError("draft: give the draft model, e.g. draft:draft_model=qwen2.5-coder-0.5b")
        return self.build_loaded(loaded, self._load(loaded))

    def build_loaded(self, loaded: LoadedModel, draft: LoadedModel) -> DraftProposer | UniversalDraftProposer:
        mismatch = loaded.state.shared(("draft tokenizer", draft.tokenizer), lambda: self._mismatch(loaded, draft))
        if mismatch is not None and self.text == "never":
            raise mismatch
        via_text = mismatch is not None or self.text == "always"
        if not via_text:
            return self.build_prepared(loaded, self.prepare(loaded, draft.model, draft))
        # a draft through text hands on its chain's tokens only: no leaves
        inner = replace(self, fill=0)
        prepared = inner.prepare(loaded, draft.model, draft)
        inner = inner.build_prepared(loaded, prepared, draft.model.config.vocab_size)
        return UniversalDraftProposer(inner, draft.tokenizer, loaded.tokenizer)

    def _mismatch(self, loaded: LoadedModel, draft: LoadedModel) -> TokenizerMismatchError | None:
        """Why the draft's tokenizer is not the target's, or None (asked once per pair, as comparing large
        vocabularies is slow: the state's key holds the tokenizer, so the answer lives as long as it does)."""
        try:
            check_same_tokenizer(draft.tokenizer, loaded.tokenizer, f"draft model {self.draft_model!r}")
        except TokenizerMismatchError as error:
            return error
        return None

    def build_with(
        self, loaded: LoadedModel, draft_model: torch.nn.Module, vocab_size: int | None = None
    ) -> DraftProposer:
        """A proposer for an already loaded draft module (the caller vouches for its tokenizer).

        `vocab_size`: of the drafted rows (default: the target's, which a shared tokenizer implies).
        """
        return self.build_prepared(loaded, self.prepare(loaded, draft_model), vocab_size)

    def prepare(
        self, loaded: LoadedModel, draft_model: torch.nn.Module, source: LoadedModel | None = None
    ) -> PreparedDraft:
        """The draft module as it will run (int8 when `quantize` asks for it) and its cost ratio.

        `source`: the LoadedModel `draft_model` is the module of, when there is one. Where the target
        and the draft both verify on 4-bit weights batch-invariantly (a GGUF pair in bf16 on an
        AVX-512 BF16 CPU), `quantize=auto` runs the draft on that path too, its own view and the
        invariant attention plan: the fused pass (`specdec.backends.torch.fused`), one C++ call a
        draft pass, on the draft file's own blocks.
        The server prepares once and builds a proposer per concurrent request from it, so the
        int8 copy (seconds, and a float32 copy of the draft's weights on the way) is made once.
        """
        ratio = compute_params(draft_model) / compute_params(loaded.model)
        if self.quantize == "auto" and source is not None and verifies_on_int4(loaded) and verifies_on_int4(source):
            view = verify_model(source)
            if self.vocab:  # kept beside the view it cuts: made once per draft model
                view = source.state.shared(("head rows", self.vocab), lambda: with_head_rows(view, self.vocab))
            return PreparedDraft(view, ratio, AttentionPlan.invariant())
        own = draft_model is loaded.model and not self.vocab
        if self.vocab:  # cut before quantizing or packing, which take the cut head as any other
            draft_model = with_head_rows(draft_model, self.vocab)
        if wants_int8(self.quantize, draft_model):
            draft_model = quantize_int8(draft_model)
            ratio *= INT8_COST_FACTOR.get(loaded.dtype, 0.32)
        else:  # packed as the target is, so the cost ratio still holds; the target's own view if it drafts itself
            draft_model = verify_model(loaded) if own else pack_draft(draft_model, loaded)
        runners = None
        if source is not None and draft_model is source.model and runs_graphed(draft_model):
            # the draft's own module on a GPU: its graphed sequences outlive a proposer (the API builds one a
            # call), kept in the draft's state, which lives as long as the module
            runners = source.state.shared(("graphed sequences",), lambda: SequencePool(draft_model))
        return PreparedDraft(draft_model, ratio, runners=runners)

    def build_prepared(
        self, loaded: LoadedModel, prepared: PreparedDraft, vocab_size: int | None = None
    ) -> DraftProposer:
        """A proposer (its own KV cache and schedule) around a prepared draft module, which it may share."""
        vocab_size = vocab_size or loaded.model.config.vocab_size
        jump = RetrievalJump(self.jump, self.jump_length, loaded.eos_token_ids) if self.jump else None
        settings = self.chain_settings(prepared.cost_ratio)
        # a view on the invariant plan runs its own head over the last row (the fused pass's `last_only`); a
        # graphed draft (CUDA) verifies chains of any bucket, so its module returns every row
        whole = prepared.attention is not None or runs_graphed(prepared.module)
        module = prepared.module if whole else LastLogitsOnly(prepared.module)
        return DraftProposer(module, settings, vocab_size, jump, self.fill, prepared.attention, prepared.runners)


@dataclass(frozen=True)
class PreparedDraft:
    """A draft module ready to run (maybe an int8 copy) and its pass cost relative to the target's;
    `attention`: the plan its passes run on (the invariant one on 4-bit weights), None for its own;
    `runners`: where its proposers lease their graphed sequences (a GPU), None: each makes its own."""

    module: torch.nn.Module
    cost_ratio: float
    attention: AttentionPlan | None = None
    runners: SequencePool | None = None  # the draft's graphed sequences, leased a proposer (CUDA)


class DraftProposer(ProposerBase):
    """Drafts a chain with any causal LM (a separate draft model or a layer-skipping view)."""

    prunable = True  # a batch may cut the tree to its budget
    # a chain of fixed length drafted on the device (`_device_chain`): None where the draft's passes replay as graphs
    device_chain: bool | None = None

    def __init__(
        self,
        draft_model: torch.nn.Module,
        settings: ChainSettings,
        vocab_size: int,
        jump: RetrievalJump | None = None,
        fill: int = 0,
        attention: AttentionPlan | None = None,
        runners: SequencePool | None = None,
    ) -> None:
        """runners: the draft's graphed sequences, one leased for this proposer's life (else one of its own)."""
        # the draft's own KV cache (graphed on CUDA)
        self.runner = runners.lease(self) if runners is not None else draft_runner(draft_model, attention)
        self.jump = jump
        self.fill = fill
        self._leaves: list[tuple[float, int, int]] = []  # greedy fill candidates: (gain, parent node, token)
        self._runner_up = (0, 0.0)  # greedy fill: the last pick's runner-up token and its probability
        self._chain_nodes = 0  # nodes of this step's chain (root included); later nodes are leaves
        self.num_leaves_accepted = 0  # steps whose accepted path ended in a `fill` leaf (proposer's life)
        self.num_passes = 0  # draft passes run, over the proposer's life
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
            if self.runner.runs_fused:  # in chunks, as a target's prompt: its attention scores stay bounded
                self.runner.prefill(prompt_ids[:-1])
            else:
                self._append(prompt_ids[:-1])
            self.cached = list(prompt_ids[:-1])
            self.num_checked = len(self.cached)

    def _append(self, token_ids: list[int]) -> torch.Tensor:
        """Feed and commit tokens; the last position's logits [1, V] (a draft's own module, `LastLogitsOnly` or
        a layer-skipping view, returns only those; a fused view is asked for them)."""
        return self.runner.append(token_ids, last_only=self.runner.runs_fused)

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
        logits = self._append(new)[-1]
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
            if self.fill:
                probs, tokens = torch.softmax(logits.float(), -1).topk(2)
                (prob, runner_prob), (token, runner) = read_back(probs, tokens)
                self._runner_up = (runner, runner_prob)
                return token, prob, None
            if not self.length.uses_confidence:
                return int(logits.argmax()), 1.0, None
            token = logits.argmax()
            token, prob = read_back(token, torch.softmax(logits.float(), -1)[token])
            return token, prob, None
        probs = logits_to_probs(logits, sampling)  # [V] float32
        token = torch.multinomial(probs, 1, generator=self._generator(sampling))[0]
        token, top = read_back(token, probs.max())
        return token, top, probs

    def _fit_vocab(self, logits: torch.Tensor) -> torch.Tensor:
        """Draft logits [V_draft] -> [V_target]: cut extra (padding) rows, pad missing ones with -inf."""
        size = logits.shape[-1]
        if size == self.vocab_size:
            return logits
        if size > self.vocab_size:
            return logits[: self.vocab_size]
        return torch.cat([logits, logits.new_full((self.vocab_size - size,), float("-inf"))])

    @property
    def sized_by_costs(self) -> bool:
        """Adaptive: its chain's length follows the passes' measured costs (`chain_length`)."""
        return self.settings.adaptive

    @torch.inference_mode()
    def propose(self, ctx: ProposalContext) -> DraftTree:
        start = time.perf_counter()
        self._refused = None
        root = ctx.token_ids[-1]
        limit = min(self.length.begin_step(ctx.sampling.greedy), ctx.max_depth)
        drafts: list[int] = []
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
            ahead: list[tuple[int, torch.Tensor]] = []  # (copied token, the draft's logits after it), fed
            self._leaves = []
            on_device = self._chains_on_device(ctx.sampling)
            if on_device:
                drafts = self._device_chain(logits, limit, steady)
                passes, predicted = limit, float(limit)  # every token joins: chain probability 1 throughout
            while not on_device:  # the host's loop: a pick, then its pass, each read back
                token, prob, row = self._pick(logits, ctx.sampling)
                if self.fill and ctx.sampling.greedy:  # below the chain's last node: its runner-up
                    self._leaves.append((chain_prob * self._runner_up[1], len(drafts), self._runner_up[0]))
                chain_prob *= prob
                # greedy: a pick that follows the text, its next pass made, joins (draft and text agree);
                # when sampling, whether a token joins must not depend on its value
                follows = ctx.sampling.greedy and bool(ahead) and ahead[0][0] == token
                if not follows and not self.length.keep_going(chain_prob):
                    if not drafts and ctx.sampling.greedy:
                        self._refused = (token, chain_prob)
                    if self.fill and ctx.sampling.greedy:  # the pick the stop rule refused
                        self._leaves.append((chain_prob, len(drafts), token))
                    break
                drafts.append(token)
                predicted += chain_prob
                if row is not None:
                    rows.append(row)
                if len(drafts) >= limit:
                    break
                if ahead and ahead[0][0] == token:  # the draft picked the copied token: its pass is done
                    logits = ahead.pop(0)[1]
                    self.jump.saved += 1
                    continue
                self._drop(len(ahead))
                pass_start = time.perf_counter()
                logits, ahead = self._feed(token, drafts, limit - len(drafts))
                if not ahead:
                    steady.add(time.perf_counter() - pass_start)
                passes += 1
            self._drop(len(ahead))
        draft_probs = torch.stack([torch.zeros_like(rows[0]), *rows]) if rows else None  # [n + 1, V]
        self.num_passes += passes
        self._proposed_at = time.perf_counter()
        self._step = (len(drafts), predicted, self._proposed_at - start, passes, steady)
        self._chain_nodes = 1 + len(drafts)
        if not (self.fill and ctx.sampling.greedy and limit > 0):
            return DraftTree.chain(root, drafts, draft_probs)
        return self._filled(root, drafts)

    def _chains_on_device(self, sampling: SamplingParams) -> bool:
        """Whether this step's chain is drafted on the device: greedy, of fixed length (no confidence rule stops
        it, so every token joins), without `fill` or `jump` (whose picks the host reads), on a runner that
        drafts there (`greedy_chain`), where its passes replay as graphs unless `device_chain` says."""
        if not sampling.greedy or self.fill or self.jump is not None or self.length.uses_confidence:
            return False
        if not hasattr(self.runner, "greedy_chain"):
            return False
        return self.device_chain if self.device_chain is not None else self.runner.graphed.mode == "cuda-graphs"

    def _device_chain(self, logits: torch.Tensor, limit: int, steady: PassTimes) -> list[int]:
        """The chain's `limit` tokens, each the draft's argmax after the one before, picked and fed on the device
        (`GraphedSequence.greedy_chain`) and read back once, where the host's loop waited a token."""
        start = time.perf_counter()
        drafts = read_back(self.runner.greedy_chain(logits, limit, self.vocab_size))[0]
        self.cached.extend(drafts[:-1])  # the last token is picked, not fed, as the host's loop leaves it
        for _ in range(limit - 1):  # the passes queued behind each other: each is timed as their mean
            steady.add((time.perf_counter() - start) / (limit - 1))
        return drafts

    def _filled(self, root: int, drafts: list[int]) -> DraftTree:
        """The chain plus its likeliest leaves, up to `fill` nodes (greedy).

        A leaf never repeats its sibling: a runner-up is the second of the row whose first is the
        chain's token, and the refused pick has no chain sibling.
        """
        room = max(self.fill - 1 - len(drafts), 0)
        leaves = [(parent, token) for _, parent, token in sorted(self._leaves, reverse=True)[:room]]
        tokens = torch.tensor([root, *drafts, *(token for _, token in leaves)], dtype=torch.int64)
        parents = torch.tensor([*range(-1, len(drafts)), *(parent for parent, _ in leaves)], dtype=torch.int64)
        return DraftTree(tokens, parents)

    def _feed(self, token: int, drafts: list[int], room: int) -> tuple[torch.Tensor, list[tuple[int, torch.Tensor]]]:
        """One draft pass over `token` and, with `jump`, the text's continuation after it.

        Returns the logits after `token` [V] and, per copied token, (token, the logits after it).
        """
        copy = self.jump.after(drafts, room - 1) if self.jump is not None else []
        if not copy:
            logits = self._append([token])[-1]
            self.cached.append(token)
            return logits, []
        if isinstance(self.runner.model, LastLogitsOnly):
            with self.runner.model.keeping(len(copy) + 1):
                logits = self.runner.append([token, *copy])  # [1 + c, V]
        else:
            logits = self.runner.append([token, *copy])
        self.cached.extend([token, *copy])
        self.jump.copies += 1
        return logits[0], list(zip(copy, logits[1:], strict=True))

    def _drop(self, count: int) -> None:
        """Forget the last `count` fed tokens (copied tokens the draft did not pick)."""
        if count:
            self.runner.trim(len(self.cached) - count)
            del self.cached[-count:]

    def observe(self, result: VerifyResult) -> None:
        leaf = result.path[-1] >= self._chain_nodes  # a leaf has no children: only the path's end can be one
        chain_accepted = result.num_accepted - leaf
        self.num_leaves_accepted += leaf
        size = int(result.tree.tokens.shape[0])
        self.record(chain_accepted, tree_size=size if size > self._chain_nodes else 0, first_token=result.tokens[0])

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
        self.length.update(drafted, num_accepted, predicted, draft_s, passes, verify_s, tree_size, steady)

