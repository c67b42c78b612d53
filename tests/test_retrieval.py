"""Retrieval drafters (PLD, LogitSpec) and the cost-aware budget.

Model-free: PLD drafts equal transformers' own prompt-lookup candidates; the
LogitSpec tree builders respect the budget and depth, build a trie and keep the
root branch's retrieval; the planner only picks prefixes and prefers the root
alone when drafts do not pay. On the real default model (fp32): greedy output of
every method is token-identical to plain greedy on two Spec-Bench prompts of
every category, seeded sampling is reproducible, and MAT > 1 where text repeats.
"""

from __future__ import annotations

import json

import pytest
import torch
from helpers import has_path
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.generation.candidate_generator import PromptLookupCandidateGenerator

from specdec.backends.registry import cost_key, padded_sizes
from specdec.backends.timing_cache import contended
from specdec.backends.torch.graphs import bucket_sizes
from specdec.data import load_questions
from specdec.engine.costs import (
    DEFAULT_SIZES,
    AcceptanceStats,
    CostModel,
    load_costs,
    load_or_measure,
    save_costs,
)
from specdec.engine.generation import GenerationConfig, ProposalContext
from specdec.engine.verify import VerifyResult
from specdec.models import LoadedModel, machine_fingerprint
from specdec.prompts import encode_prompt
from specdec.proposers import MethodError, parse_method
from specdec.proposers.base import ProposerBase
from specdec.proposers.logitspec.learn import MAX_HEAT
from specdec.proposers.logitspec.plan import chain_pays, plan_tree
from specdec.proposers.logitspec.proposer import LogitSpecConfig, LogitSpecProposer
from specdec.proposers.logitspec.retrieval import continue_match, paper_tree, retrieve
from specdec.proposers.ngram_index import NGramIndex
from specdec.proposers.pld import PLDConfig, PLDProposer
from specdec.sampling import SamplingParams
from specdec.tree import DraftTree

NEW_TOKENS = 32
CATEGORIES = ("mt_bench", "translation", "summarization", "qa", "math_reasoning", "rag")
# A cost curve like SmolLM2 fp32 on a 2-core AVX2 CPU (seconds): trees are dear.
CPU_COSTS = CostModel((1, 16, 32, 64), (0.052, 0.094, 0.127, 0.189))


# ------------------------------------------------------------------ helpers
def ctx_for(tokens: list[int], logits: torch.Tensor, max_depth: int = 64) -> ProposalContext:
    return ProposalContext(tokens, logits, 1, SamplingParams(), max_depth)


def assert_trie(tree: DraftTree) -> None:
    tokens = tree.token_list
    for kids in tree.children:
        sibling_tokens = [tokens[c] for c in kids]
        assert len(sibling_tokens) == len(set(sibling_tokens)), "duplicate siblings"


def indexed(tokens: list[int], max_ngram: int = 3, prefer: str = "latest") -> NGramIndex:
    index = NGramIndex(max_ngram, prefer)
    index.extend(tokens)
    return index


contexts = st.lists(st.integers(0, 11), min_size=2, max_size=60)


# ------------------------------------------------------------------ PLD (no model)
@settings(max_examples=150, deadline=None)
@given(tokens=contexts, max_ngram=st.integers(1, 4), num=st.integers(1, 12))
def test_pld_drafts_equal_transformers_prompt_lookup(tokens, max_ngram, num):
    proposer = PLDProposer(PLDConfig(max_ngram=max_ngram, num_pred_tokens=num))
    proposer.begin(tokens[:-1])
    tree = proposer.propose(ctx_for(tokens, torch.zeros(12)))
    hf = PromptLookupCandidateGenerator(num_output_tokens=num, max_matching_ngram_size=max_ngram, max_length=10_000)
    candidate_ids, _ = hf.get_candidates(torch.tensor([tokens]))
    assert tree.parent_list == list(range(-1, tree.num_nodes - 1))  # a chain
    assert tree.token_list == [tokens[-1], *candidate_ids[0, len(tokens) :].tolist()]


