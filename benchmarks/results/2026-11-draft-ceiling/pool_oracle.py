"""What LogitSpec's candidate pool held against what its tree accepted, step by step.

    .venv/bin/python benchmarks/results/2026-11-draft-ceiling/pool_oracle.py

SmolLM2-135M on the default path, first turns of Spec-Bench questions 11-14 of every category (held out from
what is reported), 128 new tokens, greedy, `logitspec` with default options and no floor (every step drafts as
the planner sizes it). Per step: the drafts accepted, and how deep the emitted tokens run along the pool's trie
(every candidate node the planner weighed, `LogitSpecProposer.last_pool`): the tokens a tree could have accepted
had it held the right path, the bonus token included. For steps that accepted nothing although the pool held
the next token: that node's source, its place in the planner's order, and (next-next candidates) its rank among
the root's top-k. A diagnostic tied to the proposer's internals (`_last`, `last_pool`).
"""

import collections
import os
import sys

sys.path.insert(0, "src")
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
from step_pieces import held_out_prompts  # noqa: E402

from specdec.engine.generation import GenerationConfig  # noqa: E402
from specdec.engine.loop import Engine  # noqa: E402
from specdec.models import load_model  # noqa: E402
from specdec.proposers import parse_method  # noqa: E402
from specdec.proposers.logitspec.plan import ROOT  # noqa: E402

counts: collections.Counter = collections.Counter()
table: collections.Counter = collections.Counter()  # (accepted, pool depth), both capped at 4
missed: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)


class Wrapped:
    """A proposer seen through a wrapper (left as built): what the wrapper does not define is the proposer's."""

    def __init__(self, inner) -> None:  # noqa: ANN001 - a LogitSpecProposer
        self.inner = inner

    def __getattr__(self, name: str):  # noqa: ANN204
        return getattr(self.inner, name)


class Watched(Wrapped):
    """The proposer, with each step's pool and retrieval kept for `observe`."""

    def propose(self, ctx):  # noqa: ANN001, ANN201
        tree = self.inner.propose(ctx)
        step = self.inner._last
        self.pool, self.retrieval, self.nodes = self.inner.last_pool, step and step.retrieval, tree.num_nodes
        return tree

    def observe(self, result) -> None:  # noqa: ANN001
        if self.pool is not None:
            score(self.pool, self.retrieval, self.nodes, result)
        self.inner.observe(result)


def score(pool, retrieval, nodes: int, result) -> None:  # noqa: ANN001
    probs = pool.exclusive_probs()
    place = {node: i + 1 for i, node in enumerate(sorted(range(1, len(probs)), key=lambda i: (-probs[i], i)))}
    node = depth = 0
    for token in result.tokens:
        child = pool.child(node, token)
        if child < 0:
            break
        node, depth = child, depth + 1
    accepted = result.num_accepted
    counts.update(steps=1, accepted=accepted, depth=depth, nodes=nodes, pool=len(pool))
    table[min(accepted, 4), min(depth, 4)] += 1
    if accepted == 0 and depth:
        first = pool.child(ROOT, result.tokens[0])
        missed["source"][pool.sources[first]] += 1
        missed["place"][min(place[first] - 1, 40) // 5 * 5] += 1
        if pool.sources[first] == "cand" and retrieval is not None and result.tokens[0] in retrieval.cand_tokens:
            rank = retrieval.cand_ranks[retrieval.cand_tokens.index(result.tokens[0])]
            missed["rank"][max(rank, -1) // 5 * 5] += 1


def main() -> None:
    loaded = load_model("smollm2-135m")
    engine = Engine(loaded)
    for prompt in held_out_prompts(loaded, last=14):
        engine.generate(prompt, Watched(parse_method("logitspec").build(loaded)), GenerationConfig(max_new_tokens=128))
    steps = counts["steps"]
    print(f"{steps} steps: accepted {counts['accepted'] / steps:.2f} a step (tree {counts['nodes'] / steps:.1f} nodes); "
          f"the pool's trie held {counts['depth'] / steps:.2f} of the emitted tokens a step (pool {counts['pool'] / steps:.1f} nodes)")
    print("steps by accepted (rows) and pool depth (columns), both capped at 4:")
    for accepted in range(5):
        print(f"  {accepted}: " + " ".join(f"{table[accepted, depth]:5d}" for depth in range(5)))
    for name, what in (("source", "the missed next token's source"), ("place", "its place in the planner's order, from 0"),
                       ("rank", "a missed candidate's rank among the root's top-k, from 0")):  # fmt: skip
        print(f"steps that accepted nothing though the pool held the next token, by {what}: "
              + ", ".join(f"{key}: {value}" for key, value in sorted(missed[name].items())))


if __name__ == "__main__":
    main()
