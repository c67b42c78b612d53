"""Acceptance decided on the device and read back once (`specdec.engine.decide`), run on CPU tensors.

An accelerator decides every node at once (argmax, the target's draw, a chain's tests and
final tokens) and brings a step's decisions back in one transfer, for one row (`accept`'s
one_transfer) or every row of a batched step (`verify`). These tests run that path on the
CPU, where the engine walks row by row, and check that it walks as the CPU does with the
same seed (path, tokens and uniforms spent), so it inherits the CPU rules' exact
distribution checks; speculative sampling's chain is also checked by distribution on its
own, with a broken variant that the same check catches.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from distribution import CHAIN, PARAMS_A, PARAMS_B, PLAIN, SCENARIOS, TREE, Scenario, check
from helpers import tiny_llama

from specdec.backends.registry import top_tokens
from specdec.backends.torch.rows import BatchedTarget
from specdec.backends.torch.target import TargetModel
from specdec.engine.accept import Acceptance, accept, accept_decided, decide, point_mass_rows
from specdec.engine.decide import rejection_outcomes, walk_rejections
from specdec.engine.uniforms import PositionUniforms, draw_rows
from specdec.engine.verify import Draws, verify
from specdec.sampling import SamplingParams
from specdec.tree import DraftTree


def _random_chain(data: torch.Generator, max_nodes: int, vocab_size: int) -> tuple[DraftTree, torch.Tensor]:
    """A chain with draft rows (top-k-like zeros in some) and target logits over a small vocabulary, its
    draft tokens often the target's likely ones, so walks go deep."""
    num_nodes = int(torch.randint(1, max_nodes + 1, (1,), generator=data))
    logits = 2 * torch.randn(num_nodes, vocab_size, generator=data)
    parents = torch.cat([logits[:1], logits[:-1]])  # draft row c guesses what target row c - 1 gives
    draft = (parents + 0.5 * torch.randn(num_nodes, vocab_size, generator=data)).softmax(-1)
    if int(torch.randint(0, 2, (1,), generator=data)):
        draft = draft * (draft >= draft.topk(2, -1).values[:, -1:])  # zeros in the draft rows
        draft = draft / draft.sum(-1, keepdim=True)
    tokens = [int(torch.multinomial(draft[i], 1, generator=data)) for i in range(num_nodes)]
    return DraftTree.chain(tokens[0], tokens[1:], draft), logits


SETTINGS = [PLAIN, PARAMS_A, PARAMS_B, SamplingParams(temperature=0.5, top_k=1)]  # zero-mass residuals in the last


def _walked_both_ways(tree: DraftTree, logits: torch.Tensor, case: int, rule: str) -> Acceptance:
    """The acceptance decided at once and walked on the CPU, seeded alike: the same path and tokens, and the
    same uniforms spent (positions moved alike, the generator left in the same state)."""
    results = []
    for one_transfer in (True, False):
        generator = torch.Generator().manual_seed(case)
        positions = PositionUniforms(generator)
        params = SETTINGS[case % len(SETTINGS)]
        result = accept(tree, logits, params, generator, positions, rule, one_transfer=one_transfer)
        results.append((result, positions.position, float(torch.rand(1, generator=generator))))
    assert results[0] == results[1]
    return results[0][0]


@pytest.mark.parametrize("rule", ["specinfer", "spectr"])
def test_chain_in_one_transfer_walks_as_the_cpu_path(rule: str) -> None:
    """Speculative sampling's chain decided at once: the rejection walk's path, tokens and uniforms spent,
    over 300 random chains with temperature, top-k and top-p (residuals of zero mass included)."""
    data = torch.Generator().manual_seed(5)
    deep = full = 0
    for case in range(300):
        chain, logits = _random_chain(data, 7, 6)
        accepted = _walked_both_ways(chain, logits, case, rule).num_accepted
        deep += accepted > 1
        full += accepted == chain.num_nodes - 1 > 0
    print(f"{deep} walks past two drafts, {full} whole chains")
    assert deep > 30 and full > 30  # deep walks, and whole chains ending in a bonus token


