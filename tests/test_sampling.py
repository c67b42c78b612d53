"""Tests for specdec.sampling (parameters, logits -> probs) and specdec.engine.accept (the acceptance rules).

The acceptance rules are tested by distribution, model-free and exactly: a tiny
"target model" and "draft model" are random order-2 Markov tables over a vocabulary
of 8 (tests/distribution.py), and for each rule every draft and every random choice
of one step is enumerated with its probability (tests/exact.py), so the distribution
of the first emitted token, and of the first two, is computed exactly and compared
with the target's own: a lossless rule is off by float rounding (~1e-7), the
deliberately broken ones by 1e-2 and more. One sampled check runs the rules on the
engines' own random numbers (a seeded generator), so what the enumeration assumes of
`Chance` is checked against what production draws.

The first-two-token truth is p(x1) * p(x2 | root, x1) for every (x1, x2). When a
step emits only one token, the second is the target's own given the root and x1:
that is what any lossless next step would emit (the next step's own first token is
what the first-token check covers), so the two-token check measures exactly what
the step under test adds: an accepted draft and the bonus / recovered token after
it must have the target's conditional distribution.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from distribution import (
    CONTEXT,
    PARAMS_A,
    PARAMS_B,
    PLAIN,
    RETRIEVAL_PARENTS,
    RETRIEVAL_TOKENS,
    ROOT,
    SCENARIOS,
    Models,
    Rule,
    Scenario,
    build_step,
    check,
    reference_probs,
)
from exact import LOSSLESS_TV, Enumerated, assert_exact, enumerate_outcomes, exact_distributions
from helpers import tv_bound
from hypothesis import given, settings
from hypothesis import strategies as st

from specdec.engine.accept import (
    Acceptance,
    _residual,
    accept,
    accept_deterministic,
    accept_greedy,
    accept_multi_draft,
    accept_speculative_chain,
    draw_next,
    point_mass_rows,
)
from specdec.engine.uniforms import Chance, PositionUniforms, draw, draw_rows
from specdec.sampling import SamplingParams, logits_to_probs, make_generator
from specdec.tree import DraftTree


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Everything here works on tiny tensors: extra intra-op threads only add synchronisation
    (on a busy 2-core machine the sampled checks ran 3x slower with 2 threads)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_rule_matches_target_distribution_exactly(name: str) -> None:
    seed, scenario = SCENARIOS[name]
    assert_exact(name, scenario, seed, lossless=True)


def test_sampled_steps_match_the_target_distribution() -> None:
    """The real rules on a seeded generator (the engines' per-node uniforms), 20k steps of the mixed tree
    (drawn drafts and point-mass guesses as siblings): within the sampling bound of the truth."""
    seed, scenario = SCENARIOS["mixed-tree"]
    (tv_first, bound_first), (tv_two, bound_two) = check(scenario, seed, num_trials=20_000)
    print(f"sampled: TV first {tv_first:.4f} < {bound_first:.4f}, first two {tv_two:.4f} < {bound_two:.4f}")
    assert tv_first < bound_first and tv_two < bound_two


def test_enumeration_covers_every_choice_with_its_probability() -> None:
    """The enumerator itself, on choices whose answer is known: a test at 0.3, a draw from [1, 2, 1],
    and one uniform used twice (u < 0.5, then u < 0.25 given that: 0.25 in all)."""

    def trial(chance: Enumerated) -> tuple:
        return chance.below(0, 0.3, 1.0), chance.draw(1, torch.tensor([1.0, 2.0, 1.0]))

    outcomes = enumerate_outcomes(trial)
    assert outcomes[(True, 1)] == pytest.approx(0.3 * 0.5) and outcomes[(False, 0)] == pytest.approx(0.7 * 0.25)
    assert len(outcomes) == 6
    twice = enumerate_outcomes(lambda chance: chance.below(0, 1.0, 2.0) and chance.below(0, 1.0, 4.0))
    assert twice[True] == pytest.approx(0.25)


def accept_every_draft(tree: DraftTree, target_probs: torch.Tensor, chance: Chance) -> Acceptance:
    """BROKEN on purpose: takes the first child all the way down."""
    path = [0]
    while tree.children[path[-1]]:
        path.append(tree.children[path[-1]][0])
    return Acceptance(path, [tree.token_list[i] for i in path[1:]] + [0])


def forgetful_chain(tree: DraftTree, target_probs: torch.Tensor, chance: Chance) -> Acceptance:
    """BROKEN on purpose, subtly: after a rejection it samples the target row, not the residual."""
    draft, tokens = tree.draft_probs, tree.token_list
    for node in range(1, tree.num_nodes):
        token = tokens[node]
        if not chance.below(node, float(target_probs[node - 1, token]), float(draft[node, token])):
            return Acceptance(list(range(node)), tokens[1:node] + [chance.draw(0, target_probs[node - 1])])
    return Acceptance(list(range(tree.num_nodes)), tokens[1:] + [chance.draw(0, target_probs[-1])])


@pytest.mark.parametrize("broken", [accept_every_draft, forgetful_chain], ids=["accept-every-draft", "forgetful-residual"])
def test_broken_rule_fails_the_same_check(broken: Rule) -> None:
    """The check has teeth: broken rules land far outside float rounding (same scenario)."""
    seed, scenario = SCENARIOS["speculative-chain"]
    assert_exact(broken.__name__, dataclasses.replace(scenario, rule=broken), seed, lossless=False)


def guess_kept_in_residual(tree: DraftTree, target_probs: torch.Tensor, chance: Chance) -> Acceptance:
    """BROKEN on purpose: a rejected point-mass guess is not taken out of the residual."""
    draft, tokens, children = tree.draft_probs, tree.token_list, tree.children
    node, path = 0, [0]
    while True:
        residual = target_probs[node]
        for child in children[node]:
            x = tokens[child]
            if chance.below(child, float(residual[x]), float(draft[child, x])):
                break
            if float(draft[child].max()) < 1.0:  # the bug: only drawn drafts shrink the residual
                residual = _residual(residual, draft[child])
        else:
            final = chance.draw(0, residual)
            return Acceptance(path, [tokens[i] for i in path[1:]] + [final])
        node = child
        path.append(node)


def test_broken_mixed_rule_fails_the_same_check() -> None:
    seed, scenario = SCENARIOS["mixed-tree"]
    assert_exact("mixed, guess kept", dataclasses.replace(scenario, rule=guess_kept_in_residual), seed, lossless=False)


class StuckChance(Chance):
    """BROKEN on purpose: every draw of a step made with the step's first uniform."""

    def __init__(self, chance: Chance) -> None:
        self.chance, self.by_position = chance, True

    def draw(self, key: int, probs: torch.Tensor) -> int:
        return self.chance.draw(0, probs)


def test_broken_position_uniforms_fail_the_same_check() -> None:
    """Reusing one uniform for two positions keeps each token's marginal but couples them: the pair fails."""
    seed, scenario = SCENARIOS["deterministic-by-position"]

    def stuck(tree: DraftTree, target_probs: torch.Tensor, chance: Chance) -> Acceptance:
        return accept_deterministic(tree, target_probs, StuckChance(chance))

    tv_first, tv_two = exact_distributions(dataclasses.replace(scenario, rule=stuck), seed)
    print(f"stuck uniforms: exact TV first {tv_first:.2e}, first two {tv_two:.2e}")
    assert tv_first < LOSSLESS_TV < 100 * LOSSLESS_TV < tv_two


def test_position_uniforms_make_deterministic_drafts_irrelevant() -> None:
    """With uniforms by position a tree emits what plain sampling (one draw per position) emits."""
    models = Models.make(11, PARAMS_B)
    scenario = Scenario(RETRIEVAL_PARENTS, accept_deterministic, PARAMS_B, RETRIEVAL_TOKENS, by_position=True)
    tree, target_probs = build_step(scenario, models, RETRIEVAL_TOKENS)
    deep = 0
    for seed in range(40):
        positions = PositionUniforms(torch.Generator().manual_seed(seed))
        emitted = accept_deterministic(tree, target_probs, None, positions).tokens
        assert positions.position == len(emitted)
        plain, before = PositionUniforms(torch.Generator().manual_seed(seed)), [CONTEXT, ROOT]
        for _ in emitted:
            before.append(draw_next(models.target_logits[before[-2], before[-1]], PARAMS_B, plain))
        assert before[2:] == emitted
        deep += len(emitted) > 2
    assert deep > 0  # some walks went two drafts deep


def test_position_uniforms_are_drawn_once_each() -> None:
    positions = PositionUniforms(torch.Generator().manual_seed(0))
    first = [positions.at(i) for i in range(100)]
    positions.advance(3)
    assert positions.at(0) == first[3] and len(set(first)) == 100
    with pytest.raises(ValueError):
        positions.advance(-1)


def test_point_mass_rows() -> None:
    rows = point_mass_rows(torch.tensor([2, 0, 2]), 4)
    assert rows.dtype == torch.float32
    assert rows.tolist() == [[0, 0, 1, 0], [1, 0, 0, 0], [0, 0, 1, 0]]


def test_bounds_are_what_the_docstring_says() -> None:
    uniform_8, uniform_64 = torch.full((8,), 1 / 8), torch.full((64,), 1 / 64)
    assert 0.011 < tv_bound(uniform_8, 100_000) < 0.014
    assert 0.018 < tv_bound(uniform_64, 100_000) < 0.021


# ============================================================== unit tests
# ------------------------------------------------------------ SamplingParams
def test_default_params_are_greedy() -> None:
    assert SamplingParams().greedy
    assert not SamplingParams(temperature=0.5).greedy


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"temperature": -0.1}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"top_k": -1}, "top_k"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": -0.5}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
    ],
)
def test_params_validation(kwargs: dict, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        SamplingParams(**kwargs)


def test_params_are_frozen() -> None:
    with pytest.raises(AttributeError):
        SamplingParams().temperature = 1.0  # type: ignore[misc]


# ------------------------------------------------------------ make_generator
def _stream(gen: torch.Generator) -> list[float]:
    return torch.rand(5, generator=gen).tolist()


def test_seeded_generator_is_reproducible() -> None:
    params = SamplingParams(temperature=1.0, seed=1234)
    assert _stream(make_generator(params, "cpu")) == _stream(make_generator(params, torch.device("cpu")))
    assert _stream(make_generator(params, "cpu")) != _stream(make_generator(SamplingParams(seed=1235), "cpu"))


def test_unseeded_generator_follows_torch_default_rng() -> None:
    params = SamplingParams(temperature=1.0)
    torch.manual_seed(99)
    first = _stream(make_generator(params, "cpu"))
    again = _stream(make_generator(params, "cpu"))
    torch.manual_seed(99)
    assert _stream(make_generator(params, "cpu")) == first
    assert again != first


def test_same_seed_same_acceptances() -> None:
    def run() -> list[Acceptance]:
        gen = make_generator(SamplingParams(temperature=1.0, seed=5), "cpu")
        data = torch.Generator().manual_seed(0)
        out = []
        for _ in range(30):
            tree, logits = _random_case(data, 9, 16, with_draft_probs=True)
            out.append(accept(tree, logits, PARAMS_A, gen))
        return out

    assert run() == run()


# ------------------------------------------------------------ logits_to_probs
def test_logits_to_probs_shapes_and_dtype() -> None:
    logits = torch.randn(2, 3, 11).bfloat16()
    probs = logits_to_probs(logits, PARAMS_A)
    assert probs.shape == logits.shape and probs.dtype == torch.float32
    assert torch.allclose(probs.sum(-1), torch.ones(2, 3))


def test_temperature_scales_logits() -> None:
    logits = torch.randn(4, 10)
    expected = (logits / 0.6).softmax(-1)
    assert torch.allclose(logits_to_probs(logits, SamplingParams(temperature=0.6)), expected, atol=1e-7)


def test_greedy_params_give_the_argmax_one_hot() -> None:
    logits = torch.tensor([[0.0, 2.0, 2.0, 1.0], [5.0, 0.0, 0.0, 0.0]])
    assert logits_to_probs(logits, SamplingParams()).tolist() == [[0, 1, 0, 0], [1, 0, 0, 0]]


def test_top_k_keeps_the_k_largest() -> None:
    logits = torch.randn(50, 12, generator=torch.Generator().manual_seed(3))
    for k in range(1, 13):
        probs = logits_to_probs(logits, SamplingParams(temperature=1.0, top_k=k))
        kept = probs > 0
        assert (kept.sum(-1) == k).all()
        assert torch.equal(kept, logits >= logits.topk(k, -1).values[:, -1:])
        expected = logits.masked_fill(~kept, float("-inf")).softmax(-1)
        assert torch.allclose(probs, expected, atol=1e-7)


def test_top_k_keeps_ties_with_the_kth_logit() -> None:
    probs = logits_to_probs(torch.tensor([3.0, 1.0, 3.0, 2.0]), SamplingParams(temperature=1.0, top_k=1))
    assert probs.tolist() == [0.5, 0.0, 0.5, 0.0]


def test_top_p_keeps_the_smallest_set_reaching_top_p() -> None:
    probs_in = torch.tensor([0.05, 0.4, 0.3, 0.15, 0.1])
    logits = probs_in.log()
    for top_p, support in [
        (0.3, [1]),
        (0.4, [1]),
        (0.41, [1, 2]),
        (0.7, [1, 2]),
        (0.71, [1, 2, 3]),
        (0.9, [1, 2, 3, 4]),
    ]:
        probs = logits_to_probs(logits, SamplingParams(temperature=1.0, top_p=top_p))
        assert (probs > 0).nonzero().flatten().tolist() == support, top_p
        assert torch.allclose(probs[support], probs_in[support] / probs_in[support].sum())


def test_the_top_token_always_survives() -> None:
    logits = torch.randn(20, 30, generator=torch.Generator().manual_seed(4))
    for params in (SamplingParams(temperature=1.0, top_p=1e-9), SamplingParams(temperature=1.0, top_k=1)):
        probs = logits_to_probs(logits, params)
        assert torch.equal(probs, torch.nn.functional.one_hot(logits.argmax(-1), 30).float())


@settings(max_examples=100, deadline=None)
@given(
    seed=st.integers(0, 2**31),
    vocab_size=st.sampled_from([2, 5, 16, 40, 300, 1000]),
    scale=st.sampled_from([0.2, 1.0, 4.0]),  # flat to peaky: the nucleus is wide or narrow
    temperature=st.floats(0.1, 3.0),
    top_k=st.integers(0, 50),
    top_p=st.floats(0.01, 1.0),
)
def test_logits_to_probs_matches_the_reference(seed, vocab_size, scale, temperature, top_k, top_p) -> None:
    logits = scale * torch.randn(3, vocab_size, generator=torch.Generator().manual_seed(seed))
    params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p)
    probs, expected = logits_to_probs(logits, params), reference_probs(logits, params)
    # A token whose preceding mass is within float32 rounding of top_p may fall either side.
    scaled = logits.double() / temperature
    if 0 < top_k < vocab_size:
        scaled = scaled.masked_fill(scaled < scaled.topk(top_k, -1).values[:, -1:], float("-inf"))
    ordered, order = scaled.softmax(-1).sort(-1, descending=True)
    mass_before = torch.empty_like(ordered).scatter_(-1, order, ordered.cumsum(-1) - ordered)
    ambiguous = (mass_before - top_p).abs() < 1e-6
    assert torch.equal((probs > 0) | ambiguous, (expected > 0) | ambiguous)
    assert torch.allclose(probs.double(), expected, atol=1e-5)


