"""Exact output distributions of the acceptance rules: every random choice enumerated with its probability.

Why: a sampled check (100k steps a rule) bounds a rule's error only to ~1e-2 in total
variation and takes seconds to tens of seconds. Every random choice a rule makes goes
through `specdec.engine.uniforms.Chance`: a test passed with probability a / b, or a token
drawn from a row, each with the uniform of its key. `Enumerated` is a Chance that makes
every choice both ways: `enumerate_outcomes` runs a trial again for each sequence of
choices (depth first: a prefix of choices replayed, the first option taken after it) and
sums each outcome's probability. The drafts themselves are drawn through it too, so a
scenario's whole step, drafts and rule, is enumerated exactly.

A key's uniform is tracked as the interval it is known to lie in: a second choice with
the same key (a rule that reuses a uniform) splits that interval, so a reused uniform is
enumerated exactly, not assumed independent. The result is exact up to float rounding
(the rules' rows are float32): a lossless rule's total variation from the truth is ~1e-7,
a broken one's ~1e-2 and more.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Hashable

import torch
from distribution import CONTEXT, ROOT, Models, Scenario, build_step

from specdec.engine.uniforms import Chance

LOSSLESS_TV = 1e-5  # float32 rows and RESIDUAL_EPS leave ~1e-7-1e-6; the broken rules are 1e-2 and more


class Enumerated(Chance):
    """A Chance that replays `prefix` (the option taken at each choice), then takes option 0."""

    def __init__(self, prefix: list[int], by_position: bool = False) -> None:
        self.prefix, self.by_position = prefix, by_position
        self.made: list[tuple[int, int]] = []  # (option taken, number of options) per choice
        self.probability = 1.0
        self.known: dict[Hashable, tuple[float, float]] = {}  # key -> interval its uniform lies in

    def _choose(self, key: Hashable, cuts: list[float]) -> int:
        """The cell [cuts[i], cuts[i + 1]) the key's uniform falls in; cuts run from 0 to 1."""
        low, high = self.known.get(key, (0.0, 1.0))
        cells = [
            (i, max(low, cuts[i]), min(high, cuts[i + 1]))
            for i in range(len(cuts) - 1)
            if min(high, cuts[i + 1]) > max(low, cuts[i])
        ]
        depth = len(self.made)
        pick = self.prefix[depth] if depth < len(self.prefix) else 0
        self.made.append((pick, len(cells)))
        index, start, end = cells[pick]
        self.probability *= (end - start) / (high - low)
        self.known[key] = (start, end)
        return index

    def below(self, key: Hashable, a: float, b: float) -> bool:
        threshold = min(1.0, a / b) if b > 0 else float(a > 0)  # u * b < a  <=>  u < a / b
        return self._choose(key, [0.0, max(threshold, 0.0), 1.0]) == 0

    def draw(self, key: Hashable, probs: torch.Tensor) -> int:
        cdf = probs.double().cumsum(0)
        cuts = [0.0, *(cdf / cdf[-1]).tolist()]
        cuts[-1] = 1.0
        return self._choose(key, cuts)


def enumerate_outcomes(trial: Callable[[Enumerated], Hashable], by_position: bool = False) -> dict[Hashable, float]:
    """outcome -> probability, over every sequence of choices `trial` can make (they sum to 1)."""
    totals: dict[Hashable, float] = defaultdict(float)
    stack: list[list[int]] = [[]]
    while stack:
        prefix = stack.pop()
        chance = Enumerated(prefix, by_position)
        totals[trial(chance)] += chance.probability
        taken = [pick for pick, _ in chance.made]
        for depth in range(len(prefix), len(chance.made)):
            stack.extend(taken[:depth] + [other] for other in range(1, chance.made[depth][1]))
    assert abs(sum(totals.values()) - 1.0) < 1e-9
    return dict(totals)


def _drafts(scenario: Scenario, models: Models, chance: Enumerated) -> tuple[int, ...]:
    """One step's draft tokens, each drafted node drawn (key -node) from the draft model given its path."""
    parents, fixed = scenario.parents, scenario.fixed_nodes or {}
    if scenario.fixed_tokens is not None:
        return tuple(scenario.fixed_tokens)
    size = len(parents)
    if scenario.random_size:  # 2..N nodes, uniformly, independent of the draws
        size = 2 + chance.draw(-len(parents), torch.ones(len(parents) - 1))
    tokens = [ROOT]
    for node in range(1, size):
        parent = parents[node]
        if node in fixed:
            tokens.append(fixed[node])
            continue
        before = tokens[parents[parent]] if parent > 0 else CONTEXT
        tokens.append(chance.draw(-node, models.draft_table[before, tokens[parent]]))
    return tuple(tokens)


def exact_distributions(scenario: Scenario, seed: int) -> tuple[float, float]:
    """(TV of the first emitted token, TV of the first two) from the target's own, exactly.

    When a step emits one token, the second is the target's given it (what any lossless next
    step emits), so the two-token check measures what the step under test adds.
    """
    models = scenario.models(seed)
    steps: dict[tuple[int, ...], tuple] = {}  # each distinct tree and its target rows built once

    def trial(chance: Enumerated) -> tuple[int, ...]:
        tokens = _drafts(scenario, models, chance)
        step = steps.get(tokens)
        if step is None:
            step = steps[tokens] = build_step(scenario, models, list(tokens))
        return tuple(scenario.rule(step[0], step[1], chance).tokens[:2])

    vocab = models.target_table.shape[-1]
    first, two = torch.zeros(vocab, dtype=torch.float64), torch.zeros(vocab, vocab, dtype=torch.float64)
    for emitted, probability in enumerate_outcomes(trial, scenario.by_position).items():
        first[emitted[0]] += probability
        if len(emitted) > 1:
            two[emitted] += probability
        else:
            two[emitted[0]] += probability * models.target_table[ROOT, emitted[0]]
    true_first, true_two = models.truth()
    return 0.5 * float((first - true_first).abs().sum()), 0.5 * float((two.flatten() - true_two).abs().sum())


def assert_exact(name: str, scenario: Scenario, seed: int, *, lossless: bool) -> None:
    """Both TVs within float rounding of 0 (a lossless rule) or both clearly off (a broken one)."""
    tv_first, tv_two = exact_distributions(scenario, seed)
    print(f"{name}: exact TV first {tv_first:.2e}, first two {tv_two:.2e}")
    if lossless:
        assert tv_first < LOSSLESS_TV and tv_two < LOSSLESS_TV
    else:
        assert tv_first > 100 * LOSSLESS_TV and tv_two > 100 * LOSSLESS_TV
