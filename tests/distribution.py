"""The models and scenarios every acceptance rule's distribution test uses (tests/test_sampling.py, tests/test_spectr.py).

A tiny "target model" and "draft model" are random order-2 Markov tables over a small vocabulary
(the distribution of the next token depends on the last two tokens), so a target distribution is
defined after *every* prefix, in the tree or not. `SCENARIOS` are the trees and settings the rules
are checked on: exactly, by enumeration (tests/exact.py), and `check` runs seeded steps through the
rules' own random numbers and compares the empirical distribution of the first emitted token, and of
the first two, with the target's (`helpers.tv_bound`). See tests/exact.py for why the two-token check
measures what a step adds.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from helpers import total_variation, tv_bound

from specdec.engine.accept import (
    Acceptance,
    accept_deterministic,
    accept_multi_draft,
    accept_speculative_chain,
    point_mass_rows,
)
from specdec.engine.uniforms import Chance, PositionUniforms
from specdec.sampling import SamplingParams, logits_to_probs
from specdec.tree import DraftTree

VOCAB = 8
NUM_TRIALS = 100_000
CONTEXT, ROOT = 3, 5  # the token before the root, and the root (already decided)


# ------------------------------------------------------------ reference filter
def reference_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Independent, row-by-row reference for logits_to_probs (float64). logits: [..., V]."""
    flat = logits.double().reshape(-1, logits.shape[-1])
    out = torch.zeros_like(flat)
    for row, values in zip(out, flat.tolist(), strict=True):
        if params.greedy:
            row[max(range(len(values)), key=lambda i: (values[i], -i))] = 1.0
            continue
        scaled = [v / params.temperature for v in values]
        order = sorted(range(len(scaled)), key=lambda i: -scaled[i])
        keep = order  # top-k keeps every token at least as likely as the k-th
        if 0 < params.top_k < len(order):
            keep = [i for i in order if scaled[i] >= scaled[order[params.top_k - 1]]]
        weights = [math.exp(scaled[i] - scaled[order[0]]) for i in keep]
        total, mass, kept = sum(weights), 0.0, []
        for i, w in zip(keep, weights, strict=True):
            if mass >= params.top_p:  # the tokens before already reach top_p
                break
            kept.append(i)
            mass += w / total
        norm = sum(weights[keep.index(i)] for i in kept)
        for i in kept:
            row[i] = weights[keep.index(i)] / norm
    return out.reshape(logits.shape)


# ------------------------------------------------------------------ the models
@dataclass
class Models:
    """Order-2 Markov target and draft models: table[a, b] = next-token row after (..., a, b)."""

    params: SamplingParams  # applied to both models (the draft samples with the same settings)
    target_logits: torch.Tensor  # [V, V, V]
    target_table: torch.Tensor  # [V, V, V] float64: the truth, from the independent reference
    draft_table: torch.Tensor  # [V, V, V] float32: what drafts are drawn from

    @classmethod
    def make(cls, seed: int, params: SamplingParams, vocab: int = VOCAB) -> Models:
        gen = torch.Generator().manual_seed(seed)
        target_logits = 1.5 * torch.randn(vocab, vocab, vocab, generator=gen)
        # Correlated with the target (drafts get accepted, often several in a row) but clearly off.
        draft_logits = 0.7 * target_logits + torch.randn(vocab, vocab, vocab, generator=gen)
        draft_table = reference_probs(draft_logits, params).float()
        return cls(params, target_logits, reference_probs(target_logits, params), draft_table)

    def truth(self) -> tuple[torch.Tensor, torch.Tensor]:
        """([V] first-token probs, [V * V] first-two-token probs) after (CONTEXT, ROOT)."""
        first = self.target_table[CONTEXT, ROOT]
        return first, (first[:, None] * self.target_table[ROOT]).flatten()


# Rule under test: (tree, target_probs [N, V], a generator or a Chance) -> Acceptance
Rule = Callable[[DraftTree, torch.Tensor, "torch.Generator | Chance"], Acceptance]