# ------------------------------------------------------------ helpers of the rules
def test_draw_never_picks_a_zero_probability_token() -> None:
    probs = torch.tensor([0.0, 2.0, 0.0, 2.0, 0.0])  # unnormalised is fine
    assert draw(probs, 0.0) == 1
    assert draw(probs, 0.4999) == 1
    assert draw(probs, 0.5) == 3
    assert draw(probs, 1 - 2**-53) == 3


def test_residual_is_normalised_and_falls_back_when_empty() -> None:
    base, draft = torch.tensor([0.5, 0.3, 0.2]), torch.tensor([0.2, 0.6, 0.2])
    assert torch.allclose(_residual(base, draft), torch.tensor([1.0, 0.0, 0.0]))
    assert _residual(base, base.clone()) is base  # ~0 mass: the rejection was (numerically) impossible
    assert _residual(base, base + 1e-8) is base


# ------------------------------------------------------------ greedy
def _logits_with_argmax(argmaxes: list[int], vocab_size: int = 10) -> torch.Tensor:
    logits = torch.zeros(len(argmaxes), vocab_size)
    logits[range(len(argmaxes)), argmaxes] = 1.0
    return logits


def test_greedy_accepts_a_whole_chain_and_adds_the_bonus() -> None:
    tree = DraftTree.chain(7, [1, 2, 3])
    result = accept_greedy(tree, _logits_with_argmax([1, 2, 3, 9]))
    assert result.path == [0, 1, 2, 3] and result.tokens == [1, 2, 3, 9] and result.num_accepted == 3


