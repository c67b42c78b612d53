"""The floor (`specdec.engine.floor`): a row drafts only while its drafting steps out-earn plain steps.

The policy on its own (which mode runs, how often the loser is tried), then on the bundled model
(fp32): under a price where no draft pays, every method's greedy steps turn plain after its
warm-up, and its text stays plain decoding's; under a price where drafts pay, they go on. The
price is a fixed function of the tree size (`Floor(price=...)`), so nothing here depends on the
machine's load. Under the price where no draft pays, every method's row mixes the floor's plain steps
(depth 0: the proposer keeps its state) with its warm-up and drafting tries: the lossless check of
gated steps for every method. The lossless matrix (tests/test_lossless.py) runs the methods' own trees.
"""

from __future__ import annotations

import math

import pytest
import torch
from helpers import build_proposer, run_policy

from specdec.engine.floor import (
    DRAFT_RUN,
    EXPLORE,
    PLAIN_TRY_GAP,
    SETTLE,
    TRY_GAP_MAX,
    TRY_SHARE,
    WARMUP,
    Floor,
    FloorState,
)
from specdec.engine.generation import GenerationConfig
from specdec.engine.loop import Engine
from specdec.proposers import METHODS, parse_method
from specdec.proposers.hybrid import HybridConfig, HybridProposer
from specdec.proposers.pld import PLDConfig, PLDProposer
from specdec.sampling import SamplingParams
from specdec.tree import DraftTree


def tries(modes: list[bool], drafting: bool) -> list[tuple[int, int]]:
    """(first step, length) of each run of steps in one mode (drafting or plain)."""
    runs: list[tuple[int, int]] = []
    for i, mode in enumerate(modes):
        if mode != drafting:
            continue
        if runs and sum(runs[-1]) == i:  # the run before goes on
            runs[-1] = (runs[-1][0], runs[-1][1] + 1)
        else:
            runs.append((i, 1))
    return runs


def gaps_between(runs: list[tuple[int, int]]) -> list[int]:
    """Steps of the other mode between consecutive runs."""
    return [b - a - length for (a, length), (b, _) in zip(runs, runs[1:], strict=False)]


def test_drafts_that_pay_keep_drafting_with_rarer_plain_tries() -> None:
    """A plain try is a run of SETTLE + 1 steps (the last one, settled, priced), later each time: the gaps start
    at PLAIN_TRY_GAP, so the tries take the share of the steps that one-step tries from EXPLORE's first gap did."""
    modes = run_policy(FloorState(), 400, drafted_tokens=3, drafted_s=1.5)  # 2 tokens/s against 1
    plain = tries(modes, False)
    assert modes[:WARMUP] == [True] * WARMUP and plain[0][0] == WARMUP
    assert {length for _, length in plain[:-1]} == {SETTLE + 1}
    gaps = gaps_between(plain)
    doubled = [PLAIN_TRY_GAP * 2**i for i in range(3)]
    assert doubled[-1] == EXPLORE[1] and gaps[:3] == doubled  # each try later, up to the widest gap ...
    lost = (SETTLE + 1) * (1.0 - 1 * 1.5 / 3) / 1.5  # ... then priced: a try's four steps lose 1/3 step each
    assert set(gaps[3:]) == {math.ceil(lost / TRY_SHARE)} and len(plain) < 12


def run_taxed(state: FloorState, steps: int, drafted_tokens: int, drafted_s: float) -> tuple[list[bool], float]:
    """As `run_policy`, on a machine where a drafting step slows the plain steps after it: the first by half,
    the next by a quarter, and so on (a Xeon's one-node passes after a wide one). -> modes, seconds a token."""
    modes, seconds, tokens, since_draft = [], 0.0, 0, 99
    for _ in range(steps):
        drafting = state.drafts()
        since_draft = 0 if drafting else since_draft + 1
        took = drafted_s if drafting else 1.0 + 0.5**since_draft
        emitted = drafted_tokens if drafting else 1
        state.observe(drafting, emitted, took)
        modes.append(drafting)
        seconds, tokens = seconds + took, tokens + emitted
    return modes, seconds / tokens


def test_the_plain_rate_is_the_settled_one() -> None:
    """Drafting at 0.93 tokens/s loses to settled plain steps (1.0), though a plain step right after a
    drafting step (0.67) loses to it: the floor turns plain (a try at the widest gap), within 3% of plain
    steps alone."""
    modes, per_token = run_taxed(FloorState(), 600, drafted_tokens=2, drafted_s=2.15)
    assert len(tries(modes[100:], True)) <= 1 + 500 // EXPLORE[1] and per_token < 1.03