def test_pld_respects_max_depth_min_ngram_and_eos():
    tokens = [1, 2, 3, 4, 5, 9, 7, 1, 2]
    pld = PLDProposer(PLDConfig(num_pred_tokens=10), eos_token_ids=(9,))
    pld.begin(tokens[:4])  # the rest reaches the index incrementally
    assert pld.propose(ctx_for(tokens, torch.zeros(12))).token_list == [2, 3, 4, 5, 9]  # cut after EOS
    assert pld.propose(ctx_for(tokens, torch.zeros(12), max_depth=2)).token_list == [2, 3, 4]
    strict = PLDProposer(PLDConfig(min_ngram=3))
    strict.begin(tokens)
    assert strict.propose(ctx_for(tokens, torch.zeros(12))).num_nodes == 1  # only a 2-gram matches


def test_method_strings_reach_the_configs():
    assert parse_method("pld:num_pred_tokens=5") == PLDConfig(num_pred_tokens=5)
    config = parse_method("logitspec:k=60,budget=32", {"adaptive": "false", "max_ngram": "2"})
    assert config == LogitSpecConfig(k=60, budget=32, adaptive=False, max_ngram=2)
    for bad in ("logitspec:budget=0", "logitspec:bogus=1", "pld:min_ngram=4", "logitspec:prefer=middle"):
        with pytest.raises(MethodError):
            parse_method(bad)


# ------------------------------------------------------------------ LogitSpec trees (no model)
def test_retrieval_root_branch_and_candidates_by_hand():
    #          0  1  2  3  4  5  6  7  8  9
    context = [5, 6, 7, 8, 5, 6, 9, 3, 4, 6]  # root 6: "5 6" was followed by 7 and 9; "4 6" never
    index = indexed(context)
    logits = torch.zeros(12)
    logits[9], logits[7], logits[3] = 3.0, 2.0, 1.0  # top: 9, 7, 3, ...
    got = retrieve(index, context, logits, k=3, max_continuation=4, cand_continuation=2, keep_self=False)
    assert (got.root_branch, got.root_ngram) == ([9, 3, 4, 6], 1)  # latest "6" continued with 9 3 4 6
    assert got.cand_tokens == [7, 3]  # 9 is the root branch's first token: covered
    assert got.cand_conts == [[8, 5], [4, 6]]  # "6 7" -> 8 5 (2-gram); "9 3" unseen, "3" -> 4 6
    assert got.cand_ngrams == [2, 1]
    tree = paper_tree(context[-1], got, budget=64, max_depth=64)
    assert has_path(tree, got.root_branch) and has_path(tree, [7, 8, 5]) and has_path(tree, [3, 4, 6])
    assert tree.num_nodes == 1 + 4 + 3 + 3


@settings(max_examples=120, deadline=None)
@given(
    tokens=contexts,
    budget=st.integers(1, 80),
    max_depth=st.integers(0, 8),
    k=st.integers(0, 12),
    seed=st.integers(0, 2**16),
    adaptive=st.booleans(),
)
def test_logitspec_tree_invariants(tokens, budget, max_depth, k, seed, adaptive):
    logits = torch.randn(12, generator=torch.Generator().manual_seed(seed))
    config = LogitSpecConfig(k=k, budget=budget, adaptive=adaptive, max_continuation=5)
    proposer = LogitSpecProposer(config, CostModel((1, 64), (1.0, 1.0)) if adaptive else None)  # free nodes
    proposer.begin(tokens[:-1])
    tree = proposer.propose(ctx_for(tokens, logits, max_depth))
    assert tree.token_list[0] == tokens[-1]
    assert tree.num_nodes <= budget
    assert tree.max_depth <= max_depth
    assert tree.draft_probs is None
    assert_trie(tree)
    root_branch = continue_match(indexed(tokens), (), 5)[0][:max_depth]
    # The root branch's retrieval is in the tree: always in paper mode when it fits the budget; in
    # adaptive mode when every retrieved node fits (nodes are free here, so all of them pay).
    if root_branch and budget > (70 if adaptive else len(root_branch)):
        assert has_path(tree, root_branch)


def test_adaptive_tree_shrinks_to_the_root_when_drafts_do_not_pay():
    context = list(range(12))  # nothing repeats: no retrieval at all
    logits = torch.arange(12, dtype=torch.float32)
    dear = LogitSpecProposer(LogitSpecConfig(k=10), CostModel((1, 2, 64), (1.0, 1.5, 50.0)))
    dear.begin(context[:-1])
    assert dear.propose(ctx_for(context, logits)).num_nodes == 1
    free = LogitSpecProposer(LogitSpecConfig(k=10), CostModel((1, 64), (1.0, 1.0)))
    free.begin(context[:-1])
    assert free.propose(ctx_for(context, logits)).num_nodes > 1  # bare candidates, when they are free