def _random_tree(data: torch.Generator, max_nodes: int, vocab_size: int) -> tuple[DraftTree, torch.Tensor]:
    """A tree of drawn siblings (each node below a random earlier one, drawn from its own draft row, so
    duplicate siblings happen) with some point-mass guesses among them, as the hybrid's trees have."""
    num_nodes = int(torch.randint(2, max_nodes + 1, (1,), generator=data))
    parents = [-1] + [int(torch.randint(0, node, (1,), generator=data)) for node in range(1, num_nodes)]
    logits = 2 * torch.randn(num_nodes, vocab_size, generator=data)
    guess = logits[[max(parent, 0) for parent in parents]]  # draft row c guesses what its parent's row gives
    draft = (guess + 0.5 * torch.randn(num_nodes, vocab_size, generator=data)).softmax(-1)
    tokens = torch.tensor([int(torch.multinomial(draft[i], 1, generator=data)) for i in range(num_nodes)])
    fixed = torch.rand(num_nodes, generator=data) < 0.2
    draft[fixed] = point_mass_rows(tokens[fixed], vocab_size)
    return DraftTree(tokens, torch.tensor(parents), draft), logits


def test_siblings_in_one_transfer_walk_as_the_cpu_path() -> None:
    """SpecInfer's drawn siblings decided at once, every node's residuals a sibling rank at a time: the
    rejection walk's path, tokens and uniforms spent, over 300 random trees (duplicate siblings, whose
    expanded twin the walk descends into, and point-mass guesses among them)."""
    data = torch.Generator().manual_seed(6)
    later_sibling = deep = 0
    for case in range(300):
        tree, logits = _random_tree(data, 9, 6)
        path = _walked_both_ways(tree, logits, case, "specinfer").path
        deep += len(path) > 2
        later_sibling += any(tree.children[a].index(b) > 0 for a, b in zip(path, path[1:], strict=False))
    print(f"{deep} walks past two drafts, {later_sibling} through a parent's later child")
    assert deep > 30 and later_sibling > 30


def test_walk_rejections_takes_the_first_child_that_passed() -> None:
    chain = DraftTree.chain(5, [1, 2, 3])
    assert walk_rejections(chain, [1, 0, 1, 10, 11, 12, 13]) == ([0, 1], 11)
    assert walk_rejections(chain, [1, 1, 1, 10, 11, 12, 13]) == ([0, 1, 2, 3], 13)  # the bonus
    assert walk_rejections(chain, [0, 1, 1, 10, 11, 12, 13]) == ([0], 10)
    assert walk_rejections(DraftTree.chain(5), [10]) == ([0], 10)
    # root -> {1: token 7, 2: token 8, 3: token 7 -> 4}: passing node 3 or its twin 1 descends into 3
    tree = DraftTree(torch.tensor([5, 7, 8, 7, 9]), torch.tensor([-1, 0, 0, 0, 3]))
    assert walk_rejections(tree, [0, 1, 1, 0, 20, 21, 22, 23, 24]) == ([0, 2], 22)
    assert walk_rejections(tree, [1, 0, 0, 1, 20, 21, 22, 23, 24]) == ([0, 3, 4], 24)
    assert walk_rejections(tree, [0, 0, 0, 0, 20, 21, 22, 23, 24]) == ([0], 20)


def _one_transfer_rule(tree: DraftTree, probs: torch.Tensor, generator: torch.Generator) -> Acceptance:
    """The device rule as a distribution check's rule (target rows given as probabilities)."""
    return accept_decided(tree, rejection_outcomes(tree, probs.log(), PLAIN, generator).tolist(), PLAIN)


def _bonus_everywhere(tree: DraftTree, probs: torch.Tensor, generator: torch.Generator) -> Acceptance:
    """Broken: a chain's final token is always the last node's bonus draw, whatever the walk rejected."""
    values = rejection_outcomes(tree, probs.log(), PLAIN, generator).tolist()
    values[tree.num_nodes - 1 :] = [values[-1]] * tree.num_nodes
    return accept_decided(tree, values, PLAIN)


