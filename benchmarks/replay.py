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
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from types import SimpleNamespace

import torch
from tqdm import tqdm

from specdec.data import load_questions
from specdec.engine import Engine, GenerationConfig, ProposalContext
from specdec.models import load_model
from specdec.prompts import encode_prompt
from specdec.proposers import parse_method
from specdec.proposers.budget import CostModel, load_or_measure
from specdec.proposers.logitspec import LogitSpecConfig, LogitSpecProposer
from specdec.proposers.plain import PlainProposer
from specdec.sampling import SamplingParams
from specdec.verify import VerifyResult

TOP = 64
STEP_OVERHEAD_S = 0.0025  # per step beyond the forward pass (mask, acceptance, drafting), seen in the bench


def collect(args: argparse.Namespace) -> None:
    loaded = load_model(args.model, dtype=args.dtype)
    engine = Engine(loaded)
    costs = load_or_measure(loaded)
    records = []
    questions = load_questions(per_category=args.per_category)
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


def build(method: str, data: dict):
    config = parse_method(method)
    if isinstance(config, LogitSpecConfig) and config.adaptive:
        return LogitSpecProposer(config, CostModel(*map(tuple, data["costs"])))
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


def replay(record: dict, proposer, data: dict, cost) -> tuple[int, int, float]:
    """(tokens emitted after the first, decode steps, modelled seconds) for one prompt."""
    prompt, output = record["prompt"], record["output"]
    greedy, dummy = SamplingParams(), torch.zeros(1, 1)
    proposer.begin(prompt)
    t, steps, seconds = 0, 0, 0.0
    while t + 1 < len(output):
        last = torch.full((data["vocab_size"],), float("-inf"))
        last[record["top_ids"][t]] = record["top_logits"][t]
        max_depth = data["max_new_tokens"] - (t + 1) - 1
        tree = proposer.propose(ProposalContext(prompt + output[: t + 1], last, len(prompt), greedy, max_depth))
        path = accepted_path(tree, output, t)
        emitted = output[t + 1 : t + len(path) + 1]
        proposer.observe(VerifyResult(emitted, path, dummy, tree))
        steps += 1
        seconds += cost(tree.num_nodes) + STEP_OVERHEAD_S
        t += len(emitted)
    return len(output) - 1, steps, seconds


def run(args: argparse.Namespace) -> None:
    data = torch.load(args.data, weights_only=False)
    cost = CostModel(*map(tuple, data["costs"])).cost
    report = {}
    for method in args.methods:
        start = time.perf_counter()
        totals: dict[str, list[float]] = defaultdict(lambda: [0, 0, 0.0])
        proposer = build(method, data)
        for record in data["records"]:
            tokens, steps, seconds = replay(record, proposer, data, cost)
            for key in (record["category"], "overall"):
                totals[key][0] += tokens
                totals[key][1] += steps
                totals[key][2] += seconds
        plain_step = cost(1) + STEP_OVERHEAD_S
        report[method] = {key: {"mat": tok / max(st, 1), "modelled_speedup": tok * plain_step / max(sec, 1e-9)}
                          for key, (tok, st, sec) in totals.items()}
        overall = report[method]["overall"]
        print(f"{method:50s} MAT {overall['mat']:.3f}  modelled speedup {overall['modelled_speedup']:.3f}x"
              f"  ({time.perf_counter() - start:.0f} s)", file=sys.stderr)
    print(json.dumps(report))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    c = sub.add_parser("collect", help="greedy outputs + top-64 logits per position")
    c.add_argument("--model", default="smollm2-135m")
    c.add_argument("--dtype", default="auto")
    c.add_argument("--per-category", type=int, default=3)
    c.add_argument("--max-new-tokens", type=int, default=128)
    c.add_argument("--out", required=True)
    r = sub.add_parser("run", help="replay methods over collected outputs")
    r.add_argument("data")
    r.add_argument("methods", nargs="+")
    args = parser.parse_args(argv)
    collect(args) if args.command == "collect" else run(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