def test_greedy_stops_at_the_first_mismatch_with_the_correction() -> None:
    tree = DraftTree.chain(7, [1, 2, 3])
    result = accept_greedy(tree, _logits_with_argmax([1, 5, 3, 9]))
    assert result.path == [0, 1] and result.tokens == [1, 5]


def test_greedy_follows_the_matching_sibling() -> None:
    tree = DraftTree.from_branches(7, [[1, 2], [4, 5], [4, 6]])  # nodes: 1:1 2:2 3:4 4:5 5:6
    result = accept_greedy(tree, _logits_with_argmax([4, 0, 0, 6, 0, 8]))
    assert result.path == [0, 3, 5] and result.tokens == [4, 6, 8]


def test_greedy_emits_one_token_when_every_node_is_rejected() -> None:
    tree = DraftTree.from_branches(7, [[1, 2], [3]])
    result = accept_greedy(tree, _logits_with_argmax([9, 9, 9, 9]))
    assert result.path == [0] and result.tokens == [9] and result.num_accepted == 0
    root_only = accept_greedy(DraftTree.chain(7), _logits_with_argmax([4]))
    assert root_only.path == [0] and root_only.tokens == [4]


def test_greedy_breaks_ties_like_torch_argmax_and_reads_bf16() -> None:
    logits = torch.tensor([[0.0, 3.0, 3.0, 1.0], [2.0, 0.0, 2.0, 0.0]]).bfloat16()
    result = accept_greedy(DraftTree.chain(0, [1]), logits)
    assert result.tokens == [1, 0] == [int(logits[0].argmax()), int(logits[1].argmax())]


