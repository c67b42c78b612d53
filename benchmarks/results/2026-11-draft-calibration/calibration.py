"""LogitSpec's planner calibration: the tokens a tree was expected to add (the sum of its nodes' probabilities, as
the planner weighed them) against those accepted, by tree size and by each node's source, on held-out turns
(Spec-Bench questions 11-16 of each category), floor on as in the product (NOFLOOR=1: off).

    .venv/bin/python calibration.py
"""

import collections
import os
import sys

sys.path.insert(0, os.environ.get("SRC", "src"))
from specdec.data import load_questions  # noqa: E402
from specdec.engine.floor import Floor  # noqa: E402
from specdec.engine.generation import GenerationConfig  # noqa: E402
from specdec.engine.loop import Engine  # noqa: E402
from specdec.models import load_model  # noqa: E402
from specdec.prompts import encode_prompt  # noqa: E402
from specdec.proposers import parse_method  # noqa: E402
from specdec.proposers.logitspec import plan as P  # noqa: E402
from specdec.proposers.logitspec import proposer as LP  # noqa: E402

last: dict[str, list] = {}
by_size: dict[int, list] = collections.defaultdict(lambda: [0, 0.0, 0.0])
by_source: dict[str, list] = collections.defaultdict(lambda: [0, 0.0, 0.0])
plan, observe = P.NodePool.plan, LP.LogitSpecProposer.observe


def bucket(nodes: int) -> int:
    return nodes if nodes < 6 else 6 if nodes < 9 else 9 if nodes < 12 else 12


def recording_plan(pool, costs, budget, floor, min_prob, min_gain):
    chosen = plan(pool, costs, budget, floor, min_prob, min_gain)
    weighed = pool.exclusive_probs() if hasattr(pool, "exclusive_probs") else pool.probs
    last["probs"] = [weighed[i] for i in chosen if i != 0]
    last["sources"] = [pool.sources[i] for i in chosen if i != 0]
    return chosen


def recording_observe(proposer, result):
    if proposer._last is not None and "probs" in last and result.tree.num_nodes == 1 + len(last["probs"]):
        size = by_size[bucket(result.tree.num_nodes)]
        size[0] += 1
        size[1] += sum(last["probs"])
        size[2] += result.num_accepted
        path = set(result.path)
        for i, (prob, source) in enumerate(zip(last["probs"], last["sources"], strict=True)):
            entry = by_source[source]
            entry[0] += 1
            entry[1] += prob
            entry[2] += (i + 1) in path  # tree node i + 1 is chosen[i]: the tree lists the pool's ids in order
    last.clear()
    return observe(proposer, result)


def main() -> None:
    P.NodePool.plan, LP.LogitSpecProposer.observe = recording_plan, recording_observe
    loaded = load_model("smollm2-135m")
    engine = Engine(loaded, floor=None if os.environ.get("NOFLOOR") else Floor())
    seen, held = collections.Counter(), []
    for question in load_questions():
        seen[question.category] += 1
        if 11 <= seen[question.category] <= 16:
            held.append(encode_prompt(loaded.tokenizer, question.turns[0], chat=True))
    for prompt in held:
        engine.generate(prompt, parse_method("logitspec").build(loaded), GenerationConfig(max_new_tokens=128))
    print("nodes (from) steps expected accepted (a step)")
    for key in sorted(by_size):
        steps, expected, accepted = by_size[key]
        print(f"{key:3d} {steps:5d} {expected / steps:6.2f} {accepted / steps:6.2f}")
    print("source nodes mean-probability accepted-share")
    for source, (nodes, expected, accepted) in sorted(by_source.items()):
        print(f"{source:8s} {nodes:6d} {expected / nodes:6.3f} {accepted / nodes:6.3f}")


if __name__ == "__main__":
    main()