def test_drafts_that_pay_with_their_tax_keep_drafting() -> None:
    modes, per_token = run_taxed(FloorState(), 600, drafted_tokens=2, drafted_s=1.6)  # 1.25 tokens/s
    assert sum(modes[100:]) >= 0.9 * 500 and per_token < 0.85


def test_drafts_that_lose_turn_to_plain_steps_with_rarer_drafting_tries() -> None:
    """A drafting try is a run of DRAFT_RUN steps judged whole (one drafting step's tokens vary too much to
    judge drafting by), later each time it loses."""
    modes = run_policy(FloorState(), 400, drafted_tokens=2, drafted_s=2.2)  # 0.91 tokens/s against 1
    assert modes[: WARMUP + 1] == [True] * WARMUP + [False]
    drafting = tries(modes, True)[1:]  # after the warm-up
    assert {length for _, length in drafting[:-1]} == {DRAFT_RUN}
    gaps = gaps_between(drafting)
    assert gaps == sorted(gaps) and max(gaps) == EXPLORE[1]
    assert len(drafting) < 10  # 2% of the steps' worth of runs


@pytest.mark.parametrize("drafted_s", [4.0, 12.0])
def test_a_try_that_costs_more_comes_later(drafted_s: float) -> None:
    """Once a losing drafting try has lost at the widest doubled gap, a try whose run loses
    DRAFT_RUN * (drafted_s - 2) plain steps comes at most every (that / TRY_SHARE) steps, so those tries cost
    at most TRY_SHARE of the time (a heavy head on a fast pass); the doubled gaps come first, as for any loser."""
    steps = 6000
    modes = run_policy(FloorState(), steps, drafted_tokens=2, drafted_s=drafted_s)
    drafting = tries(modes, True)[1:]
    gaps = gaps_between(drafting)
    lost, doubled = DRAFT_RUN * (drafted_s - 2.0), [gap for gap in gaps if gap <= EXPLORE[1]]
    assert gaps[: len(doubled)] == doubled and len(doubled) <= 6  # 4, 8, ... 64 first
    priced = drafting[len(doubled) + 1 :]
    assert min(gaps[len(doubled) :]) >= min(TRY_GAP_MAX, lost / TRY_SHARE) and max(gaps) <= TRY_GAP_MAX
    assert lost * len(priced) <= TRY_SHARE * steps * 1.05


def test_a_winner_that_changes_is_followed() -> None:
    state = FloorState()
    run_policy(state, 200, drafted_tokens=3, drafted_s=1.5)
    later = run_policy(state, 200, drafted_tokens=1, drafted_s=3.0)  # the text stopped being predictable
    assert len(tries(later[-100:], True)) <= 1


def test_a_new_row_starts_from_what_its_method_learned() -> None:
    floor, proposer = Floor(), object()
    losing = floor.start(proposer)
    run_policy(losing, 50, drafted_tokens=1, drafted_s=3.0)
    floor.finish(proposer, losing)
    assert not floor.start(proposer).drafts()  # no warm-up: it knows drafting lost
    assert floor.start(1).drafts()  # another proposer type starts fresh


# ------------------------------------------------------------------ every method on the bundled model
# Each node beyond the root costs two plain steps: even a draft that is always accepted (the model
# drafting for itself) earns less than plain steps.
def no_draft_pays() -> Floor:
    return Floor(price=lambda nodes, seconds: 2.0 * nodes - 1.0)


def build(method: str, request: pytest.FixtureRequest):  # noqa: ANN201 - a Proposer
    loaded = request.getfixturevalue("default_model")
    if method == "hybrid":  # over conftest's 24-layer stand-in draft, as in the lossless matrix
        config = HybridConfig(draft_model="in-memory", schedule="heuristic", when="always")
        draft = config.draft_config().build_with(loaded, request.getfixturevalue("small_draft"))
        return HybridProposer(config, config.logitspec_config().build(loaded), draft, loaded.model.config.vocab_size)
    return build_proposer(loaded, "draft:self" if method == "draft" else method, request)


DRAFTING_METHODS = sorted(set(METHODS) - {"plain"})
# The fast tier checks one method of each kind of proposer state (n-gram index, feature head, draft model's
# cache); the full tier every method.
FLOOR_FAST = {"pld", "eagle", "draft"}


