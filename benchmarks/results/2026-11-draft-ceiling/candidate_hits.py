"""How often a next-next candidate is right, by what LogitSpec knows of it.

    .venv/bin/python benchmarks/results/2026-11-draft-ceiling/candidate_hits.py

SmolLM2-135M, first turns of Spec-Bench questions 11-14 of every category, 128 new tokens, greedy, `logitspec`
(defaults, no floor). Every candidate each step retrieved (the root's top-k but the root) is scored against the
token verification emitted after the root: hit rates by rank bucket (`learn.rank_bucket`: 0 the root token
itself, 1 the best other, 2 the next, 3 ranks 3-4, ...), by matched n-gram size, and by the candidate's and
the root's log-probability under the root's logits; and the fit (log-likelihood, rates per cell with half a
hit of prior) of the learner's key (bucket, m) against keys that add either log-probability.
"""

import collections
import math
import os
import sys

import torch

sys.path.insert(0, "src")
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.dirname(__file__))
from pool_oracle import Wrapped  # noqa: E402
from step_pieces import held_out_prompts  # noqa: E402

from specdec.engine.generation import GenerationConfig  # noqa: E402
from specdec.engine.loop import Engine  # noqa: E402
from specdec.models import load_model  # noqa: E402
from specdec.proposers import parse_method  # noqa: E402
from specdec.proposers.logitspec.learn import rank_bucket  # noqa: E402

rows: list[tuple[int, int, float, float, bool]] = []  # (bucket, m, candidate log-prob, root log-prob, hit)


class Watched(Wrapped):
    """The proposer, with each step's candidates and their log-probabilities kept for `observe`."""

    def propose(self, ctx):  # noqa: ANN001, ANN201
        tree = self.inner.propose(ctx)
        step = self.inner._last
        self.retrieval = step and step.retrieval
        if self.retrieval is not None:
            logp = torch.log_softmax(ctx.last_logits.float(), -1)
            self.logp = logp[torch.tensor(self.retrieval.cand_tokens, dtype=torch.long)].tolist()
            self.root_logp = float(logp[ctx.token_ids[-1]])
        return tree

    def observe(self, result) -> None:  # noqa: ANN001
        got = self.retrieval
        if got is not None and result.tokens:
            for token, rank, m, logp in zip(got.cand_tokens, got.cand_ranks, got.cand_ngrams, self.logp, strict=True):
                rows.append((rank_bucket(rank), m, logp, self.root_logp, token == result.tokens[0]))
        self.inner.observe(result)


def rates(key, name: str, least: int = 50) -> None:  # noqa: ANN001
    cells = collections.defaultdict(lambda: [0, 0])
    for row in rows:
        cells[key(row)][0] += 1
        cells[key(row)][1] += row[4]
    print(name + ": " + ", ".join(f"{k}: {h / n:.3f} ({n})" for k, (n, h) in sorted(cells.items()) if n >= least))


def fit(key) -> float:  # noqa: ANN001
    cells = collections.defaultdict(lambda: [0, 0])
    for row in rows:
        cells[key(row)][0] += 1
        cells[key(row)][1] += row[4]
    total = 0.0
    for row in rows:
        n, h = cells[key(row)]
        p = (h + 0.5) / (n + 1)
        total += math.log(p if row[4] else 1 - p)
    return total


def main() -> None:
    loaded = load_model("smollm2-135m")
    engine = Engine(loaded)
    for prompt in held_out_prompts(loaded, last=14):
        engine.generate(prompt, Watched(parse_method("logitspec").build(loaded)), GenerationConfig(max_new_tokens=128))
    print(f"{len(rows)} candidates, {sum(row[4] for row in rows)} right")
    rates(lambda r: r[0], "hit rate by rank bucket (count)")
    rates(lambda r: (min(r[0], 4), min(r[1], 2)), "by (bucket, capped at 4; m, capped at 2)")
    rates(lambda r: max(-8, math.floor(r[2])), "by the candidate's log-probability (floor, from -8)")
    rates(lambda r: (min(r[0], 3), max(-3, math.floor(r[3]))), "by (bucket, capped at 3; the root's log-probability)")
    cand = lambda r: max(-6, math.floor(r[2]))  # noqa: E731
    root = lambda r: max(-3, math.floor(2 * r[3])) / 2  # noqa: E731
    for name, key in (("(bucket, m)", lambda r: (r[0], r[1])), ("+ candidate log-prob", lambda r: (r[0], r[1], cand(r))),
                      ("+ root log-prob", lambda r: (r[0], r[1], root(r))),
                      ("+ both", lambda r: (r[0], r[1], cand(r), root(r)))):  # fmt: skip
        print(f"log-likelihood, key {name}: {fit(key):.1f}")


if __name__ == "__main__":
    main()