def test_adaptive_learns_from_emitted_tokens():
    context = [1, 2, 3, 4, 5, 6, 7, 8, 1, 2, 3]  # root 3 continues "4 5 6 ..." (3-gram match)
    logits = torch.zeros(12)
    proposer = LogitSpecProposer(LogitSpecConfig(k=0, max_continuation=5, floor=False), CPU_COSTS)
    proposer.begin(context[:-1])
    key = ("root", 3, MAX_HEAT, 1)  # 3-gram match, right after a long acceptance, depth 1
    before = proposer.stats.rate(key)
    for _ in range(30):  # the target keeps agreeing with the root branch
        tree = proposer.propose(ctx_for(context, logits))
        path = list(range(tree.num_nodes))  # a chain, all accepted, then the target's bonus token
        truth = [4, 5, 6, 7, 8, 9][: tree.num_nodes]
        proposer.observe(VerifyResult(truth, path, torch.zeros(tree.num_nodes, 12), tree))
    assert proposer.stats.rate(key) > before
    assert proposer.propose(ctx_for(context, logits)).token_list == [3, 4, 5, 6, 7, 8]
    for _ in range(600):  # ... then never does (older observations fade)
        tree = proposer.propose(ctx_for(context, logits))
        proposer.observe(VerifyResult([11], [0], torch.zeros(tree.num_nodes, 12), tree))
    assert proposer.propose(ctx_for(context, logits)).num_nodes == 1


# ------------------------------------------------------------------ budget (no model)
@settings(max_examples=200, deadline=None)
@given(
    probs=st.lists(st.lists(st.floats(0.0, 1.0), max_size=6), max_size=6),
    slope=st.floats(0.0, 0.2),
    max_nodes=st.integers(1, 40),
)
def test_plan_tree_picks_prefixes_within_budget(probs, slope, max_nodes):
    branch_probs = [sorted(p, reverse=True) for p in probs]
    costs = [0.0] + [1.0 + slope * (n - 1) for n in range(1, 64)]
    lengths, rate = plan_tree(branch_probs, costs, max_nodes)
    assert sum(lengths) <= max_nodes - 1
    assert all(0 <= n <= len(p) for n, p in zip(lengths, branch_probs, strict=True))
    chosen = sum(sum(p[:n]) for p, n in zip(branch_probs, lengths, strict=True))
    assert rate == pytest.approx((1 + chosen) / costs[1 + sum(lengths)])
    assert rate >= 1.0 / costs[1] - 1e-12  # never worse than the root alone


def test_plan_tree_extremes():
    free = [0.0] + [1.0] * 64
    assert plan_tree([[0.9, 0.8], [0.3]], free, 64)[0] == [2, 1]
    dear = [0.0] + [float(n) for n in range(1, 65)]  # a node costs a whole step
    assert plan_tree([[0.9, 0.8], [0.3]], dear, 64)[0] == [0, 0]
    assert plan_tree([[0.5]], [0.0, 1.0, 1.01], 64, min_gain=0.2)[0] == [1]
    assert plan_tree([[0.1]], [0.0, 1.0, 1.01], 64, min_gain=0.2)[0] == [0]


def test_cost_model_and_stats():
    costs = CostModel((1, 4, 8), (1.0, 2.5, 3.0))
    assert costs.cost(2) == pytest.approx(1.5) and costs.cost(16) == pytest.approx(4.0)
    table = costs.table(10)
    assert table[0] == 0.0 and all(a <= b for a, b in zip(table, table[1:], strict=False))
    with pytest.raises(ValueError):
        CostModel((4, 1), (1.0, 2.0))
    stats = AcceptanceStats(lambda key: (0.5, 2.0), window=10.0)
    assert stats.rate("x") == 0.5
    for _ in range(100):
        stats.update("x", 1.0, 0.0)
    assert stats.rate("x") < 0.01 and stats.snapshot()["x"][1] == 10.0