def test_greedy_emits_the_argmax_of_every_path_row() -> None:
    data = torch.Generator().manual_seed(1)
    for _ in range(200):
        tree, logits = _random_case(data, 12, 6, with_draft_probs=False)
        result = accept_greedy(tree, logits)
        assert result.tokens == [int(logits[node].argmax()) for node in result.path]
        _assert_consistent(tree, result)


def test_greedy_on_one_transfer_walks_as_the_cpu_path() -> None:
    """The accelerator's walk (one argmax over every row, one transfer), run on CPU tensors: the same path and
    tokens as the CPU's row-by-row walk, bf16 ties included."""
    data = torch.Generator().manual_seed(2)
    for case in range(200):
        tree, logits = _random_case(data, 12, 6, with_draft_probs=False)
        if case % 2:
            logits = logits.bfloat16()
        assert accept_greedy(tree, logits, one_transfer=True) == accept_greedy(tree, logits, one_transfer=False)
    ties = torch.tensor([[0.0, 3.0, 3.0, 1.0], [2.0, 0.0, 2.0, 0.0]]).bfloat16()
    assert accept_greedy(DraftTree.chain(0, [1]), ties, one_transfer=True).tokens == [1, 0]


@pytest.mark.parametrize("by_position", [True, False], ids=["position-uniforms", "node-uniforms"])
def test_sampled_one_transfer_walks_as_the_cpu_path(by_position: bool) -> None:
    """The accelerator's deterministic walk (every node drawn at once, one transfer), on CPU tensors: with the
    same seed, the same path, tokens and uniforms spent as the CPU's row-by-row walk, so it inherits that
    walk's exact distribution checks; top-k and top-p rows (zeros in the CDF) included."""
    data = torch.Generator().manual_seed(3)
    settings = [SamplingParams(temperature=0.8, seed=0), SamplingParams(temperature=1.3, top_k=3, top_p=0.9, seed=0)]
    deep = 0
    for case in range(200):
        params = settings[case % 2]
        tree, logits = _random_case(data, 12, 5, with_draft_probs=False)
        results = []
        for one_transfer in (True, False):
            generator = torch.Generator().manual_seed(case)
            positions = PositionUniforms(generator) if by_position else None
            result = accept(tree, logits, params, generator, positions, one_transfer=one_transfer)
            results.append((result, positions.position if positions else float(torch.rand(1, generator=generator))))
        assert results[0] == results[1]
        deep += results[0][0].num_accepted > 1
    assert deep > 5  # some walks went past the first two drafts


