"""Aggregate tokens/s inside vLLM: no speculation, vLLM's ngram and suffix, our prompt lookup and LogitSpec.

For each method and each concurrency c (default 1, 8, 32), a fresh offline
engine (`vllm.LLM`, `max_num_seqs=c`, so c requests are in flight under
continuous batching) generates greedily for the Spec-Bench questions (first
turn, chat template; the first 10 of each category of the packaged data): one
warm-up call, then one timed `generate` over all prompts. Reported per row:
generated tokens over wall seconds, vLLM's own speculative counters (drafts,
draft tokens, accepted tokens) for the timed call, and the share of prompts
whose output equals the no-speculation output at the same concurrency
(lossless at fp32: 1.0 expected).

Each method runs in a child process of its own (this script with --worker),
started with vLLM's recommended LD_PRELOAD of the environment's Intel OpenMP
(`libiomp5.so`) when it is there; a method whose engine fails (vLLM's `suffix`
needs the `arctic-inference` package) records the exact error and the others go on.

    make vllm-env
    .venv-vllm/bin/python benchmarks/vllm_bench.py                          # the full run: alone on the machine
    .venv-vllm/bin/python benchmarks/vllm_bench.py --limit 2 --max-tokens 8 --concurrency 1,2 --eager  # smoke

`--in-process` keeps each engine in its child process (VLLM_ENABLE_V1_MULTIPROCESSING=0; one
child per concurrency): on 2 cores vLLM's default second engine process made every method ~1.5x
slower and far noisier. Every number is a wall-clock time: run it alone. The last stdout line is one
JSON document (settings and every row); a table goes to stderr.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import os
import platform
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

METHODS = ("none", "ngram", "suffix", "pld", "logitspec")
CUSTOM = {"pld": "PromptLookupProposer", "logitspec": "LogitSpecProposer"}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2-135m", help="bundled/pulled name (specdec models path) or HF folder")
    p.add_argument("--methods", default=",".join(METHODS), help=f"comma-separated, of {', '.join(METHODS)}")
    p.add_argument("--concurrency", default="1,8,32", help="comma-separated max_num_seqs values")
    p.add_argument("--per-category", type=int, default=10, help="first N Spec-Bench questions per category")
    p.add_argument("--limit", type=int, default=None, help="at most N prompts in all (smoke runs)")
    p.add_argument("--max-tokens", type=int, default=128, help="new tokens per request")
    p.add_argument("--num-speculative-tokens", type=int, default=5, help="draft length for every method")
    p.add_argument("--ngram-max", type=int, default=3, help="vLLM ngram: prompt_lookup_max (ours: max_ngram 3)")
    p.add_argument("--ngram-min", type=int, default=1, help="vLLM ngram: prompt_lookup_min (ours: min_ngram 1)")
    p.add_argument("--dtype", default="float32", help="vLLM dtype (float32: exact, so outputs must match)")
    p.add_argument("--max-model-len", type=int, default=4096)
    p.add_argument("--kv-cache-gib", type=float, default=4.0, help="KV cache size (kv_cache_memory_bytes)")
    p.add_argument("--eager", action="store_true", help="enforce_eager (no torch.compile: faster start, slower steps)")
    p.add_argument("--no-preload", action="store_true", help="do not LD_PRELOAD the environment's libiomp5.so")
    p.add_argument("--in-process", action="store_true",
                   help="engine in the worker process (VLLM_ENABLE_V1_MULTIPROCESSING=0)")  # fmt: skip
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)  # internal: run one method, print JSON
    return p.parse_args(argv)


def model_folder(name: str) -> str:
    if Path(name).is_dir():
        return name
    from specdec.models import local_folder

    return str(local_folder(name))


def load_prompts(folder: str, per_category: int, limit: int | None) -> list[str]:
    """Chat-formatted first turns of the packaged Spec-Bench questions."""
    from transformers import AutoTokenizer

    from specdec.data import load_questions

    questions = load_questions(per_category=per_category, limit=limit)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    return [
        tokenizer.apply_chat_template([{"role": "user", "content": q.turns[0]}], add_generation_prompt=True, tokenize=False)
        for q in questions
    ]


def speculative_config(method: str, args: argparse.Namespace) -> dict[str, Any] | None:
    k = args.num_speculative_tokens
    if method == "none":
        return None
    if method == "ngram":
        return {"method": "ngram", "num_speculative_tokens": k,
                "prompt_lookup_max": args.ngram_max, "prompt_lookup_min": args.ngram_min}  # fmt: skip
    if method == "suffix":
        return {"method": "suffix", "num_speculative_tokens": k}
    return {"method": "custom_class", "model": f"specdec.integrations.vllm.{CUSTOM[method]}", "num_speculative_tokens": k}


def spec_counters(llm: Any) -> dict[str, float]:
    """vLLM's speculative-decoding counters (process-wide, cumulative): name -> value."""
    totals: dict[str, float] = {}
    for metric in llm.get_metrics():
        if metric.name.startswith("vllm:spec_decode") and hasattr(metric, "value"):
            totals[metric.name] = totals.get(metric.name, 0.0) + float(metric.value)
    return totals


