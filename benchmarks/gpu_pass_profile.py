"""Where a graphed verification pass's GPU time goes, kernel by kernel, at a few tree sizes.

Why: on a lent H200 the bundled model's pass cost 4.7 ms at one node and 9.3 ms at 8-64 nodes
(docs/results/2026-12-gpu-h200-attention), so LogitSpec's trees pay twice a plain step there, while a
random 1.5B-shaped bf16 model's 64-node pass cost 1.4x its one-node pass. A pass's cost does not depend
on its weights' values, so a random model of the bundled model's shape (its config.json) shows it in one
call, without the 98 MB GGUF.

    python benchmarks/gpu_pass_profile.py CONFIG_DIR --variants fp32:sdpa,fp32:eager,bf16:sdpa --sizes 1,64 --out DIR
    python benchmarks/gpu_pass_profile.py CONFIG_DIR --shape 7b --variants bf16:sdpa,bf16:sdpa:inductor-static

--shape takes gpu_check.py's sizes instead of the config's (a 7B-shaped model's one-node pass cost 2.2x its
weight-read floor on the H200: where that goes, kernel by kernel).

Per variant, a dtype (tf32: fp32 weights, matrix products on TF32 tensor cores), the attention
implementation the graphs run and, with a third field `inductor`, the pass compiled by inductor inside
the graphs (the "compiled" backend on a GPU): the pass-cost curve as the engine times it (graphed on CUDA), then
torch.profiler over ten passes at each size, its table sorted by GPU time appended to OUT/kernels.txt.
Each measurement is appended to OUT/gpu_pass_profile.jsonl as it comes. On a CPU the passes run
eagerly (a dry run).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from gpu_check import SHAPES  # beside this script (run as benchmarks/gpu_pass_profile.py)
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

import specdec
from specdec.backends.registry import rows_of, verify_model
from specdec.backends.torch.graphs import GraphedTarget
from specdec.backends.torch.rows import OneSequence
from specdec.engine.costs import _measure, _probe_parents

SIZES = (1, 2, 4, 8, 16, 32, 64)
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "tf32": torch.float32}  # tf32: fp32, products on TF32


def _add(out: Path, name: str, value: object) -> None:
    print(f"{name}: {json.dumps(value)}", flush=True)
    with open(out / "gpu_pass_profile.jsonl", "a") as f:
        f.write(json.dumps({name: value}) + "\n")


def profile_size(timed, n: int, context: int, out: Path, name: str) -> float:  # noqa: ANN001 - OneSequence
    """Ten passes of n nodes under the profiler; writes the kernel table; returns the mean GPU ms a pass
    (every kernel's own time, summed)."""
    from torch.profiler import ProfilerActivity, profile

    cuda = timed.device.type == "cuda"
    generator = torch.Generator().manual_seed(n)
    probe = (torch.randint(0, int(timed.config.vocab_size), (n,), generator=generator), _probe_parents(n))
    timed.forward_tree(*probe)
    timed.trim(context)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        for _ in range(10):
            timed.forward_tree(*probe)
            timed.trim(context)
        if cuda:
            torch.cuda.synchronize()
    events = prof.key_averages()
    sort = "self_cuda_time_total" if cuda else "self_cpu_time_total"
    with open(out / "kernels.txt", "a") as f:
        f.write(f"== {name}, {n} nodes, ten passes\n{events.table(sort_by=sort, row_limit=25, max_name_column_width=90)}\n")
    own = sum(getattr(e, "self_device_time_total", 0) or getattr(e, "self_cuda_time_total", 0) for e in events)
    return round(own / 10 / 1e3, 3)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config", help="a folder with the model's config.json and its tokenizer")
    parser.add_argument("--variants", default="fp32:sdpa,fp32:eager,bf16:sdpa,bf16:eager",
                        help="dtype:attention[:inductor|:inductor-static],... (the pass compiled first, as the compiled "
                             "backend: sizes dynamic, or one compilation a bucket)")
    parser.add_argument("--sizes", default="1,64", help="tree sizes profiled kernel by kernel")
    parser.add_argument("--shape", choices=sorted(SHAPES), help="another shape's sizes (gpu_check.py's), e.g. 7b")
    parser.add_argument("--context", type=int, default=512)
    parser.add_argument("--out", default="gpu_pass_profile_out")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    config = AutoConfig.from_pretrained(args.config)
    if args.shape:  # the random model takes another shape's sizes (its vocabulary stays the tokenizer's)
        config.update({**SHAPES[args.shape], "head_dim": SHAPES[args.shape]["hidden_size"]
                       // SHAPES[args.shape]["num_attention_heads"]})
    tokenizer = AutoTokenizer.from_pretrained(args.config)
    _add(out, "device", torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu")
    _add(out, "shape", args.shape or "the config's")
    for variant in args.variants.split(","):
        dtype, attention, *compiled = variant.split(":")
        torch.manual_seed(0)
        torch.backends.cuda.matmul.allow_tf32 = dtype == "tf32"
        started = time.perf_counter()
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(config).to(DTYPES[dtype]).eval().requires_grad_(False)
        loaded = specdec.load_model(model, tokenizer=tokenizer)
        inductor = {"inductor": "dynamic", "inductor-static": "static"}[compiled[0]] if compiled else None
        graphed = GraphedTarget(verify_model(loaded), attention=attention, inductor=inductor)
        timed = OneSequence(rows_of(graphed), graphed.config, graphed.device, graphed.max_length)
        costs, _ = _measure(timed, SIZES, 5, args.context)
        _add(out, f"{variant}.pass_ms", {n: round(s * 1e3, 3) for n, s in zip(costs.sizes, costs.seconds, strict=True)})
        gpu = {n: profile_size(timed, n, args.context, out, variant) for n in map(int, args.sizes.split(","))}
        _add(out, f"{variant}.gpu_ms_a_pass", gpu)
        _add(out, f"{variant}.seconds", round(time.perf_counter() - started, 1))
        timed.close()
        del model, loaded, timed, graphed
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
