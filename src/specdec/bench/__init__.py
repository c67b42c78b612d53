"""Spec-Bench runner: several decoding methods on the same prompts, timed fairly, reported side by side.

    from specdec.bench import BenchConfig, run_bench
    summary = run_bench(BenchConfig(methods=("plain", "hf-greedy", "pld"), per_category=1))
    print(summary.to_dict())

    # your own transformers model object and tokenizer, as they are (config.model is then not loaded)
    summary = run_bench(BenchConfig(methods=("plain", "logitspec")), loaded=specdec.load_model(model, tokenizer=tok))

Modules: `config` (settings, validated before any model loads), `records` (one
timed generation and its row), `baselines` (transformers' own generate as a
reference), `runner` (warm-up, interleaving, the loop), `metrics` (speedup,
MAT, exact match from the rows), `report` (results folder, plots, manifest).
"""

from specdec.bench.config import BenchConfig, BenchConfigError, split_method_list
from specdec.bench.metrics import BenchSummary
from specdec.bench.runner import run_bench

__all__ = ["BenchConfig", "BenchConfigError", "BenchSummary", "run_bench", "split_method_list"]