def _drafter_counters(worker: Any) -> dict[str, float]:
    """Runs in the engine: our proposer's counters (steps, propose_s, ...), {} for other drafters."""
    return dict(getattr(getattr(worker.model_runner, "drafter", None), "counters", {}))


def proposer_counters(llm: Any) -> dict[str, float]:
    """Our proposer's cumulative counters (warm-up included), where the engine lets us read them."""
    try:
        return llm.collective_rpc(_drafter_counters)[0]
    except Exception as error:  # a multiprocess engine may refuse to ship a function: say so, go on
        return {"unreadable": type(error).__name__}


def time_one(args: argparse.Namespace, method: str, concurrency: int, folder: str, prompts: list[str]) -> dict:
    """One engine, one warm-up call, one timed call over all prompts."""
    from vllm import LLM, SamplingParams

    llm = LLM(
        model=folder, dtype=args.dtype, max_model_len=args.max_model_len, max_num_seqs=concurrency,
        kv_cache_memory_bytes=int(args.kv_cache_gib * (1 << 30)), enforce_eager=args.eager,
        speculative_config=speculative_config(method, args), disable_log_stats=False, seed=0,
    )  # fmt: skip
    llm.generate(prompts[: min(2, len(prompts))], SamplingParams(temperature=0.0, max_tokens=8), use_tqdm=False)
    before = spec_counters(llm)
    start = time.perf_counter()
    outputs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=args.max_tokens), use_tqdm=False)
    wall = time.perf_counter() - start
    after = spec_counters(llm)
    ours = proposer_counters(llm)
    token_ids = [list(out.outputs[0].token_ids) for out in outputs]
    num_tokens = sum(len(ids) for ids in token_ids)
    del llm
    gc.collect()
    return {
        "method": method, "concurrency": concurrency, "num_prompts": len(prompts), "num_tokens": num_tokens,
        "wall_s": round(wall, 3), "tokens_per_s": round(num_tokens / wall, 2),
        "spec": {name.removeprefix("vllm:"): after[name] - before.get(name, 0.0) for name in after},
        "proposer": ours,
        "token_ids": token_ids,  # dropped from the output once compared with "none" (mark_exact_matches)
        "token_ids_sha256": hashlib.sha256(json.dumps(token_ids).encode()).hexdigest(),  # across runs
    }  # fmt: skip