@pytest.mark.parametrize(
    "method", [pytest.param(m, marks=() if m in FLOOR_FAST else pytest.mark.slow) for m in DRAFTING_METHODS]
)
def test_where_no_draft_pays_every_method_steps_plainly(plain_runs, bench_prompts, method, request):
    """After its warm-up the row's steps are plain, but for the floor's drafting tries (runs of DRAFT_RUN steps
    after 4, 8, 16 plain steps), and the text is plain decoding's: every method keeps its state through depth-0
    steps."""
    engine = Engine(request.getfixturevalue("default_model"), floor=no_draft_pays())
    out = engine.generate(bench_prompts["math_reasoning"], build(method, request), GenerationConfig(max_new_tokens=48))
    assert out.token_ids == plain_runs.tokens("math_reasoning", 48)
    drafted = [step.tree_size for step in out.stats.steps if step.tree_size > 1]
    assert len(drafted) <= WARMUP + 3 * DRAFT_RUN, [step.tree_size for step in out.stats.steps]


def test_a_heads_plain_steps_capture_no_features(default_model, plain_runs, bench_prompts):
    """Where plain steps lead, EAGLE's passes capture the target's features only before a drafting try
    (`FloorState.may_draft_next`): the head has no entry for the positions between, and the tries still
    draft a tree (the pass before each captured)."""
    engine = Engine(default_model, floor=no_draft_pays())
    proposer = parse_method("eagle").build(default_model)
    out = engine.generate(bench_prompts["math_reasoning"], proposer, GenerationConfig(max_new_tokens=48))
    assert out.token_ids == plain_runs.tokens("math_reasoning", 48)
    entries = list(proposer.key_positions)
    assert entries == sorted(set(entries)) and len(entries) < entries[-1] + 1 - 20, "no position was skipped"
    drafted = [step.tree_size for step in out.stats.steps if step.tree_size > 1]
    assert len(drafted) > WARMUP, [step.tree_size for step in out.stats.steps]  # a try after plain steps


@pytest.mark.parametrize("method", ["medusa", "hydra"])
def test_medusa_heads_plain_steps_capture_no_features(default_model, plain_runs, bench_prompts, method):
    """Where plain steps lead, Medusa's and Hydra's passes capture the target's state only before a drafting try:
    most steps see no features, the tries still draft a tree (the pass before each captured), and a step that
    finds none drafts nothing from the heads (at most a looked-up chain), never from an older state."""
    engine = Engine(default_model, floor=no_draft_pays())
    proposer = parse_method(method).build(default_model)
    seen, propose = [], proposer.propose

    def record(ctx):
        seen.append(ctx.features is not None and ctx.features.shape[0] > 0)
        tree = propose(ctx)
        looked_up = proposer.node_sources() is not None  # a plain step's chain (`plain_lookup`): no state needed
        assert tree.num_nodes == 1 or seen[-1] or looked_up, "drafted from an older state"
        return tree

    proposer.propose = record
    out = engine.generate(bench_prompts["math_reasoning"], proposer, GenerationConfig(max_new_tokens=64))
    assert out.token_ids == plain_runs.tokens("math_reasoning", 64)
    assert seen.count(False) > len(seen) // 2, seen
    drafted = [step.tree_size for step in out.stats.steps if step.tree_size > 1]
    assert len(drafted) > WARMUP, [step.tree_size for step in out.stats.steps]  # a try after plain steps


def test_a_may_draft_next_answer_covers_every_try() -> None:
    """The prediction never says no before a step that drafts: replayed over a losing mode's steps."""
    state, modes = FloorState(), []
    for _ in range(200):
        drafting = state.drafts()
        modes.append((drafting, state.may_draft_next(drafting)))
        state.observe(drafting, 2 if drafting else 1, 3.0 if drafting else 1.0)
    missed = [i for i in range(1, len(modes)) if modes[i][0] and not modes[i - 1][1]]
    assert not missed and sum(not answer for _, answer in modes) > 150, modes


@pytest.mark.slow
@pytest.mark.parametrize("method", ["pld", "logitspec", "eagle"])
def test_where_drafts_pay_they_go_on(default_model, plain_runs, bench_prompts, method):
    """Priced by tree size alone, drafts that earn more than plain steps run as the method sizes them:
    the floor adds its plain tries (runs of SETTLE + 1 steps, after 16 and 32 drafting steps here), and a
    few plain steps after a run of drafts that failed (its rates follow the last ten or so steps), to the
    steps that drafted nothing anyway."""
    config, prompt = GenerationConfig(max_new_tokens=48), bench_prompts["summarization"]
    free = Engine(default_model).generate(prompt, parse_method(method).build(default_model), config)
    floored = Engine(default_model, floor=Floor(price=lambda nodes, seconds: 1.0 + 0.01 * nodes))
    out = floored.generate(prompt, parse_method(method).build(default_model), config)
    assert out.token_ids == free.token_ids == plain_runs.tokens("summarization", 48)
    plain_steps = [sum(step.tree_size == 1 for step in o.stats.steps) for o in (free, out)]
    assert out.stats.mat > 1.0 and plain_steps[1] <= plain_steps[0] + 3 * (SETTLE + 1) + 4, plain_steps