def _target_after_rejections(tree: DraftTree, probs: torch.Tensor, generator: torch.Generator) -> Acceptance:
    """Broken: the final token after rejected siblings is drawn from the target row, not the residual."""
    values = rejection_outcomes(tree, probs.log(), PLAIN, generator).tolist()
    uniform = torch.rand(1, generator=generator, dtype=torch.float64)
    values[tree.num_nodes - 1 :] = draw_rows(probs, uniform.expand(tree.num_nodes)).tolist()
    return accept_decided(tree, values, PLAIN)


@pytest.mark.parametrize("rule, lossless", [(_one_transfer_rule, True), (_bonus_everywhere, False)],
                         ids=["one-transfer", "broken"])
def test_chain_in_one_transfer_keeps_the_target_distribution(rule, lossless: bool) -> None:
    """Seeded steps of 1-3 drawn drafts on the order-2 Markov models: within the sampling bound of the
    target's distribution of the first and first two tokens; the broken variant beyond it."""
    seed, _ = SCENARIOS["speculative-chain"]
    scenario = Scenario(CHAIN, rule, PLAIN, random_size=True)
    (tv_first, bound_first), (tv_two, bound_two) = check(scenario, seed, num_trials=20_000)
    print(f"TV first {tv_first:.4f} (bound {bound_first:.4f}), first two {tv_two:.4f} (bound {bound_two:.4f})")
    assert (tv_first < bound_first and tv_two < bound_two) == lossless


@pytest.mark.parametrize("rule, lossless", [(_one_transfer_rule, True), (_target_after_rejections, False)],
                         ids=["one-transfer", "broken"])
def test_siblings_in_one_transfer_keep_the_target_distribution(rule, lossless: bool) -> None:
    """Drawn siblings at two levels (top-k, top-p: zeros in both rows), decided at once: within the sampling
    bound of the target's first and first two tokens; drawing after rejections from the target row, beyond."""
    seed, _ = SCENARIOS["multi-draft-tree"]
    scenario = Scenario(TREE, rule, PARAMS_A)
    (tv_first, bound_first), (tv_two, bound_two) = check(scenario, seed, num_trials=20_000)
    print(f"TV first {tv_first:.4f} (bound {bound_first:.4f}), first two {tv_two:.4f} (bound {bound_two:.4f})")
    assert (tv_first < bound_first and tv_two < bound_two) == lossless


def test_spectr_trees_are_left_to_the_walk() -> None:
    """SpecTr selects a run of i.i.d. siblings on the host: its trees walk node by node, drawing nothing
    before; SpecInfer's same tree is decided at once, as is a chain under either rule."""
    tree = DraftTree.from_branches(1, [[2], [3]])
    drafted = DraftTree(tree.tokens, tree.parents, torch.full((3, 6), 1 / 6))
    generator = torch.Generator().manual_seed(0)
    assert decide(drafted, torch.zeros(3, 6), PLAIN, generator, multi_draft="spectr") is None
    assert torch.equal(generator.get_state(), torch.Generator().manual_seed(0).get_state())  # nothing drawn
    assert decide(drafted, torch.zeros(3, 6), PLAIN, generator).shape == (5,)
    chain = DraftTree.chain(1, [2, 3], torch.full((3, 6), 1 / 6))
    assert decide(chain, torch.zeros(3, 6), PLAIN, generator, multi_draft="spectr").shape == (5,)


def _rows(model: torch.nn.Module, prompts: list[list[int]]) -> BatchedTarget:
    rows = BatchedTarget(TargetModel(model))
    for prompt in prompts:
        rows.add(prompt)
    return rows


def _step_trees(step: int, vocab: int) -> list[DraftTree]:
    """Row 0 greedy, 1 deterministic drafts sampled, 2 a drawn chain, 3 drawn siblings."""
    data = torch.Generator().manual_seed(step)
    draft = torch.randn(4, vocab, generator=data).softmax(-1)
    tokens = torch.randint(0, vocab, (6,), generator=data).tolist()
    siblings = DraftTree.from_branches(tokens[0], [[tokens[1]], [tokens[2]]])
    return [
        DraftTree.from_branches(tokens[0], [[tokens[1], tokens[2]], [tokens[3]]]),
        DraftTree.chain(tokens[4], tokens[:3]),
        DraftTree.chain(tokens[5], tokens[1:4], draft),
        DraftTree(siblings.tokens, siblings.parents, draft[:3]),
    ]