def test_draw_rows_draws_each_row_as_draw_does() -> None:
    probs = torch.tensor([[0.2, 0.3, 0.5, 0.0, 0.0], [0.0, 0.0, 1.0, 0.0, 0.0], [0.1, 0.1, 0.1, 0.1, 0.6]])
    for u in (0.0, 0.19999, 0.2, 0.5, 0.99999, 1 - 2**-53):
        uniforms = torch.full((3,), u, dtype=torch.float64)
        assert draw_rows(probs, uniforms).tolist() == [draw(row, u) for row in probs]
    assert draw_rows(probs, torch.tensor([1.0, 1.0, 1.0], dtype=torch.float64)).tolist() == [2, 2, 4]  # overflow


def test_greedy_dispatch_needs_no_generator() -> None:
    tree, logits = DraftTree.chain(7, [1, 2]), _logits_with_argmax([1, 4, 0])
    assert accept(tree, logits, SamplingParams(), None) == accept_greedy(tree, logits)


def test_rows_must_match_the_tree() -> None:
    tree = DraftTree.chain(7, [1, 2])
    with pytest.raises(ValueError, match="N = 3"):
        accept_greedy(tree, torch.zeros(2, 10))
    with pytest.raises(ValueError, match="N = 3"):
        accept(tree, torch.zeros(4, 10), PARAMS_A, torch.Generator())
    drafted = DraftTree.chain(7, [1, 2], torch.full((3, 10), 0.1))
    with pytest.raises(ValueError, match="draft_probs"):
        accept_speculative_chain(drafted, torch.full((3, 12), 1 / 12), torch.Generator())