def test_sampled_rows_are_gated_only_where_drafts_cannot_change_the_output(default_model, bench_prompts):
    """A seeded row's output must not depend on timing. A proposer whose trees carry no draft probabilities
    (`deterministic_drafts`: pld) leaves a sampled output as plain sampling's whatever it drafts, so the floor
    gates it as a greedy row, and the output is plain sampling's with the same seed; a proposer that draws its
    drafts (EAGLE's sampled trees) takes the row's random draws, so its sampled rows always draft."""
    engine = Engine(default_model, floor=no_draft_pays())
    config = GenerationConfig(max_new_tokens=24, sampling=SamplingParams(temperature=0.8, seed=4))
    prompt = bench_prompts["summarization"]
    plain = Engine(default_model).generate(prompt, parse_method("plain").build(default_model), config)
    gated = engine.generate(prompt, parse_method("pld").build(default_model), config)
    assert gated.token_ids == plain.token_ids
    assert sum(step.tree_size > 1 for step in gated.stats.steps) <= WARMUP + 3
    assert parse_method("eagle").build(default_model).deterministic_drafts  # the top-k tree by default
    assert parse_method("lookahead").build(default_model).deterministic_drafts
    drawing = parse_method("eagle:sampled=true").build(default_model)
    assert not drawing.deterministic_drafts
    out = engine.generate(prompt, drawing, config)
    assert sum(step.tree_size > 1 for step in out.stats.steps) > WARMUP


def test_a_gated_sampled_row_that_draws_a_tree_ends_with_an_error(default_model, bench_prompts):
    """The engine holds a proposer to `deterministic_drafts`: a tree with draft probabilities in a gated
    sampled row ends the row with an error rather than let timing reach the output."""

    class Drawing(PLDProposer):  # says deterministic, draws anyway (a broken proposer)
        def propose(self, ctx):  # noqa: ANN001, ANN202
            tree = super().propose(ctx)
            vocab = ctx.last_logits.shape[-1]
            return DraftTree(tree.tokens, tree.parents, torch.full((tree.num_nodes, vocab), 1.0 / vocab))

    engine = Engine(default_model, floor=Floor())
    config = GenerationConfig(max_new_tokens=8, sampling=SamplingParams(temperature=0.8, seed=1))
    with pytest.raises(RuntimeError, match="deterministic_drafts"):
        engine.generate(bench_prompts["summarization"], Drawing(PLDConfig()), config)


def test_a_lone_row_under_a_floor_plans_only_trees_its_proposer_did_not_size(default_model, plain_runs, bench_prompts):
    """Under a floor (priced by tree size alone, where drafts pay) a lone row's pld trees are cut by the batch's
    plan with the machine's cost curve, as a lone row of any batch is; LogitSpec's, sized by the same costs, are
    verified as proposed; the text is plain decoding's either way."""
    config, prompt = GenerationConfig(max_new_tokens=32), bench_prompts["summarization"]
    engine = Engine(default_model, floor=Floor(price=lambda nodes, seconds: 1.0 + 0.01 * nodes))
    assert not parse_method("logitspec:adaptive=false").build(default_model).sized_by_costs  # the paper's tree
    for method, sized in (("pld", False), ("logitspec", True)):
        proposer, proposed = parse_method(method).build(default_model), []
        assert proposer.sized_by_costs is sized
        proposer.propose = _recording(proposer.propose, proposed)
        out = engine.generate(prompt, proposer, config)
        assert out.token_ids == plain_runs.tokens("summarization", 32)
        verified, sizes = [step.tree_size for step in out.stats.steps], [tree.num_nodes for tree in proposed]
        assert len(verified) == len(sizes) and max(sizes) > 1
        assert (verified == sizes) is sized, (method, verified, sizes)


def _recording(propose, trees: list):  # noqa: ANN001, ANN202 - a proposer's propose, wrapped
    """`propose` that also appends each tree it returns to `trees`."""

    def recorded(ctx):  # noqa: ANN001, ANN202
        trees.append(propose(ctx))
        return trees[-1]

    return recorded
