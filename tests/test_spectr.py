"""SpecTr's k-sequential selection (`specdec.engine.spectr`, `accept.accept_spectr`, `accept=spectr`).

Three kinds of check:
- exact, model-free: one group of k i.i.d. drafts emits the target distribution *exactly*
  (what acceptances take plus the residual's share, summed per token, is p), and the same
  sum with rho forced to 1 (SpecInfer's per-draft ratio with no correction for k) is not;
- by distribution, with `test_sampling`'s Markov models, exactly (every draft and every choice
  of the rule enumerated, tests/exact.py): the whole tree rule, and the broken rho = 1 rule
  rejected by the same check;
- acceptance: on synthetic rows where the paper's argument says SpecTr gains (a draft
  more peaked than the target: k draws repeat the token the draft over-rates, SpecInfer
  wastes the repeats once the residual has no mass there), the acceptance of both real
  rules, enumerated, matches its closed form, and SpecTr's is the higher.

End to end: `eagle:sampled=true,accept=spectr` on the bundled model (fp32) is seeded
(same seed, same text) at temperature 1 and token-identical to plain at temperature 0.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from distribution import PARAMS_A, PLAIN, SCENARIOS, TREE, Scenario
from exact import Enumerated, assert_exact, enumerate_outcomes

from specdec.engine.accept import (
    Acceptance,
    _normalised,
    accept,
    accept_multi_draft,
    accept_spectr,
    point_mass_rows,
)
from specdec.engine.generation import GenerationConfig
from specdec.engine.spectr import KSequential, expanded_twin, optimal_rho, sibling_groups
from specdec.engine.uniforms import Chance
from specdec.proposers import make_config
from specdec.proposers.schema import MethodError
from specdec.sampling import SamplingParams
from specdec.tree import DraftTree

WIDE = [-1, 0, 0, 0, 0]  # four i.i.d. siblings at the root


def emitted_distribution(selection: KSequential) -> torch.Tensor:
    """[V] float64: P(token) = taken by an acceptance + P(all k rejected) * residual."""
    target, draft, k = selection.target_probs.double(), selection.draft_probs.double(), selection.k
    beta = float(torch.minimum(draft, target / selection.rho).sum())
    taken = torch.minimum(draft, target / selection.rho) * (1 - (1 - beta) ** k) / beta
    residual = _normalised(selection.excess(), selection.target_probs).double()
    return taken + (1 - beta) ** k * residual


def random_rows(seed: int, vocab: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    """(target_probs, draft_probs) [V] float32 with some zeros in each (top-k as in sampling)."""
    gen = torch.Generator().manual_seed(seed)
    rows = []
    for _ in range(2):
        logits = 2 * torch.randn(vocab, generator=gen)
        logits[torch.randperm(vocab, generator=gen)[: vocab // 4]] = float("-inf")
        rows.append(logits.softmax(-1))
    return rows[0], rows[1]


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("k", [1, 2, 3, 5, 8])
def test_one_group_emits_the_target_exactly(seed: int, k: int) -> None:
    target, draft = random_rows(seed)
    selection = KSequential.solve(target, draft, k)
    assert 1.0 <= selection.rho <= k
    assert torch.allclose(emitted_distribution(selection), target.double(), atol=2e-6)


@pytest.mark.parametrize("seed", range(6))
def test_rho_one_with_several_drafts_is_not_lossless(seed: int) -> None:
    """The control for the exact check: without solving for rho, k drafts over-emit what q over-rates."""
    target, draft = random_rows(seed)
    broken = KSequential(target, draft, 4, 1.0)
    error = float((emitted_distribution(broken) - target.double()).abs().sum()) / 2
    assert error > 0.01


def test_one_draft_is_speculative_sampling() -> None:
    target, draft = random_rows(3)
    assert optimal_rho(target, draft, 1) == 1.0
    assert torch.equal(KSequential.solve(target, draft, 1).excess(), (target - draft).clamp(min=0))
    assert optimal_rho(target, target, 4) == 1.0 and KSequential.solve(target, target, 4).acceptance() == 1.0


def test_rho_is_the_smallest_feasible() -> None:
    """Just below rho* the residual would need negative mass (what taken exceeds p by)."""
    target, draft = random_rows(1)
    rho = optimal_rho(target, draft, 4)
    assert rho > 1.0
    below = KSequential(target, draft, 4, rho - 1e-3)
    beta = float(torch.minimum(draft, target / below.rho).sum())
    taken = torch.minimum(draft, target / below.rho) * (1 - (1 - beta) ** 4) / beta
    assert float((taken - target).max()) > 0


def test_groups_are_runs_of_one_row() -> None:
    """Drawn siblings share their parent's row; point-mass guesses and other rows stand alone."""
    draft_row = torch.tensor([0.1, 0.2, 0.3, 0.4])
    rows = torch.cat([torch.zeros(1, 4), point_mass_rows(torch.tensor([2]), 4), draft_row.expand(3, 4)])
    tree = DraftTree(torch.tensor([0, 2, 1, 3, 1]), torch.tensor([-1, 0, 0, 0, 0]), rows)
    assert sibling_groups(tree, [1, 2, 3, 4], "spectr") == [[1], [2, 3, 4]]
    assert sibling_groups(tree, [1, 2, 3, 4], "specinfer") == [[1], [2], [3], [4]]