@dataclass
class Scenario:
    parents: list[int]  # tree shape, node 0 = ROOT
    rule: Rule
    params: SamplingParams
    fixed_tokens: list[int] | None = None  # deterministic drafts; None: drawn from the draft model
    fixed_nodes: dict[int, int] | None = None  # mixed tree: these nodes are fixed guesses, the rest drawn
    random_size: bool = False  # keep only the first 2..N nodes, at random (a chain of random length)
    by_position: bool = False  # deterministic drafts drawn with their output positions' uniforms
    vocab: int = VOCAB

    def models(self, seed: int) -> Models:
        return Models.make(seed, self.params, self.vocab)


def draw_drafts(scenario: Scenario, models: Models, num_trials: int, gen: torch.Generator) -> torch.Tensor:
    """[n, N] tokens of every trial's tree; each drafted node is drawn given its own path."""
    num_nodes = len(scenario.parents)
    if scenario.fixed_tokens is not None:
        return torch.tensor(scenario.fixed_tokens).expand(num_trials, num_nodes)
    tokens = torch.full((num_trials, num_nodes), ROOT, dtype=torch.int64)
    fixed = scenario.fixed_nodes or {}
    for node in range(1, num_nodes):
        parent = scenario.parents[node]
        if node in fixed:
            tokens[:, node] = fixed[node]
            continue
        before = tokens[:, scenario.parents[parent]] if parent > 0 else torch.full((num_trials,), CONTEXT)
        rows = models.draft_table[before, tokens[:, parent]]  # [n, V]
        tokens[:, node] = torch.multinomial(rows, 1, generator=gen).squeeze(1)
    return tokens


def build_step(scenario: Scenario, models: Models, tokens: list[int]) -> tuple[DraftTree, torch.Tensor]:
    """One trial's tree and its target_probs [N, V] (made by the real logits_to_probs)."""
    tokens_t = torch.tensor(tokens, dtype=torch.int64)
    parents = scenario.parents[: len(tokens)]
    prev = torch.tensor([CONTEXT] + [tokens[p] for p in parents[1:]])  # [N] the token before each node
    target_probs = logits_to_probs(models.target_logits[prev, tokens_t], scenario.params)
    draft_probs = None
    if scenario.fixed_tokens is None:  # row i: the distribution node i was drawn from (row 0 unused)
        draft_probs = models.draft_table[prev, tokens_t][[0, *parents[1:]]]
        for node in scenario.fixed_nodes or {}:  # a fixed guess drafts with all mass on its token
            draft_probs[node] = point_mass_rows(tokens_t[node : node + 1], scenario.vocab)[0]
    return DraftTree(tokens_t, torch.tensor(parents, dtype=torch.int64), draft_probs), target_probs