# ------------------------------------------------------------ sampling rules: structure
def _random_case(
    data: torch.Generator, max_nodes: int, vocab_size: int, with_draft_probs: bool
) -> tuple[DraftTree, torch.Tensor]:
    """A random tree (small vocabulary: matches and duplicate siblings happen) and target logits."""
    num_nodes = int(torch.randint(1, max_nodes + 1, (1,), generator=data))
    parents = [-1] + [int(torch.randint(0, i, (1,), generator=data)) for i in range(1, num_nodes)]
    tokens = torch.randint(0, vocab_size, (num_nodes,), generator=data)
    draft_probs = None
    if with_draft_probs:
        draft_probs = (2 * torch.randn(num_nodes, vocab_size, generator=data)).softmax(-1)
    logits = 2 * torch.randn(num_nodes, vocab_size, generator=data)
    return DraftTree(tokens, torch.tensor(parents), draft_probs), logits


def _assert_consistent(tree: DraftTree, result: Acceptance) -> None:
    assert result.path[0] == 0 and len(result.tokens) == len(result.path) >= 1
    assert all(tree.parent_list[b] == a for a, b in zip(result.path, result.path[1:], strict=False))
    assert result.tokens[:-1] == [tree.token_list[i] for i in result.path[1:]]
    assert result.num_accepted == len(result.path) - 1


