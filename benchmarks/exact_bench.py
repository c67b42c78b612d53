"""Batch-invariant verification on and off, in one run: exact match with plain decoding and tokens/s.

For each Spec-Bench question (the first N per category, first turn, chat template)
every method runs twice, once on the model loaded with `exact="on"` (batch-
invariant) and once with `exact="off"`, alternating, so drift
on the machine hits both alike. Each output is compared with `plain` decoding
under the same setting; tokens/s counts decode and prefill (what a user waits
for). The per-prompt rows are written as they come (JSONL, resumable with the
same --out), and the summary table goes to stdout.

    .venv/bin/python benchmarks/exact_bench.py --per-category 10 --out results/exact.jsonl

Run it alone: every number is a wall-clock time.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
from collections import defaultdict
from pathlib import Path

import torch
from tqdm import tqdm

from specdec.backends.torch.packed import is_invariant
from specdec.data import load_questions
from specdec.engine.generation import GenerationConfig
from specdec.engine.loop import Engine
from specdec.models import load_model
from specdec.prompts import encode_prompt
from specdec.proposers import parse_method

METHODS = "plain,pld,logitspec,recycle,lookahead,eagle,eagle:retrieval=true"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--methods", default=METHODS)
    parser.add_argument("--per-category", type=int, default=10)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--dtype", default="bf16")
    parser.add_argument("--out", type=Path, required=True, help="JSONL of per-prompt rows (resumed if present)")
    args = parser.parse_args()
    methods = args.methods.split(",")
    if methods[0] != "plain":
        raise SystemExit("the first method must be plain (the reference)")
    engines = {}
    for setting in ("on", "off"):
        loaded = load_model(dtype=args.dtype, exact=setting)
        engines[setting] = (loaded, Engine(loaded))
        print(f"exact={setting}: invariant verification {'on' if is_invariant(loaded) else 'off'}")
    done = set()
    if args.out.exists():
        done = {(r["question_id"], r["exact"], r["method"]) for r in map(json.loads, args.out.read_text().splitlines())}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    questions = load_questions(per_category=args.per_category)
    config = GenerationConfig(max_new_tokens=args.max_new_tokens)
    with args.out.open("a") as sink:
        for question in tqdm(questions, desc="questions"):
            for setting, (loaded, engine) in engines.items():
                ids = encode_prompt(loaded.tokenizer, question.turns[0], chat=True)
                for method in methods:
                    if (question.question_id, setting, method) in done:
                        continue
                    out = engine.generate(ids, parse_method(method).build(loaded), config)
                    row = {
                        "question_id": question.question_id, "category": question.category, "exact": setting,
                        "method": method, "token_ids": out.token_ids, "wall_s": out.stats.wall_time_s,
                        "new_tokens": out.stats.num_new_tokens, "mat": out.stats.mat,
                    }
                    sink.write(json.dumps(row) + "\n")
                    sink.flush()
    summarize([json.loads(line) for line in args.out.read_text().splitlines()], methods)


def summarize(rows: list[dict], methods: list[str]) -> None:
    plain = {(r["question_id"], r["exact"]): r["token_ids"] for r in rows if r["method"] == "plain"}
    table: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for r in rows:
        table[(r["method"], r["exact"])].append(r)
    cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")), "")
    print(f"\nmachine: {cpu or platform.processor()}; {os.cpu_count()} cores; torch {torch.__version__}")
    print(f"{'method':<24}{'exact':>6}{'prompts':>8}{'same as plain':>14}{'tokens/s':>10}{'MAT':>6}{'on/off':>8}")
    for method in methods:
        speeds = {}
        for setting in ("on", "off"):
            got = table.get((method, setting), [])
            if not got:
                continue
            same = sum(r["token_ids"] == plain.get((r["question_id"], setting)) for r in got)
            speeds[setting] = sum(r["new_tokens"] for r in got) / sum(r["wall_s"] for r in got)
            mat = sum(r["mat"] for r in got) / len(got)
            ratio = f"{speeds['on'] / speeds['off']:.2f}x" if setting == "off" and "on" in speeds else ""
            print(f"{method:<24}{setting:>6}{len(got):>8}{f'{same}/{len(got)}':>14}{speeds[setting]:>10.1f}"
                  f"{mat:>6.2f}{ratio:>8}")


if __name__ == "__main__":
    main()