def test_a_twin_with_children_is_where_the_walk_goes() -> None:
    tree = DraftTree(torch.tensor([0, 5, 7, 5, 9]), torch.tensor([-1, 0, 0, 0, 3]))
    assert expanded_twin(tree, [1, 2, 3], 1) == 3  # node 1 is a leaf, its twin 3 has the subtree
    assert expanded_twin(tree, [1, 2, 3], 2) == 2


def test_accept_refuses_an_unknown_rule() -> None:
    tree = DraftTree.chain(0, [1], torch.full((2, 4), 0.25))
    with pytest.raises(ValueError, match="multi_draft must be one of specinfer, spectr"):
        accept(tree, torch.zeros(2, 4), PLAIN, torch.Generator(), multi_draft="spectre")


# ------------------------------------------------------------------ acceptance
def specinfer_acceptance(target: torch.Tensor, draft: torch.Tensor, k: int) -> float:
    """Exact chance that SpecInfer accepts one of k i.i.d. drafts: the residual after a rejection
    does not depend on the rejected token, so P_k(r) = beta(r) + (1 - beta(r)) P_{k-1}(norm(r - q)+)."""
    if k == 0:
        return 0.0
    beta = float(torch.minimum(target, draft).sum())
    excess = (target - draft).clamp(min=0)
    rest = specinfer_acceptance(excess / excess.sum(), draft, k - 1) if float(excess.sum()) > 1e-9 else 0.0
    return beta + (1 - beta) * rest


def exact_acceptance(rule, target: torch.Tensor, draft: torch.Tensor, k: int) -> float:  # noqa: ANN001
    """Chance that the real rule accepts one of k siblings drawn i.i.d. from `draft` (every draw and
    every choice of the rule enumerated: tests/exact.py)."""
    rows = torch.cat([torch.zeros(1, draft.shape[0]), draft.expand(k, -1)])
    target_probs, parents = target.expand(k + 1, -1), torch.tensor([-1] + [0] * k)

    def trial(chance: Enumerated) -> bool:
        tokens = [0] + [chance.draw(-i, draft) for i in range(1, k + 1)]
        return rule(DraftTree(torch.tensor(tokens), parents, rows), target_probs, chance).num_accepted > 0

    return enumerate_outcomes(trial).get(True, 0.0)


PEAKED = (torch.tensor([0.25, 0.25, 0.25, 0.25]), torch.tensor([0.7, 0.1, 0.1, 0.1]))  # (target, draft)
OFF = (torch.tensor([0.5, 0.5]), torch.tensor([0.9, 0.1]))