def run_trials(
    scenario: Scenario, models: Models, num_trials: int = NUM_TRIALS, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """([n] first emitted tokens, [n] first-two outcome ids x1 * V + x2) over n independent steps."""
    gen = torch.Generator().manual_seed(seed)
    keys = draw_drafts(scenario, models, num_trials, gen).tolist()
    if scenario.random_size:  # the proposer's choice of size is independent of the draws: still lossless
        sizes = torch.randint(2, len(scenario.parents) + 1, (num_trials,), generator=gen).tolist()
        keys = [key[:size] for key, size in zip(keys, sizes, strict=True)]
    rule_gen = torch.Generator().manual_seed(seed + 1)
    steps: dict[tuple[int, ...], tuple[DraftTree, torch.Tensor]] = {}  # each distinct tree built once
    first, second = [0] * num_trials, [-1] * num_trials
    for trial, key in enumerate(map(tuple, keys)):
        step = steps.get(key)
        if step is None:
            step = steps[key] = build_step(scenario, models, list(key))
        chance = Chance.by_output_position(PositionUniforms(rule_gen)) if scenario.by_position else rule_gen
        emitted = scenario.rule(step[0], step[1], chance).tokens
        first[trial] = emitted[0]
        if len(emitted) > 1:
            second[trial] = emitted[1]
    first_t, second_t = torch.tensor(first), torch.tensor(second)
    alone = second_t < 0  # one token emitted: the next step would draw the second from the target
    rows = models.target_table[ROOT, first_t[alone]]  # [m, V]
    second_t[alone] = torch.multinomial(rows, 1, generator=gen).squeeze(1)
    return first_t, first_t * models.target_table.shape[-1] + second_t


def check(
    scenario: Scenario, seed: int, num_trials: int = NUM_TRIALS
) -> tuple[tuple[float, float], tuple[float, float]]:
    """((TV, bound) of the first token, (TV, bound) of the first two tokens)."""
    models = scenario.models(seed)
    first, two = run_trials(scenario, models, num_trials, seed=seed)
    true_first, true_two = models.truth()
    return (
        (total_variation(first, true_first), tv_bound(true_first, num_trials)),
        (total_variation(two, true_two), tv_bound(true_two, num_trials)),
    )


def assert_check(name: str, scenario: Scenario, seed: int, *, lossless: bool, num_trials: int = NUM_TRIALS) -> None:
    """`check`, then both TVs within the bound (a lossless rule) or both beyond it (a broken one)."""
    (tv_first, bound_first), (tv_two, bound_two) = check(scenario, seed, num_trials)
    sign = "<" if lossless else ">"
    print(f"{name}: TV first {tv_first:.4f} {sign} {bound_first:.4f}, first two {tv_two:.4f} {sign} {bound_two:.4f}")
    assert (tv_first < bound_first, tv_two < bound_two) == (lossless, lossless)


# ------------------------------------------------------------------ the rules
PLAIN = SamplingParams(temperature=1.0)
PARAMS_A = SamplingParams(temperature=0.7, top_k=5, top_p=0.9)
PARAMS_B = SamplingParams(temperature=1.3, top_p=0.8)
CHAIN = [-1, 0, 1, 2]
TREE = [-1, 0, 0, 0, 1, 1]  # siblings at two levels: root -> {1, 2, 3}, 1 -> {4, 5}; duplicates happen


def _retrieval_tree(seed: int, params: SamplingParams) -> tuple[list[int], list[int]]:
    """A fixed tree below ROOT along the target's likely tokens (deep walks happen), siblings at
    two levels, plus a duplicate sibling (not a trie: still lossless, only wasteful)."""
    table = Models.make(seed, params).target_table
    top = table[CONTEXT, ROOT].argsort(descending=True).tolist()
    nxt = table[ROOT, top[0]].argsort(descending=True).tolist()
    third = int(table[top[0], nxt[0]].argmax())
    tree = DraftTree.from_branches(ROOT, [[top[0], nxt[0], third], [top[0], nxt[1]], [top[1]], [top[2], 0]])
    assert tree.parent_list == [-1, 0, 1, 2, 1, 0, 0, 6]
    return [*tree.parent_list, 0], [*tree.token_list, top[1]]  # node 8 duplicates node 5


RETRIEVAL_PARENTS, RETRIEVAL_TOKENS = _retrieval_tree(11, PARAMS_B)


def _mixed_guesses(seed: int, params: SamplingParams) -> dict[int, int]:
    """Fixed guesses for nodes 1 (the target's likeliest first token) and 4 (its likeliest successor)
    of TREE; nodes 2, 3 (siblings of the guess) and 5 (below it) are drawn from the draft model."""
    table = Models.make(seed, params).target_table
    first = int(table[CONTEXT, ROOT].argmax())
    return {1: first, 4: int(table[ROOT, first].argmax())}


MIXED_GUESSES = _mixed_guesses(14, PLAIN)
SCENARIOS = {
    # deterministic drafts (retrieval), temperature + top-p
    "deterministic-tree": (11, Scenario(RETRIEVAL_PARENTS, accept_deterministic, PARAMS_B, RETRIEVAL_TOKENS)),
    # the same, with uniforms by output position
    "deterministic-by-position": (
        11, Scenario(RETRIEVAL_PARENTS, accept_deterministic, PARAMS_B, RETRIEVAL_TOKENS, by_position=True)
    ),
    # a drafted chain, plain temperature-1 distributions
    # (1 to 3 drafts: the bonus token after a fully accepted chain is the 2nd token for 1 draft)
    "speculative-chain": (12, Scenario(CHAIN, accept_speculative_chain, PLAIN, random_size=True)),
    # a drafted tree with siblings, temperature + top-k + top-p (zeros in both target and draft rows)
    "multi-draft-tree": (13, Scenario(TREE, accept_multi_draft, PARAMS_A)),
    # retrieval guesses (point-mass rows) and drawn drafts as siblings in one tree (the hybrid's tree)
    "mixed-tree": (14, Scenario(TREE, accept_multi_draft, PLAIN, fixed_nodes=MIXED_GUESSES)),
}
