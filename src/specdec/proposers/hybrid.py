"""LogitSpec's tree plus a draft model's chain: retrieval where the text repeats, a model where it does not.

Why: retrieval (LogitSpec) is nearly free and excellent where the output copies
the context, and worthless where it does not; a draft model guesses everywhere
but costs a pass per token. Combining them is the LogitSpec authors' third open
question. Each step LogitSpec plans its cost-aware tree first; the draft model
then adds its chain as one more branch below the root, only when
(`when=weak`, the default) the request's own text gave no strong match (fewer
than `STRONG_MATCH` tokens of the context's end found earlier), and only as
long as the draft's own length schedule (`chain_length`) expects its tokens to
pay; `when=always` drafts every step. Tree and chain share one node budget.
Greedy with the `timed` schedule, a gate (`hybrid_gate.AskGate`) also asks
the draft only while asking has paid: each ask is scored against what
LogitSpec's tree alone would have emitted that step, and its seconds against
the rate LogitSpec alone reaches over all steps (`rate=overall`, the default) or
on steps of that kind (`rate=kind`, bolder); that rate is also the draft's per-token
bar. On the Qwen pair with the bf16 draft `kind` asked often and lost more than
`overall`, whose gate stays mostly closed there; with the int8 draft (much cheaper
passes) `kind` asks nearly always and is the faster of the two, yet still below
`draft` alone (README, the Qwen draft-pair tables under "The earlier engine").
The draft model reads the request's context (its prefill) only at its first
ask, so a request where it is never asked does not pay for it (on the Qwen pair
the draft's prefill was a few percent of an MT-bench turn).

Verification is one pass over the whole tree:
- greedy (or a draft that drafts through text, whose guesses carry no
  probabilities): the chain is merged into LogitSpec's trie (a shared prefix
  reuses its nodes), every draft is a deterministic guess, the usual rules apply;
- sampling with a probabilistic draft: the chain is a branch of its own (never
  merged: its tokens are draws) and every retrieval node gets a point mass as
  its draft row (`engine.accept.point_mass_rows`: a deterministic guess is a draft
  distribution with all mass on its token), so the multi-draft rule verifies
  retrieval and model drafts in one tree, losslessly (tests/test_sampling.py).

Invariants: the draft's inclusion depends only on the context and the
retrieval (never on the drafted tokens), its length is the schedule's stopping
time; the tree never exceeds `budget` nodes nor `ctx.max_depth` levels.
"""

from __future__ import annotations

import time
from typing import Annotated, Literal

import torch

from specdec.engine.accept import MULTI_DRAFT_RULES, point_mass_rows
from specdec.engine.generation import ProposalContext
from specdec.engine.verify import VerifyResult
from specdec.models import LoadedModel
from specdec.proposers.base import ProposerBase
from specdec.proposers.chain_length import SCHEDULES, DraftLength
from specdec.proposers.draft import QUANTIZE, DraftConfig, DraftProposer
from specdec.proposers.draft_jump import MAX_NGRAM as JUMP_MAX_NGRAM
from specdec.proposers.hybrid_gate import AskGate
from specdec.proposers.logitspec.proposer import STRONG_MATCH, LogitSpecConfig, LogitSpecProposer
from specdec.proposers.schema import method_config, option
from specdec.proposers.universal import UniversalDraftProposer
from specdec.tree import DraftTree

WHEN = ("weak", "always")
RATES = ("kind", "overall")


