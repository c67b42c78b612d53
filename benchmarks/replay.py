"""Replay fixed greedy outputs through retrieval proposers: exact MAT, modelled speed, no timing noise.

Why: tuning a drafter with `specdec bench` takes minutes per variant, and in bf16
the methods' texts drift apart (near-tie flips), so two variants are compared on
different text. Here the target runs once: one greedy generation per prompt and
one teacher-forced pass that keeps the top-64 logits at every output position.
Then any number of proposer variants replay that same text step by step:
acceptance is computed exactly (the longest tree path that matches the output),
and speed is modelled as plain steps x cost(1) over the sum of cost(tree size),
with the forward-pass cost curve measured on this machine (`budget.CostModel`)
plus a fixed per-step overhead.

Only proposers that need nothing but the context and the last logits can be
replayed (`plain`, `pld`, `logitspec`): drafts from a model would need that
model's passes. The replay sees the top-64 logits only, so `k` above 64 acts as 64.

    .venv/bin/python benchmarks/replay.py collect --per-category 3 --out /tmp/replay.pt
    .venv/bin/python benchmarks/replay.py run /tmp/replay.pt pld logitspec logitspec:min_gain=0
    .venv/bin/python benchmarks/replay.py run /tmp/replay.pt oracle/logitspec:adaptive=false,budget=256

`--costs 1:35,64:36` replaces the measured curve by a what-if one (planners plan with it).
A method prefixed `oracle/` is priced as if only its accepted path were verified:
the ceiling of any planner choosing among that method's drafts.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from dataclasses import dataclass, field
from types import SimpleNamespace

import torch
from tqdm import tqdm

from specdec.data import load_questions
from specdec.engine.costs import CostModel, load_or_measure
from specdec.engine.generation import GenerationConfig, ProposalContext
from specdec.engine.loop import Engine
from specdec.engine.verify import VerifyResult
from specdec.models import load_model
from specdec.prompts import encode_prompt
from specdec.proposers import parse_method
from specdec.proposers.logitspec.plan import ROOT, NodePool
from specdec.proposers.logitspec.proposer import LogitSpecConfig, LogitSpecProposer
from specdec.proposers.plain import PlainProposer
from specdec.sampling import SamplingParams

TOP = 64
ORACLE = "oracle/"  # method prefix: price only the accepted path (see `replay`)
STEP_OVERHEAD_S = 0.0025  # per step beyond the forward pass (mask, acceptance, drafting), seen in the bench


def collect(args: argparse.Namespace) -> None:
    loaded = load_model(args.model, dtype=args.dtype)
    engine = Engine(loaded)
    costs = load_or_measure(loaded)
    records = []
    questions = pick(load_questions(), args.skip, args.per_category)
    for q in tqdm(questions, desc="collect", file=sys.stderr):
        ids = encode_prompt(loaded.tokenizer, q.turns[0], chat=True)
        out = engine.generate(ids, PlainProposer(), GenerationConfig(max_new_tokens=args.max_new_tokens))
        seq = ids + out.token_ids
        with torch.inference_mode():
            logits = loaded.model(torch.tensor([seq], device=loaded.device)).logits[0].float()
        top = torch.topk(logits[len(ids) - 1 : len(seq) - 1], TOP)  # row t predicts output token t
        records.append({"category": q.category, "prompt": ids, "output": out.token_ids,
                        "top_ids": top.indices.cpu(), "top_logits": top.values.cpu()})
    torch.save({"vocab_size": loaded.model.config.vocab_size, "eos": list(loaded.eos_token_ids),
                "max_new_tokens": args.max_new_tokens, "costs": (costs.sizes, costs.seconds),
                "records": records}, args.out)
    print(json.dumps({"written": args.out, "prompts": len(records)}))


def pick(questions: list, skip: int, per_category: int) -> list:
    """Questions skip+1 .. skip+per_category of each category (skip 10: past what the benchmarks report)."""
    seen: dict[str, int] = defaultdict(int)
    kept = []
    for q in questions:
        seen[q.category] += 1
        if skip < seen[q.category] <= skip + per_category:
            kept.append(q)
    return kept


def build(method: str, data: dict):
    config = parse_method(method)
    if isinstance(config, LogitSpecConfig):
        costs = CostModel(*map(tuple, data["costs"])) if config.adaptive else None
        return LogitSpecProposer(config, costs, tuple(data["eos"]))
    return config.build(SimpleNamespace(eos_token_ids=tuple(data["eos"])))


def accepted_path(tree, output: list[int], t: int) -> list[int]:
    """Nodes of the longest root-first path whose tokens equal output[t + 1], output[t + 2], ..."""
    tokens, children = tree.token_list, tree.children
    path = [0]
    while t + len(path) < len(output):
        want = output[t + len(path)]
        child = next((c for c in children[path[-1]] if tokens[c] == want), None)
        if child is None:
            break
        path.append(child)
    return path


def pool_reach(pool: NodePool, output: list[int], t: int) -> tuple[int, int]:
    """(length of the pool's longest path matching output[t + 1:], how many of the pool's most likely
    nodes a plan must take to hold that whole path): what a planner that knew the output could verify."""
    node, path = ROOT, []
    while t + 1 + len(path) < len(output):
        node = pool.child(node, output[t + 1 + len(path)])
        if node < 0:
            break
        path.append(node)
    if not path:
        return 0, 0
    probs = pool.probs
    order = sorted(range(1, len(pool)), key=lambda i: (-probs[i], i))  # the planner's order
    rank = {node: r for r, node in enumerate(order)}
    return len(path), 1 + max(rank[node] for node in path)


@dataclass
class Tally:
    """Sums over replayed steps (one category, or all)."""

    tokens: int = 0  # emitted after each prompt's first token
    steps: int = 0
    seconds: float = 0.0  # modelled
    nodes: int = 0  # verified tree nodes
    pool_tokens: int = 0  # draft tokens the step's whole candidate pool held (LogitSpec only)
    missed_needs: list[int] = field(default_factory=list)  # steps the plan fell short of its pool: nodes needed

    def add(self, other: Tally) -> None:
        for name in ("tokens", "steps", "seconds", "nodes", "pool_tokens"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.missed_needs += other.missed_needs


def replay(record: dict, proposer, data: dict, cost, oracle: bool = False) -> Tally:
    """One prompt replayed: tokens, steps, modelled seconds, tree nodes (and pool reach for LogitSpec).

    oracle: price each step's pass as the accepted path alone (a planner that knew the output
    and verified only what would be accepted): the ceiling of any planner over these drafts.
    """
    prompt, output = record["prompt"], record["output"]
    greedy, dummy = SamplingParams(), torch.zeros(1, 1)
    proposer.begin(prompt)
    t, out = 0, Tally(tokens=len(output) - 1)
    while t + 1 < len(output):
        last = torch.full((data["vocab_size"],), float("-inf"))
        last[record["top_ids"][t]] = record["top_logits"][t]
        max_depth = data["max_new_tokens"] - (t + 1) - 1
        tree = proposer.propose(ProposalContext(prompt + output[: t + 1], last, len(prompt), greedy, max_depth))
        path = accepted_path(tree, output, t)
        pool = getattr(proposer, "last_pool", None)
        if pool is not None:
            reach, needs = pool_reach(pool, output, t)
            out.pool_tokens += reach
            if reach > len(path) - 1:
                out.missed_needs.append(needs)
        emitted = output[t + 1 : t + len(path) + 1]
        proposer.observe(VerifyResult(emitted, path, dummy, tree))
        out.steps += 1
        out.nodes += tree.num_nodes
        out.seconds += cost(len(path) if oracle else tree.num_nodes) + STEP_OVERHEAD_S
        t += len(emitted)
    return out


def summary(tally: Tally, plain_step: float) -> dict:
    steps = max(tally.steps, 1)
    row = {"mat": tally.tokens / steps, "modelled_speedup": tally.tokens * plain_step / max(tally.seconds, 1e-9),
           "nodes_per_step": tally.nodes / steps}
    if tally.pool_tokens:
        needs = sorted(tally.missed_needs) or [0]
        row.update(pool_mat=1 + tally.pool_tokens / steps, short_steps=len(tally.missed_needs) / steps,
                   short_nodes_needed_median=needs[len(needs) // 2])
    return row


def run(args: argparse.Namespace) -> None:
    data = torch.load(args.data, weights_only=False)
    if args.costs:  # a what-if curve (e.g. a GPU's, flat to 64 nodes): planners plan with it, steps priced by it
        pairs = [item.split(":") for item in args.costs.split(",")]
        data["costs"] = ([int(n) for n, _ in pairs], [float(ms) / 1000 for _, ms in pairs])
    cost = CostModel(*map(tuple, data["costs"])).cost
    plain_step = cost(1) + STEP_OVERHEAD_S
    report = {}
    for method in args.methods:
        start = time.perf_counter()
        totals: dict[str, Tally] = defaultdict(Tally)
        oracle = method.startswith(ORACLE)
        proposer = build(method.removeprefix(ORACLE), data)
        for record in data["records"]:
            tally = replay(record, proposer, data, cost, oracle)
            for key in (record["category"], "overall"):
                totals[key].add(tally)
        report[method] = {key: summary(tally, plain_step) for key, tally in totals.items()}
        o = report[method]["overall"]
        pool = (f"  pool MAT {o['pool_mat']:.3f} (plan short of it on {o['short_steps']:.0%} of steps,"
                f" median {o['short_nodes_needed_median']} nodes to hold it)" if "pool_mat" in o else "")
        print(f"{method:42s} MAT {o['mat']:.3f}  modelled speedup {o['modelled_speedup']:.3f}x"
              f"  nodes/step {o['nodes_per_step']:.1f}{pool}  ({time.perf_counter() - start:.0f} s)", file=sys.stderr)
    print(json.dumps(report))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    c = sub.add_parser("collect", help="greedy outputs + top-64 logits per position")
    c.add_argument("--model", default="smollm2-135m")
    c.add_argument("--dtype", default="auto")
    c.add_argument("--per-category", type=int, default=3)
    c.add_argument("--skip", type=int, default=0, help="leave out the first N questions of each category")
    c.add_argument("--max-new-tokens", type=int, default=128)
    c.add_argument("--out", required=True)
    r = sub.add_parser("run", help="replay methods over collected outputs")
    r.add_argument("data")
    r.add_argument("methods", nargs="+")
    r.add_argument("--costs", default="", help="what-if cost curve, nodes:ms pairs (e.g. 1:35,64:36)")
    args = parser.parse_args(argv)
    collect(args) if args.command == "collect" else run(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
