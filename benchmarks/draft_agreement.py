"""How often a draft model's greedy token equals the target's, and what each pass costs: does drafting pay?

For every question (default: Spec-Bench MT-bench's coding and math questions plus
the first of every other category, first turn, chat template) the target decodes
greedily (`plain`, our engine); the draft then reads prompt + that output in one
teacher-forced pass, and position by position its argmax is compared with the
target's token. A greedy draft of fixed length k, run through the real loop,
proposes exactly these argmaxes as long as the earlier ones matched, so the
tokens a step would accept at output position i are the run of matches from i
(capped at k): the expected tokens per step E(k) follow exactly, per category.

Costs (median seconds, `TargetModel`, cache at each question's prompt + 64
tokens): the target's pass over a chain of n = 1..9 tokens, and the draft's
one-token pass. Predicted speed of a fixed-k draft over plain decoding:
E(k) * t_target(1) / (t_target(k + 1) + k * t_draft(1)) (the catch-up pass of the
draft over the accepted tokens counted as one of the k). The best k and its
predicted speedup are what a length schedule should find.

    .venv/bin/python benchmarks/draft_agreement.py --target qwen2.5-coder-1.5b --draft qwen2.5-coder-0.5b

Run it alone (every cost is a wall-clock time). The last stdout line is one JSON document.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import defaultdict

import torch

from specdec.backends.torch.target import TargetModel
from specdec.data import default_questions_path, load_questions
from specdec.engine.generation import GenerationConfig
from specdec.engine.loop import Engine
from specdec.models import load_model, machine_fingerprint
from specdec.prompts import encode_prompt
from specdec.proposers.draft import QUANTIZE, DraftConfig
from specdec.proposers.plain import PlainProposer
from specdec.tree import DraftTree

MAX_K = 8


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", default="qwen2.5-coder-1.5b")
    p.add_argument("--draft", default="qwen2.5-coder-0.5b")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--quantize", default="auto", choices=QUANTIZE, help="the draft's, as `draft:quantize=`")
    p.add_argument("--coding-math", type=int, default=10, help="MT-bench coding and math questions, each")
    p.add_argument("--others", type=int, default=2, help="questions of every other Spec-Bench category")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--repeats", type=int, default=5)
    return p.parse_args(argv)


def questions(coding_math: int, others: int) -> list[tuple[str, str]]:
    """(category, first turn): MT-bench coding and math (their own subcategories), then the others."""
    picked, counts = [], defaultdict(int)
    for q in load_questions(default_questions_path()):
        category = q.subcategory if q.category == "mt_bench" else q.category
        limit = coding_math if category in ("coding", "math") else (others if q.category != "mt_bench" else 0)
        if counts[category] < limit:
            counts[category] += 1
            picked.append((category, q.turns[0]))
    return picked


@torch.inference_mode()
def matches(draft, prompt: list[int], output: list[int]) -> list[bool]:
    """matches[i]: the draft's argmax after prompt + output[:i] is output[i]."""
    ids = torch.tensor([prompt + output[:-1]], device=draft.device)
    logits = draft(input_ids=ids, logits_to_keep=len(output)).logits[0]  # [len(output), V]
    return (logits.argmax(-1).cpu() == torch.tensor(output)).tolist()


def expected_tokens(flags: list[bool], k: int) -> float:
    """Mean tokens per step of a fixed-k greedy draft (accepted run + 1), walking the output as the loop does."""
    i, steps = 0, 0
    while i < len(flags):
        run = 0
        while run < k and i + run < len(flags) and flags[i + run]:
            run += 1
        i, steps = i + run + 1, steps + 1
    return len(flags) / steps


def pass_seconds(runner: TargetModel, prefix: list[int], size: int, repeats: int) -> float:
    """Median seconds of one pass over a chain of `size` tokens after `prefix` (already prefilled)."""
    tree = DraftTree.chain(prefix[-1], [prefix[-1]] * (size - 1))
    times = []
    for _ in range(repeats + 1):
        start = time.perf_counter()
        runner.forward_tree(tree.tokens, tree.parents)
        runner.trim(len(prefix))
        times.append(time.perf_counter() - start)
    return statistics.median(times[1:])


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    target, draft = load_model(args.target, dtype=args.dtype), load_model(args.draft, dtype=args.dtype)
    print(f"target {target.name}, draft {draft.name}, {target.dtype}; {machine_fingerprint(target.device)}; "
          f"threads {torch.get_num_threads()}", file=sys.stderr)  # fmt: skip
    engine = Engine(target)
    draft_model = DraftConfig(quantize=args.quantize).prepare(target, draft.model).module  # as `draft` runs it
    target_runner, draft_runner = TargetModel(target.model), TargetModel(draft_model)
    by_category: dict[str, dict] = defaultdict(lambda: {"flags": [], "target": defaultdict(list), "draft": []})
    for category, turn in questions(args.coding_math, args.others):
        prompt = encode_prompt(target.tokenizer, turn, chat=True)
        output = engine.generate(prompt, PlainProposer(), GenerationConfig(max_new_tokens=args.max_new_tokens)).token_ids
        row = by_category[category]
        row["flags"].append(matches(draft_model, prompt, output))
        prefix = prompt + output[:64]
        target_runner.prefill(prefix)
        for size in range(1, MAX_K + 2):
            row["target"][size].append(pass_seconds(target_runner, prefix, size, args.repeats))
        draft_runner.prefill(prefix)
        row["draft"].append(pass_seconds(draft_runner, prefix, 1, args.repeats))
        print(f"{category}: {len(prompt)} prompt tokens, first-token agreement "
              f"{sum(row['flags'][-1]) / len(output):.2f}", file=sys.stderr)  # fmt: skip
    report = {}
    for category, row in by_category.items():
        flags = [f for run in row["flags"] for f in run]
        t = {size: statistics.median(v) for size, v in row["target"].items()}
        d = statistics.median(row["draft"])
        per_k = {}
        for k in range(1, MAX_K + 1):
            e = statistics.mean(expected_tokens(run, k) for run in row["flags"])
            per_k[k] = {"tokens_per_step": round(e, 2), "predicted_speedup": round(e * t[1] / (t[k + 1] + k * d), 2)}
        best = max(per_k, key=lambda k: per_k[k]["predicted_speedup"])
        report[category] = {
            "questions": len(row["flags"]), "agreement": round(sum(flags) / len(flags), 3),
            "target_ms": {n: round(s * 1000, 1) for n, s in t.items()}, "draft_ms": round(d * 1000, 1),
            "best_k": best, "per_k": per_k,
        }  # fmt: skip
        print(f"{category:16s} agreement {report[category]['agreement']:.2f}  target 1/2/5/9 tokens "
              f"{t[1] * 1e3:.0f}/{t[2] * 1e3:.0f}/{t[5] * 1e3:.0f}/{t[9] * 1e3:.0f} ms  draft {d * 1e3:.0f} ms  "
              f"best k {best}: {per_k[best]['tokens_per_step']} tokens/step, predicted "
              f"{per_k[best]['predicted_speedup']}x", file=sys.stderr)  # fmt: skip
    print(json.dumps({"target": args.target, "draft": args.draft, "dtype": str(target.dtype), "quantize": args.quantize,
                      "max_new_tokens": args.max_new_tokens, "categories": report}))  # fmt: skip


if __name__ == "__main__":
    main()