def test_a_batched_step_in_one_transfer_verifies_as_row_by_row() -> None:
    """`verify` over four rows of four rules on a real (tiny, random) model: reading every row's decisions
    back at once gives each row what its own walk gives (tokens, path, uniforms spent), step after step.
    Either way each row's top ids at every node come with its result: in the same transfer, or read once
    after the pass."""
    model = tiny_llama()
    vocab = model.config.vocab_size
    prompts = [[1, 2, 3, 4], [5, 6, 7], [8, 9, 10, 11, 12], [13, 14]]
    params = [SamplingParams(), SamplingParams(temperature=0.9, top_p=0.95), SamplingParams(temperature=1.0),
              SamplingParams(temperature=0.8, top_k=50)]
    outcomes, tops = [], [5, 0, 3, 2]  # the top ids each row's proposer would read, row 1's none
    for one_transfer in (True, False):
        rows = _rows(model, prompts)
        generators = [torch.Generator().manual_seed(row) for row in range(4)]
        draws = [Draws(p, g, PositionUniforms(g)) for p, g in zip(params, generators, strict=True)]
        steps = []
        for step in range(4):
            results = verify(rows, _step_trees(step, vocab), draws, one_transfer=one_transfer, tops=tops)
            steps.append([(result.tokens, result.path) for result in results])
            for result, k in zip(results, tops, strict=True):  # read where a row's proposer wants them
                if k:
                    assert np.array_equal(result.tops, top_tokens(result.target_logits, k).numpy())
                    assert result.next_top == top_tokens(result.next_logits, k).tolist()
                else:
                    assert result.tops is None and result.next_top is None
        outcomes.append((steps, [draw.positions.position for draw in draws], [g.get_state() for g in generators]))
    (steps, spent, states), (want_steps, want_spent, want_states) = outcomes
    assert steps == want_steps and spent == want_spent
    assert all(torch.equal(a, b) for a, b in zip(states, want_states, strict=True))


def test_a_cpu_step_reads_top_ids_only_for_proposers_that_read_every_node() -> None:
    """On the CPU a row's top ids are read after the pass only where its proposer reads them at every node
    (`every_node`, the recycle table's rows); a proposer reading a few rows reads them itself."""
    model = tiny_llama()
    rows = _rows(model, [[1, 2, 3, 4], [5, 6, 7]])
    draws = [Draws(SamplingParams(), None, PositionUniforms(None)) for _ in range(2)]
    trees = _step_trees(0, model.config.vocab_size)[:2]
    first, second = verify(rows, trees, draws, one_transfer=False, tops=[4, 4], every_node=[False, True])
    assert first.tops is None and first.next_top is None
    assert np.array_equal(second.tops, top_tokens(second.target_logits, 4).numpy())


@pytest.mark.parametrize("rule", ["specinfer", "spectr"])
def test_drawn_trees_decode_as_the_cpu_walk(default_model, rule: str) -> None:
    """`eagle:sampled=true` draws each tree from the head (`topk` siblings below a level's likeliest nodes)
    and verifies it by rejection sampling: over a seeded generation on the bundled model, deciding every
    node at once (SpecInfer's rule; SpecTr's trees are left to the walk) emits the CPU walk's tokens and
    takes the same steps."""
    from specdec.engine.generation import GenerationConfig
    from specdec.engine.loop import Engine
    from specdec.prompts import encode_prompt
    from specdec.proposers import parse_method

    prompt = encode_prompt(default_model.tokenizer, "Name three rivers and one fact about each.", chat=True)
    config = GenerationConfig(24, SamplingParams(temperature=0.9, seed=3), ignore_eos=True)
    method = parse_method(f"eagle:sampled=true,accept={rule},adaptive=false")
    runs = []
    for one_transfer in (True, False):
        out = Engine(default_model, one_transfer=one_transfer).generate(prompt, method.build(default_model), config)
        runs.append((out.token_ids, [(s.tree_size, s.num_accepted) for s in out.stats.steps]))
    assert runs[0] == runs[1]
    assert sum(size > 2 for size, _ in runs[0][1]) > 5  # it drew trees