def test_a_bucketed_cost_curve_is_a_staircase(tmp_path):
    """Where passes are padded to buckets (a GPU's graphs), the curve is timed at the buckets and a size
    between two costs the larger; past the last bucket it goes on linearly. Kept through its cache file."""
    assert bucket_sizes(DEFAULT_SIZES) == (1, 2, 4, 8, 16, 32, 64)
    assert bucket_sizes((3, 100, 129, 500)) == (4, 128)  # past the largest bucket a pass runs unpadded
    stairs = CostModel((1, 2, 4, 8), (1.0, 1.2, 1.5, 2.0), steps=True)
    assert [stairs.cost(n) for n in (1, 3, 4, 5, 8)] == [1.0, 1.5, 1.5, 2.0, 2.0]
    assert stairs.cost(12) == pytest.approx(2.5)  # linear past the last bucket
    assert CostModel(stairs.sizes, stairs.seconds).cost(5) == pytest.approx(1.625)  # unpadded: interpolated
    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1)
    loaded = LoadedModel(LlamaForCausalLM(config).eval(), tokenizer=None, name="tiny/llama")
    key = cost_key(loaded, stairs.sizes, 16)
    save_costs(tmp_path, key, stairs)
    assert load_costs(tmp_path, key) == stairs and load_costs(tmp_path, key).steps
    save_costs(tmp_path, key, CostModel((1, 2), (1.0, 2.0)))
    assert load_costs(tmp_path, key).steps is False
    assert padded_sizes(loaded, DEFAULT_SIZES) is None  # on the CPU a pass runs at its own size


def test_costs_are_measured_once_and_cached(tmp_path):
    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=256)
    torch.manual_seed(0)
    loaded = LoadedModel(LlamaForCausalLM(config).eval(), tokenizer=None, name="tiny/llama")
    idle = lambda cpu_share: False  # noqa: E731
    first = load_or_measure(loaded, tmp_path, sizes=(1, 2, 8), repeats=2, context_len=16, is_busy=idle)
    files = list(tmp_path.glob("*.json"))
    assert len(files) == 1 and json.loads(files[0].read_text())["sizes"] == [1, 2, 8]
    assert json.loads(files[0].read_text())["key"]["machine"] == machine_fingerprint("cpu")
    assert list(first.seconds) == sorted(first.seconds)  # non-decreasing
    assert load_or_measure(loaded, tmp_path, sizes=(1, 2, 8), repeats=2, context_len=16, is_busy=idle) == first


def test_costs_time_each_size_after_a_neighbour(tmp_path):
    """Sizes run ascending, then descending, in turn: a one-node pass is timed after a small pass too, not only
    right after the largest (which made small trees look free)."""
    from specdec.backends.registry import timing_target
    from specdec.engine.costs import _measure

    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=256)
    loaded = LoadedModel(LlamaForCausalLM(config).eval(), tokenizer=None, name="tiny/llama")
    target = timing_target(loaded)
    seen: list[int] = []
    forward = target.forward_tree
    target.forward_tree = lambda tokens, parents: seen.append(len(tokens)) or forward(tokens, parents)
    _measure(target, (1, 2, 8), repeats=3, context_len=16)
    assert seen == [1, 2, 8] + [1, 2, 8] + [8, 2, 1] + [1, 2, 8]  # the warm-up, then the three repetitions


def test_costs_timed_on_a_busy_machine_serve_the_run_but_are_not_cached(tmp_path):
    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=256)
    loaded = LoadedModel(LlamaForCausalLM(config).eval(), tokenizer=None, name="tiny/llama")
    costs = load_or_measure(loaded, tmp_path, sizes=(1, 2), repeats=1, context_len=8, is_busy=lambda cpu_share: True)
    assert costs.sizes == (1, 2) and all(s > 0 for s in costs.seconds)
    assert list(tmp_path.glob("*.json")) == []
    assert contended(0.6) and not contended(0.99)  # 0.63-0.75 seen with one busy process beside, ~1.0 idle


# ------------------------------------------------------------------ on the real model
@pytest.fixture(scope="module")
def prompts(default_model, spec_bench_subset):
    questions = load_questions(spec_bench_subset, per_category=1)  # every category
    assert sorted({q.category for q in questions}) == sorted(CATEGORIES)
    return {f"{q.category}-{q.question_id}": encode_prompt(default_model.tokenizer, q.turns[0], chat=True)
            for q in questions}