@method_config("hybrid")
class HybridConfig:
    """LogitSpec (adaptive) with a draft model's chain as one more source in the tree."""

    draft_model: str = ""  # name or path for load_model (required); another tokenizer drafts through text
    k: Annotated[int, option(ge=0, request_max=100)] = 60  # LogitSpec's next-next candidates
    # nodes per tree, root and the draft's chain included
    budget: Annotated[int, option(ge=1, request_max=64)] = 64
    max_k: Annotated[int, option(ge=1, request_max=16)] = 8  # longest draft chain
    schedule: Annotated[Literal[SCHEDULES], option(request=True)] = "timed"  # the draft chain's length rule
    # weak: draft only without a strong own-text match; always: every step
    when: Annotated[Literal[WHEN], option(request=True)] = "weak"
    # the gate values an ask's extra tokens at LogitSpec's own rate: over all steps, or that kind's
    rate: Literal[RATES] = "overall"
    # the draft's: none | int8 | auto (int8 for large drafts on CPU; see draft.py)
    quantize: Literal[QUANTIZE] = "auto"
    # drawn siblings at temperature > 0: SpecInfer's one-by-one rule or SpecTr's k-sequential selection
    accept: Annotated[Literal[MULTI_DRAFT_RULES], option(request=True)] = "specinfer"
    # the draft's lookahead over the text's continuation (draft_jump); 0 = off
    jump: Annotated[int, option(ge=0, le=JUMP_MAX_NGRAM)] = 0
    cache_dir: str = ""
    costs_dir: str = ""

    def __post_init__(self) -> None:
        self.logitspec_config()
        self.draft_config()

    def logitspec_config(self) -> LogitSpecConfig:
        # recycle off: the hybrid's tree and multi-draft rule were built and measured without it
        return LogitSpecConfig(k=self.k, budget=self.budget, recycle=False, costs_dir=self.costs_dir)

    def draft_config(self) -> DraftConfig:
        return DraftConfig(self.draft_model, k=min(4, self.max_k), max_k=self.max_k, schedule=self.schedule,
                           cache_dir=self.cache_dir, quantize=self.quantize, jump=self.jump)  # fmt: skip

    def build(self, loaded: LoadedModel) -> HybridProposer:
        draft = self.draft_config().build(loaded)
        return HybridProposer(self, self.logitspec_config().build(loaded), draft, loaded.model.config.vocab_size)