@pytest.mark.parametrize(("rows", "k"), [(PEAKED, 4), (PEAKED, 2), (OFF, 4)])
def test_spectr_accepts_more_where_the_draft_over_rates_a_token(rows, k: int) -> None:  # noqa: ANN001
    target, draft = rows
    closed_form = {"specinfer": specinfer_acceptance(target, draft, k), "spectr": KSequential.solve(target, draft, k).acceptance()}
    rules = {"specinfer": exact_acceptance(accept_multi_draft, target, draft, k), "spectr": exact_acceptance(accept_spectr, target, draft, k)}
    print(f"k={k}: closed form {closed_form}, the rules enumerated {rules}")
    for rule, value in closed_form.items():
        assert rules[rule] == pytest.approx(value, abs=1e-6)
    assert closed_form["spectr"] > closed_form["specinfer"] + 0.015


# ------------------------------------------------------------------ by distribution
def rho_one(tree: DraftTree, target_probs: torch.Tensor, chance: Chance) -> Acceptance:
    """BROKEN on purpose: k-sequential selection with rho = 1 whatever k is."""
    draft, tokens, children = tree.draft_probs, tree.token_list, tree.children
    node, path = 0, [0]
    while True:
        residual = target_probs[node]
        for group in sibling_groups(tree, children[node], "spectr"):
            selection = KSequential(residual, draft[group[0]], len(group), 1.0)
            odds = {c: selection.odds(tokens[c], float(draft[c, tokens[c]])) for c in group}
            child = next((c for c in group if chance.below(c, *odds[c])), None)
            if child is not None:
                break
            residual = _normalised(selection.excess(), residual)
        else:
            final = chance.draw(0, residual)
            return Acceptance(path, [tokens[i] for i in path[1:]] + [final])
        node = expanded_twin(tree, children[node], child)
        path.append(node)


# The wide tree is four i.i.d. siblings at the root, drawn from rows cut to their top 4 of a vocabulary of 6
# (256 draft outcomes, each enumerated: ~1 s).
SPECTR_SCENARIOS = {
    "tree": (13, Scenario(TREE, accept_spectr, PARAMS_A)),
    "wide-tree": (15, Scenario(WIDE, accept_spectr, SamplingParams(temperature=1.0, top_k=4), vocab=6)),
    "mixed-tree": (14, dataclasses.replace(SCENARIOS["mixed-tree"][1], rule=accept_spectr)),
}


@pytest.mark.parametrize("name", list(SPECTR_SCENARIOS))
def test_spectr_matches_target_distribution_exactly(name: str) -> None:
    seed, scenario = SPECTR_SCENARIOS[name]
    assert_exact(f"spectr {name}", scenario, seed, lossless=True)


def test_broken_spectr_fails_the_same_check() -> None:
    seed, scenario = SPECTR_SCENARIOS["wide-tree"]
    assert_exact("rho = 1", dataclasses.replace(scenario, rule=rho_one), seed, lossless=False)


# ------------------------------------------------------------------ options and end to end
def test_accept_is_an_option_of_the_sampled_methods() -> None:
    assert make_config("eagle", {"accept": "spectr"}).accept == "spectr"
    assert make_config("eagle", {}).accept == "specinfer"
    with pytest.raises(MethodError, match="eagle: option accept must be one of specinfer, spectr"):
        make_config("eagle", {"accept": "best"})


@pytest.mark.slow
def test_eagle_with_spectr_is_seeded_and_greedy_lossless(default_model, engine, plain_runs, bench_prompts) -> None:
    """fp32, bundled model and shipped head: temperature 1 twice with one seed gives one text; at
    temperature 0 the rule never runs and the output is plain's."""
    method = make_config("eagle", {"sampled": "true", "accept": "spectr"})
    prompt = bench_prompts["mt_bench"]
    hot = GenerationConfig(max_new_tokens=24, sampling=SamplingParams(temperature=1.0, seed=3), ignore_eos=True)
    runs = [engine.generate(prompt, method.build(default_model), hot) for _ in range(2)]
    assert runs[0].token_ids == runs[1].token_ids and len(runs[0].token_ids) == 24
    greedy = engine.generate(prompt, method.build(default_model), GenerationConfig(max_new_tokens=24))
    assert greedy.token_ids == plain_runs.tokens("mt_bench", 24)
