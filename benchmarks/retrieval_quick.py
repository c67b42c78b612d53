"""Quick retrieval benchmark: our plain / pld / logitspec against transformers' generate.

Why: a one-command check, while tuning the LogitSpec budget, of where each
retrieval method stands on Spec-Bench; the full harness is `specdec bench`.

One run, N questions per Spec-Bench category (chat template, greedy), methods
interleaved per prompt (the order rotates from prompt to prompt, so load drift
spreads over all methods) after a warm-up of each. Per category and overall:
tokens/s, speedup vs transformers' greedy `generate`, speedup vs our plain
engine, MAT, retrieval success (share of steps whose tree had a draft) and the
exact-match rate vs our plain greedy output. The last stdout line is one JSON
document with everything.

    .venv/bin/python benchmarks/retrieval_quick.py --per-category 3 --max-new-tokens 128 --dtype fp32
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from collections.abc import Callable

import torch

from specdec.data import load_questions
from specdec.engine.generation import GenerationConfig
from specdec.engine.loop import Engine
from specdec.models import LoadedModel, load_model
from specdec.prompts import encode_prompt
from specdec.proposers import parse_method

HF_GREEDY, HF_PLD = "hf_greedy", "hf_prompt_lookup"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--dtype", default="fp32")
    p.add_argument("--per-category", type=int, default=3)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--methods", default="plain,pld,logitspec", help="our methods, ';'-separated if options use ','")
    p.add_argument("--hf-lookup-tokens", type=int, default=10, help="transformers' prompt_lookup_num_tokens")
    p.add_argument("--costs-dir", default="", help="LogitSpec cost cache (default ~/.cache/specdec/costs)")
    p.add_argument("--show-stats", action="store_true", help="print LogitSpec's learned acceptance rates")
    return p.parse_args(argv)


def split_methods(text: str) -> list[str]:
    return [m.strip() for m in text.split(";" if ";" in text else ",") if m.strip()]


def hf_runner(loaded: LoadedModel, lookup_tokens: int | None) -> Callable[[list[int], int], list[int]]:
    eos = list(loaded.eos_token_ids)

    def run(prompt_ids: list[int], max_new_tokens: int) -> list[int]:
        ids = torch.tensor([prompt_ids], device=loaded.device)
        extra = {"prompt_lookup_num_tokens": lookup_tokens} if lookup_tokens else {}
        with torch.inference_mode():
            out = loaded.model.generate(
                ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens, do_sample=False,
                eos_token_id=eos, pad_token_id=eos[0], **extra,
            )
        return out[0, len(prompt_ids):].tolist()

    return run


def make_runners(loaded: LoadedModel, args: argparse.Namespace) -> dict[str, Callable]:
    """name -> run(prompt_ids, max_new_tokens) -> (tokens, forward passes | None, steps with drafts | None, steps)."""
    engine = Engine(loaded)
    runners: dict[str, Callable] = {}
    for spec in split_methods(args.methods):
        extra = {"costs_dir": args.costs_dir} if spec.startswith("logitspec") and args.costs_dir else {}
        proposer = parse_method(spec, extra).build(loaded)  # one per method: adaptive state carries over

        def ours(ids: list[int], n: int, proposer=proposer) -> tuple:
            stats = engine.generate(ids, proposer, GenerationConfig(max_new_tokens=n))
            steps = stats.stats.steps
            drafted = sum(s.tree_size > 1 for s in steps)
            return stats.token_ids, stats.stats.num_forward_passes, drafted, len(steps)

        runners[spec] = ours
    for name, lookup in ((HF_GREEDY, None), (HF_PLD, args.hf_lookup_tokens)):
        run = hf_runner(loaded, lookup)
        runners[name] = lambda ids, n, run=run: (run(ids, n), None, None, None)
    return runners


def summarise(rows: list[dict], names: list[str], reference: str) -> dict:
    """Totals over rows (one per prompt and method) -> per-method metrics."""
    total: dict[str, dict] = defaultdict(lambda: defaultdict(float))
    for row in rows:
        t = total[row["method"]]
        t["tokens"] += row["tokens"]
        t["seconds"] += row["seconds"]
        t["prompts"] += 1
        t["exact"] += row["exact"]
        if row["passes"] is not None:
            t["passes"] += row["passes"]
            t["drafted"] += row["drafted"]
            t["steps"] += row["steps"]
    out = {}
    for name in names:
        t = total[name]
        tps = t["tokens"] / t["seconds"] if t["seconds"] else 0.0
        out[name] = {
            "tokens": int(t["tokens"]),
            "seconds": round(t["seconds"], 3),
            "tokens_per_s": round(tps, 2),
            "mat": round(t["tokens"] / t["passes"], 3) if t.get("passes") else None,
            "retrieval_success": round(t["drafted"] / t["steps"], 3) if t.get("steps") else None,
            "exact_match": round(t["exact"] / t["prompts"], 3) if t["prompts"] else None,
        }
    for name in names:
        for base, label in ((HF_GREEDY, "speedup_vs_hf_greedy"), (reference, "speedup_vs_plain")):
            b = out[base]["tokens_per_s"]
            out[name][label] = round(out[name]["tokens_per_s"] / b, 3) if b else None
    return out


def print_table(title: str, summary: dict) -> None:
    print(f"\n== {title}")
    print(f"{'method':<40} {'tok/s':>7} {'vs hf':>6} {'vs plain':>8} {'MAT':>5} {'retr':>5} {'exact':>5}")
    for name, s in summary.items():
        mat = f"{s['mat']:.2f}" if s["mat"] is not None else "-"
        retr = f"{s['retrieval_success']:.2f}" if s["retrieval_success"] is not None else "-"
        print(f"{name:<40} {s['tokens_per_s']:>7.1f} {s['speedup_vs_hf_greedy']:>5.2f}x "
              f"{s['speedup_vs_plain']:>7.2f}x {mat:>5} {retr:>5} {s['exact_match']:>5.2f}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    loaded = load_model(args.model, dtype=args.dtype)
    runners = make_runners(loaded, args)
    names = list(runners)
    reference = split_methods(args.methods)[0]
    questions = load_questions(per_category=args.per_category)
    prompts = [(q.category, encode_prompt(loaded.tokenizer, q.turns[0], chat=True)) for q in questions]
    for name in names:  # warm-up: one short generation each
        runners[name](prompts[0][1], 16)
    rows: list[dict] = []
    for i, (category, ids) in enumerate(prompts):
        order = names[i % len(names):] + names[: i % len(names)]
        outputs = {}
        for name in order:
            start = time.perf_counter()
            tokens, passes, drafted, steps = runners[name](ids, args.max_new_tokens)
            seconds = time.perf_counter() - start
            outputs[name] = tokens
            rows.append({"category": category, "method": name, "tokens": len(tokens), "seconds": seconds,
                         "passes": passes, "drafted": drafted, "steps": steps})
        for row in rows[-len(names):]:
            row["exact"] = float(outputs[row["method"]] == outputs[reference])
        print(f"[{i + 1}/{len(prompts)}] {category}: " + ", ".join(
            f"{r['method']} {r['tokens'] / r['seconds']:.1f}" for r in rows[-len(names):]), file=sys.stderr)
    categories = sorted({c for c, _ in prompts}, key=[c for c, _ in prompts].index)
    result = {
        "config": {k: v for k, v in vars(args).items()} | {"threads": torch.get_num_threads()},
        "categories": {c: summarise([r for r in rows if r["category"] == c], names, reference) for c in categories},
        "overall": summarise(rows, names, reference),
    }
    for c in categories:
        print_table(c, result["categories"][c])
    print_table("overall", result["overall"])
    if args.show_stats:
        show_learned_stats(runners)
    print(json.dumps(result))
    return 0


def show_learned_stats(runners: dict[str, Callable]) -> None:
    for name, run in runners.items():
        proposer = getattr(run, "__defaults__", None) and run.__defaults__[0]
        stats = getattr(proposer, "stats", None)
        if stats is None:
            continue
        print(f"\n{name}: learned acceptance rates (rate, weight)")
        for key, (rate, weight) in sorted(stats.snapshot().items(), key=lambda kv: str(kv[0])):
            print(f"  {key}: {rate:.3f} ({weight:.0f})")


if __name__ == "__main__":
    sys.exit(main())