class HybridProposer(ProposerBase):
    prunable = True  # a batch may cut the tree to its budget
    source_stats: dict[str, dict[str, int]]  # per-source offered / accepted nodes, over its life

    def __init__(
        self,
        config: HybridConfig,
        logitspec: LogitSpecProposer,
        draft: DraftProposer | UniversalDraftProposer,
        vocab_size: int,
    ) -> None:
        self.config = config
        self.multi_draft = config.accept  # its chain is one child per node: SpecTr's rule equals SpecInfer's
        self.logitspec = logitspec
        self.draft = draft
        self.vocab_size = vocab_size
        self.source_stats = logitspec.source_stats  # "draft" joins the per-source counts
        self._chain_nodes: list[int] = []  # tree node ids of this step's draft chain
        self._asked = False  # the draft model was asked this step
        self.gate = AskGate(per_kind=config.rate == "kind")
        self._gated = False  # this step's ask is scored by the gate
        self._key = 0  # the gate's kind of step: own-text match length (capped)
        self._started = 0.0  # when this step's propose began
        self._draft_s = 0.0  # seconds of this step's draft passes
        self._prime_s = 0.0  # seconds of this step's draft prefill (the request's first ask)
        self._base_nodes = 0  # LogitSpec's own nodes in this step's tree (ids below it are LogitSpec's)
        self._primed = False  # the draft has read this request's context

    @property
    def top_wanted(self) -> int:
        """LogitSpec's (the draft reads its own logits)."""
        return self.logitspec.top_wanted

    @property
    def tops_at_every_node(self) -> bool:
        """LogitSpec's."""
        return self.logitspec.tops_at_every_node

    @property
    def length(self) -> DraftLength:
        """The draft chain's length schedule."""
        return self.draft.inner.length if isinstance(self.draft, UniversalDraftProposer) else self.draft.length

    def begin(self, prompt_ids: list[int]) -> None:
        self.logitspec.begin(prompt_ids)
        self.draft.begin([])  # the draft reads the context at its first ask: a request it never helps costs nothing
        self._primed = False

    @property
    def sized_by_costs(self) -> bool:
        """As its LogitSpec part: that planner sizes the tree the draft's chain joins."""
        return self.logitspec.sized_by_costs

    def propose(self, ctx: ProposalContext) -> DraftTree:
        self._started = time.perf_counter()
        tree = self.logitspec.propose(ctx)
        self._chain_nodes, self._asked, self._base_nodes = [], False, tree.num_nodes
        self._draft_s = self._prime_s = 0.0
        self._gated = ctx.sampling.greedy and self.config.schedule == "timed"  # wall-clock rules: greedy only
        room = min(self.config.budget - tree.num_nodes, ctx.max_depth)
        match = self.logitspec.own_match()
        self._key = min(match, STRONG_MATCH)
        if room <= 0 or (self.config.when == "weak" and match >= STRONG_MATCH):
            return tree
        if self._gated and not self.gate.should_ask(self._key):
            return tree
        self._asked = True
        self.length.rate_floor = self.gate.rate(self._key) if self._gated else None
        start = time.perf_counter()
        if not self._primed:  # the request's one prefill of the draft: not the price of this ask's tokens
            self.draft.begin(ctx.token_ids)
            self._primed, self._prime_s = True, time.perf_counter() - start
            start += self._prime_s
        chain = self.draft.propose(ProposalContext(ctx.token_ids, ctx.last_logits, ctx.num_prompt_tokens,
                                                   ctx.sampling, room))  # fmt: skip
        self._draft_s = time.perf_counter() - start
        if chain.num_nodes == 1:
            return tree
        if chain.draft_probs is None:
            merged, self._chain_nodes = merge_chain(tree, chain.token_list[1:])
        else:
            merged, self._chain_nodes = append_sampled_chain(tree, chain, self.vocab_size)
        self.logitspec.tag_nodes("draft", merged.num_nodes - tree.num_nodes)
        return merged

    def node_sources(self) -> list[str] | None:
        """LogitSpec's sources, and "draft" for the nodes the draft model added."""
        return self.logitspec.node_sources()

    def observe(self, result: VerifyResult) -> None:
        self.logitspec.observe(result)
        if self._gated:
            self._score(result)
        if self._asked:
            on_path = set(result.path)
            accepted = 0
            while accepted < len(self._chain_nodes) and self._chain_nodes[accepted] in on_path:
                accepted += 1
            if isinstance(self.draft, UniversalDraftProposer):
                self.draft.inner.record(self.draft.accepted_drafts(accepted), result.tree.num_nodes)
            else:
                self.draft.record(accepted, result.tree.num_nodes, result.tokens[0])

    def _score(self, result: VerifyResult) -> None:
        """Teach the gate this step: LogitSpec's own tokens and seconds, and the ask's gain and cost."""
        seconds = time.perf_counter() - self._started - self._prime_s  # nor LogitSpec's
        alone = sum(1 for node in result.path[1:] if node < self._base_nodes)  # LogitSpec's tree alone
        added = result.tree.num_nodes - self._base_nodes
        cost = self._draft_s + added * (self.length.fit.per_token() or 0.0) if self._asked else 0.0
        self.gate.step(self._key, alone + 1, seconds - cost)
        if self._asked:
            self.gate.asked(self._key, result.num_accepted - alone, cost)


def merge_chain(tree: DraftTree, chain: list[int]) -> tuple[DraftTree, list[int]]:
    """`tree` with `chain` (tokens below the root) merged in as a trie path; the chain's node ids."""
    tokens, parents = tree.token_list, tree.parent_list
    children = [list(c) for c in tree.children]
    node, ids = 0, []
    for token in chain:
        found = next((c for c in children[node] if tokens[c] == token), -1)
        if found < 0:
            found = len(tokens)
            tokens, parents = [*tokens, token], [*parents, node]
            children[node].append(found)
            children.append([])
        node = found
        ids.append(node)
    return DraftTree.of_lists(tokens, parents), ids


def append_sampled_chain(tree: DraftTree, chain: DraftTree, vocab_size: int) -> tuple[DraftTree, list[int]]:
    """`tree` (deterministic) plus `chain` (drawn, with draft_probs) as a separate branch below the root.

    The result's draft_probs [N, V]: point masses on the retrieval nodes' tokens, the chain's own rows.
    """
    base = tree.num_nodes
    tokens = [*tree.token_list, *chain.token_list[1:]]
    parents = [*tree.parent_list, *(0 if p == 0 else p + base - 1 for p in chain.parent_list[1:])]
    rows = point_mass_rows(tree.tokens, vocab_size)  # [base, V]
    probs = torch.cat([rows, chain.draft_probs[1:].to(rows.device)])  # [N, V]
    ids = list(range(base, len(tokens)))
    return DraftTree.of_lists(tokens, parents, probs), ids