def run_worker(args: argparse.Namespace) -> dict:
    """Every concurrency for one method (--worker); an engine error ends the method with that error."""
    method = args.worker
    folder = model_folder(args.model)
    prompts = load_prompts(folder, args.per_category, args.limit)
    rows = []
    for concurrency in [int(c) for c in args.concurrency.split(",")]:
        try:
            rows.append(time_one(args, method, concurrency, folder, prompts))
        except Exception as error:
            exact = "".join(traceback.format_exception_only(type(error), error)).strip()
            rows.append({"method": method, "concurrency": concurrency, "error": exact})
            break
    return {"method": method, "rows": rows}


def child_env(no_preload: bool, in_process: bool = False) -> tuple[dict[str, str], str]:
    env = dict(os.environ)
    if in_process:
        env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    iomp = Path(sys.prefix) / "lib" / "libiomp5.so"
    if no_preload or not iomp.is_file():
        return env, env.get("LD_PRELOAD", "")
    env["LD_PRELOAD"] = ":".join(filter(None, [str(iomp), env.get("LD_PRELOAD", "")]))
    return env, env["LD_PRELOAD"]


def run_method(method: str, argv: list[str], env: dict[str, str]) -> list[dict]:
    """This script as a child process for one method; its rows, or one row with the error it died of."""
    done = subprocess.run([sys.executable, __file__, *argv, "--worker", method], env=env, capture_output=True, text=True)
    lines = done.stdout.strip().splitlines()
    if done.returncode == 0 and lines:
        return json.loads(lines[-1])["rows"]
    tail = [line for line in done.stderr.strip().splitlines() if line.strip()][-3:]
    return [{"method": method, "error": f"child exited with {done.returncode}: " + " | ".join(tail)}]


def mark_exact_matches(rows: list[dict]) -> None:
    """Per row: the share of prompts whose tokens equal plain decoding's at the same concurrency."""
    plain = {row["concurrency"]: row["token_ids"] for row in rows if row["method"] == "none" and "token_ids" in row}
    for row in rows:
        reference = plain.get(row.get("concurrency"))
        if "token_ids" in row and reference is not None:
            same = sum(a == b for a, b in zip(row["token_ids"], reference, strict=True))
            row["exact_match"] = round(same / len(reference), 4)
        row.pop("token_ids", None)


def settings(args: argparse.Namespace, preload: str) -> dict:
    import vllm

    cpu = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                if ln.startswith("model name")), platform.processor())  # fmt: skip
    return {
        "vllm": vllm.__version__, "model": args.model, "dtype": args.dtype, "max_tokens": args.max_tokens,
        "num_speculative_tokens": args.num_speculative_tokens, "ngram": [args.ngram_min, args.ngram_max],
        "per_category": args.per_category, "limit": args.limit, "eager": args.eager, "ld_preload": preload,
        "in_process": args.in_process,
        "cpu": cpu, "num_cpus": os.cpu_count(),
        "specdec_vllm_env": {k: v for k, v in os.environ.items() if k.startswith("SPECDEC_VLLM_")},
    }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if args.worker:
        print(json.dumps(run_worker(args)), flush=True)
        return 0
    env, preload = child_env(args.no_preload, args.in_process)
    # In-process, a second engine in one process can fail (vLLM's ngram: "'_lib_fn_wrapper' object has
    # no attribute 'get'"): then each concurrency gets a child process of its own.
    levels = args.concurrency.split(",") if args.in_process else [args.concurrency]
    rows: list[dict] = []
    for method in [m.strip() for m in args.methods.split(",") if m.strip()]:
        print(f"vllm_bench: {method} ...", file=sys.stderr, flush=True)
        for level in levels:
            rows.extend(run_method(method, [*argv, "--concurrency", level], env))
    mark_exact_matches(rows)
    for row in rows:
        shown = row.get("error") or f"{row['tokens_per_s']:>8.1f} tokens/s  exact {row.get('exact_match', '-')}"
        print(f"{row['method']:<10} c={row.get('concurrency', '-')!s:<3} {shown}", file=sys.stderr)
    print(json.dumps({"settings": settings(args, preload), "results": rows}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
