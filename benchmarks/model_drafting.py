"""Model-based drafting, measured: `draft` against transformers, `layerskip` and `lookahead` on the default model.

Part "qwen" (needs the opt-in pair: `specdec models pull qwen2.5-coder-0.5b` and
`specdec models pull qwen2.5-coder-1.5b`): target Qwen2.5-Coder-1.5B-Instruct,
draft Qwen2.5-Coder-0.5B-Instruct (same tokenizer). Methods, all in one
`run_bench` (interleaved per question, same prompt ids, warmed up): plain,
hf-greedy, hf-assisted (transformers' `generate(assistant_model=...)` with its
defaults: 20 tokens, confidence threshold 0.4), our `draft` (timed cost-aware
length; transformers' +2/-1 heuristic for comparison; and the opt-in int8 draft)
`logitspec` and `hybrid` (LogitSpec's tree plus the draft's chain). Questions: MT-bench's coding and math questions
(two turns each, or the first only) plus the first questions of the other
Spec-Bench categories, categories taking turns. The qwen part always resumes its
folder (OUT/qwen-DTYPE): a stopped run goes on where it stopped when started again.

Part "default": the bundled SmolLM2-135M; plain, layerskip (calibrated, cached),
lookahead, across Spec-Bench (`--per-category` questions of each category).

Nothing here asserts a speed: it prints what it measured. The last stdout line
is one JSON document: per part, per method, overall and per category metrics
(tokens/s, speedup vs plain, MAT, exact match vs plain), and the headline ratio
draft / hf-assisted.

    .venv/bin/python benchmarks/model_drafting.py --part all --max-new-tokens 128
"""

from __future__ import annotations

import argparse
import json
import sys
from itertools import zip_longest
from pathlib import Path

from specdec.bench.config import BenchConfig
from specdec.bench.metrics import OVERALL
from specdec.bench.runner import run_bench
from specdec.choices import ModelSpec
from specdec.data import load_questions

QWEN_TARGET = "qwen2.5-coder-1.5b"
QWEN_DRAFT = "qwen2.5-coder-0.5b"
OTHER_CATEGORIES = ("translation", "summarization", "qa", "math_reasoning", "rag")
KEYS = ("tokens_per_s", "speedup_vs_plain", "mat", "acceptance_rate", "exact_match_plain", "new_tokens",
        "wall_time_s", "num_turns")


def qwen_methods(variants: bool) -> tuple[str, ...]:
    """Baselines, our draft (and with `variants` its heuristic and int8 forms), logitspec, the hybrid of both."""
    draft = f"draft:draft_model={QWEN_DRAFT}"
    methods = ["plain", "hf-greedy", "hf-assisted", draft]
    if variants:
        methods += [f"{draft},schedule=heuristic", f"{draft},quantize=int8"]
    methods += ["logitspec", f"hybrid:draft_model={QWEN_DRAFT}"]
    return tuple(methods)


def interleave(lists: list[list]) -> list:
    """The first of every list, then the second of every list, ...; shorter lists drop out."""
    return [item for row in zip_longest(*lists) for item in row if item is not None]


def write_questions(path: Path, code_math: int, others: int, first_turn_only: bool) -> Path:
    """MT-bench coding + math questions and `others` of each other category, as a JSONL file.

    Three streams take turns (coding, math, the other categories in turn), so that a run
    stopped part-way, and resumed later, has covered them in the proportions of the whole set.
    """
    others_in_turn = interleave([load_questions(categories=[c], per_category=others) for c in OTHER_CATEGORIES])
    chosen = interleave([
        load_questions(categories=["coding"], per_category=code_math),
        load_questions(categories=["math"], per_category=code_math),
        others_in_turn,
    ])
    with path.open("w", encoding="utf-8") as file:
        for q in chosen:
            turns = list(q.turns[:1] if first_turn_only else q.turns)
            row = {"question_id": q.question_id, "category": q.subcategory or q.category, "turns": turns}
            file.write(json.dumps(row) + "\n")
    return path


def brief(summary) -> dict:
    """Per method: the headline metrics overall and per category."""
    out = {}
    for method, groups in summary.stats.items():
        out[method] = {group: {k: metrics.get(k) for k in KEYS} for group, metrics in groups.items()}
    return out


def run_qwen(args: argparse.Namespace, out_root: Path) -> dict:
    out_root.mkdir(parents=True, exist_ok=True)
    questions = write_questions(out_root / "qwen_questions.jsonl", args.code_math, args.others, args.first_turn_only)
    config = BenchConfig(
        model=ModelSpec(QWEN_TARGET, dtype=args.dtype), methods=qwen_methods(not args.no_variants),
        data=str(questions), max_new_tokens=args.max_new_tokens, draft_model=QWEN_DRAFT,
        threads=args.threads, resume=str(out_root / f"qwen-{args.dtype}"), warmup=1,
    )
    summary = run_bench(config, command=" ".join(sys.argv))
    result = {"out_dir": summary.out_dir, "methods": brief(summary)}
    overall = {m: g[OVERALL]["tokens_per_s"] for m, g in summary.stats.items()}
    draft = next(m for m in overall if m.startswith("draft:") and "schedule" not in m)
    result["draft_over_hf_assisted"] = overall[draft] / overall["hf-assisted"] if overall["hf-assisted"] else None
    return result


def run_default(args: argparse.Namespace, out_root: Path) -> dict:
    config = BenchConfig(
        model=ModelSpec(dtype=args.dtype), methods=("plain", "layerskip", "lookahead"),
        per_category=args.per_category, max_new_tokens=args.max_new_tokens, threads=args.threads,
        out=str(out_root / f"default-{args.dtype}"), warmup=1,
    )
    summary = run_bench(config, command=" ".join(sys.argv))
    return {"out_dir": summary.out_dir, "methods": brief(summary)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=["qwen", "default", "all"], default="all")
    parser.add_argument("--dtype", default="fp32")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--code-math", type=int, default=10, help="MT-bench coding and math questions each")
    parser.add_argument("--others", type=int, default=2, help="questions of each other Spec-Bench category")
    parser.add_argument("--first-turn-only", action="store_true", help="qwen part: MT-bench's first turns only")
    parser.add_argument("--no-variants", action="store_true", help="qwen part: leave out draft's heuristic/int8 runs")
    parser.add_argument("--per-category", type=int, default=3, help="default-model part: questions per category")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--out", default="results/model_drafting")
    args = parser.parse_args(argv)
    out_root = Path(args.out)
    report = {"dtype": args.dtype, "max_new_tokens": args.max_new_tokens}
    if args.part in ("qwen", "all"):
        report["qwen"] = run_qwen(args, out_root)
    if args.part in ("default", "all"):
        report["default"] = run_default(args, out_root)
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
