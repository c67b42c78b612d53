"""custom_generate's overhead: `model.generate(custom_generate=specdec.decoder(method))` against
`specdec.generate` on the same prompts, in one run.

Both paths decode the same model object (the user's, wrapped as it is: `specdec.load_model(model,
tokenizer=tok)` on one side, the decoder's own wrapping on the other), with the same method, greedy,
and the same max_new_tokens. What the transformers path adds: `GenerationMixin.generate`'s set-up
(generation config, logits processors, stopping criteria), the batch the decoder steps, and the
stopping criteria called on every emitted token. For each prompt (Spec-Bench, first turn, chat
template) the two run as A B B A, so drift on the machine hits both alike; one untimed run of each
comes first. tokens/s = new tokens / wall time (prefill included: what a caller waits for). Each
run is a row of the JSON written to --out; the table goes to stdout, with the share of prompts
whose tokens were the same on both paths.

    .venv/bin/python benchmarks/custom_generate_overhead.py --per-category 2 \\
        --out results/custom_generate_overhead.json

Run it alone: every number is a wall-clock time.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

import specdec
from specdec.data import load_questions
from specdec.engine.loop import Engine
from specdec.models import machine_fingerprint
from specdec.prompts import encode_prompt

PATHS = ("custom_generate", "specdec.generate")  # A, B
WARMUP_PROMPT = "Name three colours."


@dataclass(frozen=True)
class Prompt:
    question_id: str
    text: str  # a user turn; the chat template makes `ids` from it (specdec.generate does the same)
    ids: list[int]


Runner = Callable[[Prompt], list[int]]


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m", help="bundled name, HF folder, .gguf file or hub id")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--method", default="logitspec")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--per-category", type=int, default=2, help="Spec-Bench questions per category")
    parser.add_argument("--limit", type=int, default=None, help="at most this many questions")
    parser.add_argument("--data", default=None, help="a questions JSONL (default: Spec-Bench, as shipped)")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--out", type=Path, default=Path("results/custom_generate_overhead.json"))
    return parser.parse_args()


def make_runners(model: Any, tok: Any, method: str, max_new_tokens: int) -> dict[str, Runner]:
    """Each path as prompt -> new token ids, both on `model` as it is, the decoder and the engine made once."""
    decoder = specdec.decoder(method, tokenizer=tok)
    engine = Engine(specdec.load_model(model, tokenizer=tok))

    def custom_generate(prompt: Prompt) -> list[int]:
        input_ids = torch.tensor([prompt.ids], dtype=torch.long, device=model.device)
        out = model.generate(input_ids=input_ids, attention_mask=torch.ones_like(input_ids), do_sample=False,
                             max_new_tokens=max_new_tokens, custom_generate=decoder)
        return out[0, len(prompt.ids):].tolist()  # one row: no padding after its last token

    def specdec_generate(prompt: Prompt) -> list[int]:
        return specdec.generate(engine, prompt.text, method, max_new_tokens=max_new_tokens, chat=True).token_ids

    return {"custom_generate": custom_generate, "specdec.generate": specdec_generate}


def timed(run: Runner, prompt: Prompt) -> tuple[list[int], float]:
    start = time.perf_counter()
    tokens = run(prompt)
    return tokens, time.perf_counter() - start


def run_prompts(runners: dict[str, Runner], prompts: list[Prompt]) -> list[dict[str, Any]]:
    """A B B A on each prompt; one row per run."""
    rows = []
    for prompt in prompts:
        for order, path in enumerate((PATHS[0], PATHS[1], PATHS[1], PATHS[0])):
            tokens, wall = timed(runners[path], prompt)
            rows.append({"question_id": prompt.question_id, "path": path, "order": order,
                         "num_prompt_tokens": len(prompt.ids), "token_ids": tokens, "new_tokens": len(tokens),
                         "wall_s": wall})
            print(f"  {prompt.question_id} {path:<17} {len(tokens):>4} tokens {wall:7.2f} s", flush=True)
    return rows


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per path: runs, tokens, wall time, tokens/s; and how often both paths gave the same tokens."""
    per_path = {}
    for path in PATHS:
        mine = [r for r in rows if r["path"] == path]
        tokens, wall = sum(r["new_tokens"] for r in mine), sum(r["wall_s"] for r in mine)
        per_path[path] = {"runs": len(mine), "new_tokens": tokens, "wall_s": wall, "tokens_per_s": tokens / wall}
    firsts = {(r["question_id"], r["path"]): r["token_ids"] for r in rows if r["order"] in (0, 1)}
    questions = list(dict.fromkeys(r["question_id"] for r in rows))
    same = sum(firsts[(q, PATHS[0])] == firsts[(q, PATHS[1])] for q in questions)
    ratio = per_path[PATHS[0]]["tokens_per_s"] / per_path[PATHS[1]]["tokens_per_s"]
    return {"paths": per_path, "custom_over_specdec": ratio, "same_tokens": same, "prompts": len(questions)}


def print_table(summary: dict[str, Any]) -> None:
    print(f"\n{'path':<18}{'runs':>6}{'new tokens':>12}{'wall s':>9}{'tokens/s':>10}")
    for path, m in summary["paths"].items():
        print(f"{path:<18}{m['runs']:>6}{m['new_tokens']:>12}{m['wall_s']:>9.2f}{m['tokens_per_s']:>10.1f}")
    print(f"custom_generate / specdec.generate tokens/s: {summary['custom_over_specdec']:.3f}; "
          f"same tokens on both paths: {summary['same_tokens']}/{summary['prompts']} prompts")


def main() -> None:
    args = parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    source = specdec.load_model(args.model, dtype=args.dtype)
    model, tok = source.model, source.tokenizer  # a transformers user's model object and tokenizer
    questions = load_questions(args.data, per_category=args.per_category, limit=args.limit)
    prompts = [Prompt(q.question_id, q.turns[0], encode_prompt(tok, q.turns[0], chat=True)) for q in questions]
    runners = make_runners(model, tok, args.method, args.max_new_tokens)
    warmup = Prompt("warm-up", WARMUP_PROMPT, encode_prompt(tok, WARMUP_PROMPT, chat=True))
    for run in runners.values():  # untimed: cost curves, attention plans, kernels
        run(warmup)
    rows = run_prompts(runners, prompts)
    summary = summarize(rows)
    print_table(summary)
    settings = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    record = {"settings": settings, "model": source.name, "dtype": str(model.dtype).removeprefix("torch."),
              "machine": {"fingerprint": machine_fingerprint(model.device), "cores": os.cpu_count(),
                          "torch_threads": torch.get_num_threads(), "platform": platform.platform()},
              "versions": {"torch": torch.__version__, "transformers": _version("transformers")},
              "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "summary": summary, "rows": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {args.out}")


def _version(package: str) -> str:
    from importlib.metadata import version

    return version(package)


if __name__ == "__main__":
    main()