@pytest.mark.parametrize("kind", ["deterministic", "chain", "tree"])
def test_accept_dispatches_to_the_rule_with_lazy_rows(kind: str) -> None:
    """`accept` (rows made on demand) gives exactly what the rule gives on all rows at once."""
    rule = {
        "deterministic": accept_deterministic,
        "chain": accept_speculative_chain,
        "tree": accept_multi_draft,
    }[kind]
    data = torch.Generator().manual_seed(2)
    for seed in range(150):
        tree, logits = _random_case(data, 10, 6, with_draft_probs=kind != "deterministic")
        if kind == "chain":
            tree = DraftTree.chain(tree.token_list[0], tree.token_list[1:], tree.draft_probs)
        params = (PARAMS_A, PARAMS_B, PLAIN)[seed % 3]
        got = accept(tree, logits, params, torch.Generator().manual_seed(seed))
        want = rule(tree, logits_to_probs(logits, params), torch.Generator().manual_seed(seed))
        assert got == want
        _assert_consistent(tree, got)


def test_multi_draft_on_a_chain_is_the_chain_rule() -> None:
    data = torch.Generator().manual_seed(3)
    for seed in range(100):
        tree, logits = _random_case(data, 6, 5, with_draft_probs=True)
        chain = DraftTree.chain(tree.token_list[0], tree.token_list[1:], tree.draft_probs)
        probs = logits.softmax(-1)
        assert accept_multi_draft(
            chain, probs, torch.Generator().manual_seed(seed)
        ) == accept_speculative_chain(chain, probs, torch.Generator().manual_seed(seed))


def test_rules_refuse_the_wrong_kind_of_tree() -> None:
    probs, gen = torch.full((3, 4), 0.25), torch.Generator()
    with pytest.raises(ValueError, match="chain"):
        accept_speculative_chain(DraftTree.chain(0, [1, 2]), probs, gen)  # no draft_probs
    branched = DraftTree(torch.tensor([0, 1, 2]), torch.tensor([-1, 0, 0]), probs)
    with pytest.raises(ValueError, match="chain"):
        accept_speculative_chain(branched, probs, gen)
    with pytest.raises(ValueError, match="draft_probs"):
        accept_multi_draft(DraftTree.chain(0, [1, 2]), probs, gen)


def test_every_rule_emits_one_token_when_every_node_is_rejected() -> None:
    """The target gives zero mass to every drafted token: nothing is accepted, one token still comes out."""
    target_probs = torch.tensor([[0.0, 0.0, 0.5, 0.0, 0.5]]).expand(5, 5)  # only tokens 2 and 4
    draft_probs = torch.tensor([[0.3, 0.3, 0.1, 0.3, 0.0]]).expand(5, 5)
    tokens, gen = torch.tensor([2, 0, 1, 3, 0]), torch.Generator().manual_seed(0)
    cases = [
        (accept_deterministic, DraftTree(tokens, torch.tensor([-1, 0, 0, 0, 1]))),
        (accept_speculative_chain, DraftTree(tokens, torch.tensor([-1, 0, 1, 2, 3]), draft_probs)),
        (accept_multi_draft, DraftTree(tokens, torch.tensor([-1, 0, 0, 0, 1]), draft_probs)),
    ]
    for rule, tree in cases:
        for _ in range(200):
            result = rule(tree, target_probs, gen)
            assert result.path == [0] and len(result.tokens) == 1 and result.tokens[0] in (2, 4)


def test_drafts_drawn_from_the_target_are_always_accepted() -> None:
    """draft == target: min(1, p / q) = 1 for every drafted token, so whole chains and first children pass."""
    data = torch.Generator().manual_seed(4)
    for seed in range(100):
        tree, logits = _random_case(data, 8, 6, with_draft_probs=False)
        probs = logits.softmax(-1)  # every token has mass, so every drafted token could have been drawn
        chain = DraftTree.chain(
            tree.token_list[0], tree.token_list[1:], probs[[0, *range(tree.num_nodes - 1)]]
        )
        result = accept_speculative_chain(chain, probs, torch.Generator().manual_seed(seed))
        assert result.path == list(range(tree.num_nodes))