@pytest.fixture(scope="module")
def plain_greedy(plain_runs, prompts):
    return {name: plain_runs.tokens(name.rsplit("-", 1)[0], NEW_TOKENS) for name in prompts}


def build(method: str, loaded: LoadedModel):
    """A proposer for a method string; adaptive LogitSpec gets the fixed CPU cost curve, so the
    trees it picks do not depend on how loaded the machine is while the tests run (the
    measurement itself is tested above)."""
    config = parse_method(method)
    if isinstance(config, LogitSpecConfig) and config.adaptive:
        return LogitSpecProposer(config, CPU_COSTS, loaded.eos_token_ids)
    return config.build(loaded)


class FloorCheck(ProposerBase):
    """LogitSpec, checked at every step against a twin `pld` on the same context: whenever pld drafts,
    LogitSpec's tree holds pld's chain from the root, unless that chain does not pay (`chain_pays`)."""

    def __init__(self, inner: LogitSpecProposer, eos_token_ids: tuple[int, ...]) -> None:
        self.inner, self.twin = inner, PLDProposer(PLDConfig(), eos_token_ids)
        self.num_drafted = self.num_held = 0

    def begin(self, prompt_ids: list[int]) -> None:
        self.inner.begin(prompt_ids)
        self.twin.begin(prompt_ids)

    def propose(self, ctx: ProposalContext) -> DraftTree:
        tree = self.inner.propose(ctx)
        chain = self.twin.propose(ctx).token_list[1:]
        if not chain:
            assert self.inner.floor_held is None
            return tree
        self.num_drafted += 1
        step = self.inner._last
        probs = self.inner._chain(("pld", step.floor_ngram, step.heat), len(chain), min_prob=0.0)
        assert self.inner.floor_held == chain_pays(probs, self.inner.costs)
        if self.inner.floor_held:
            self.num_held += 1
            assert has_path(tree, chain), (chain, tree.token_list)
        return tree

    def observe(self, result: VerifyResult) -> None:
        self.inner.observe(result)


METHODS = (
    "pld",
    "logitspec",
    "logitspec:adaptive=false,budget=24",
    "logitspec:third=true,floor=true",
)


@pytest.mark.slow
def test_the_pld_floor_holds_on_real_prompts(engine, default_model, prompts, plain_greedy):
    """Greedy identity of every method is tests/test_lossless.py's; here LogitSpec's floor, step by step."""
    config = GenerationConfig(max_new_tokens=NEW_TOKENS)
    proposer = FloorCheck(build("logitspec:floor=true", default_model), default_model.eos_token_ids)  # state carries over
    for name, ids in prompts.items():
        assert engine.generate(ids, proposer, config).token_ids == plain_greedy[name], name
    assert proposer.num_held > 0 and proposer.num_drafted > 0  # the floor was tested, and held, on real prompts


@pytest.mark.slow  # the fast tier's seeded lossless rows (test_lossless) check pld's and LogitSpec's tokens
@pytest.mark.parametrize("method", METHODS)
def test_seeded_sampling_is_reproducible(engine, default_model, prompts, method):
    ids = prompts[next(name for name in prompts if name.startswith("translation"))]  # a short prompt: fast

    def run(seed: int) -> list[int]:
        config = GenerationConfig(max_new_tokens=24, sampling=SamplingParams(temperature=0.9, seed=seed))
        return engine.generate(ids, build(method, default_model), config).token_ids

    first = run(7)
    assert run(7) == first
    assert run(8) != first


@pytest.mark.slow
def test_mat_above_one_where_text_repeats(engine, default_model, prompts):
    """Summarization and RAG copy their input: greedy MAT is a property of the output, not of timing."""
    names = [name for name in prompts if name.startswith(("summarization", "rag"))]
    config = GenerationConfig(max_new_tokens=NEW_TOKENS)
    paper = build("logitspec:adaptive=false,budget=32", default_model)
    pld = build("pld", default_model)
    paper_mat = sum(engine.generate(prompts[n], paper, config).stats.mat for n in names) / len(names)
    pld_mat = sum(engine.generate(prompts[n], pld, config).stats.mat for n in names) / len(names)
    assert pld_mat > 1.2, pld_mat
    assert paper_mat > 1.2 and paper_mat >= pld_mat, (paper_mat, pld_mat)
