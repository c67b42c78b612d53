"""What one verification pass costs, against the hardware's floor.

For each context length and tree size: milliseconds per `TargetModel.forward_tree`
pass (median of repeats, the tree trimmed off after each), the weight-read floor
(the model's weight bytes over the memory read bandwidth measured in this run),
their ratio, and a profiler breakdown of one pass into matrix products,
attention, cache handling and the rest.

    .venv/bin/python benchmarks/step_cost.py                       # bundled model, --dtype auto
    .venv/bin/python benchmarks/step_cost.py --contexts 128,2048 --sizes 1,16 --attn auto,sdpa,eager
    .venv/bin/python benchmarks/step_cost.py --dtype bf16 --pack off,on   # prepacked Linear weights or not
    .venv/bin/python benchmarks/step_cost.py --backend llamacpp,llamacpp-exact --no-profile  # on llama.cpp
    .venv/bin/python benchmarks/step_cost.py --backend torch,compiled --pack on --attn auto --no-profile

Run it alone: every number is a wall-clock time. The last stdout line is one
JSON document with every row.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

# The checkout this script sits in, not the installed one: run from a worktree of another
# commit, it times that commit's TargetModel (how the before/after numbers were taken).
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from specdec.backends.torch.packed import packed_view  # noqa: E402
from specdec.backends.torch.target import TargetModel  # noqa: E402
from specdec.models import load_model, machine_fingerprint  # noqa: E402
from specdec.tree import DraftTree  # noqa: E402

MATMUL_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::matmul", "aten::linear", "aten::baddbmm",
              "mkldnn::_linear_pointwise")
ATTENTION_OPS = ("scaled_dot_product", "flash_attention", "aten::_softmax", "aten::softmax")
CACHE_OPS = ("aten::cat", "aten::index", "aten::index_put", "aten::copy_", "aten::slice", "aten::narrow")
BANDWIDTH_BYTES = 1 << 29  # 512 MiB: far beyond any cache level


def read_bandwidth(repeats: int = 5) -> float:
    """Bytes per second a full read of a large buffer reaches with this process's threads (best of repeats)."""
    buffer = torch.ones(BANDWIDTH_BYTES // 4, dtype=torch.float32)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        buffer.sum()
        best = min(best, time.perf_counter() - start)
    return BANDWIDTH_BYTES / best


def tree_of(size: int) -> DraftTree:
    """A tree of `size` nodes shaped like LogitSpec's: a root chain of up to 10, then short branches off the root."""
    parents = [-1]
    for node in range(1, size):
        parents.append(node - 1 if node < min(size, 11) else (0 if (node - 11) % 3 == 0 else node - 1))
    return DraftTree(torch.arange(100, 100 + size), torch.tensor(parents))


def time_pass(target: TargetModel, tree: DraftTree, repeats: int) -> float:
    """Median seconds of forward_tree + trim back to the context."""
    past = target.num_cached
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        target.forward_tree(tree.tokens, tree.parents)
        target.trim(past)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def breakdown(target: TargetModel, tree: DraftTree, repeats: int = 3) -> dict[str, float]:
    """Milliseconds per pass by category, from the profiler's self CPU times."""
    past = target.num_cached
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(repeats):
            target.forward_tree(tree.tokens, tree.parents)
            target.trim(past)
    totals: dict[str, float] = defaultdict(float)
    for event in prof.key_averages():
        name, ms = event.key, event.self_cpu_time_total / 1000 / repeats
        if any(name.startswith(op) for op in MATMUL_OPS):
            totals["matmul"] += ms
        elif any(op in name for op in ATTENTION_OPS):
            totals["attention"] += ms
        elif any(name.startswith(op) for op in CACHE_OPS):
            totals["cache"] += ms
        else:
            totals["other"] += ms
    return {key: round(totals[key], 2) for key in ("matmul", "attention", "cache", "other")}


def run(args: argparse.Namespace) -> list[dict]:
    loaded = load_model(args.model, dtype=args.dtype)
    weight_bytes = sum(p.numel() * p.element_size() for p in loaded.model.parameters())
    bandwidth = read_bandwidth()
    floor_ms = weight_bytes / bandwidth * 1000
    print(f"model {loaded.name} {loaded.dtype}; {machine_fingerprint(loaded.device)}; threads "
          f"{torch.get_num_threads()}; weights {weight_bytes / 1e6:.0f} MB; read bandwidth "
          f"{bandwidth / 1e9:.1f} GB/s; floor {floor_ms:.1f} ms", file=sys.stderr)
    vocab = loaded.model.config.vocab_size
    rows = []
    views = {"off": loaded.model, "on": packed_view(loaded.model)} if "on" in args.pack else {"off": loaded.model}
    for pack, attn in [(pack, attn) for pack in args.pack for attn in args.attn]:
        model = views[pack]
        if attn == "auto":  # the engine's per-shape plan (specdec.backends.torch.attention)
            from specdec.backends.torch.attention import load_or_measure_plan

            target = TargetModel(model, attention=load_or_measure_plan(loaded))
        else:
            model.set_attn_implementation(attn)
            target = TargetModel(model)
        for context in args.contexts:
            prompt = torch.randint(0, vocab, (context,), generator=torch.Generator().manual_seed(context))
            target.prefill(prompt)
            for size in args.sizes:
                tree = tree_of(size)
                time_pass(target, tree, 2)  # warm-up
                ms = time_pass(target, tree, args.repeats) * 1000
                row = {"pack": pack, "attn": attn, "context": context, "nodes": size, "ms": round(ms, 2),
                       "floor_ms": round(floor_ms, 2), "ratio": round(ms / floor_ms, 2)}
                if not args.no_profile:
                    row.update(breakdown(target, tree))
                rows.append(row)
                print(json.dumps(row), file=sys.stderr)
    for model in views.values():
        model.set_attn_implementation("sdpa")
    return rows


def run_backend(args: argparse.Namespace, backend: str, bandwidth: float) -> list[dict]:
    """The same passes on another backend, through what the cost curve times (`verifier.timing_target`):
    llama.cpp's (the model's GGUF file; `-exact`: exact=on, one-token passes padded; its floor: the
    GGUF file read once) or the compiled pass (`specdec.backends.compiled`; its floor: the weights read once;
    warmed on every shape before timing, so compiling is not timed). No profiler breakdown."""
    from llamacpp_bench import backend_settings

    from specdec.backends.registry import timing_target
    from specdec.backends.torch.packed import pack_of, verify_model

    loaded = load_model(args.model, dtype=args.dtype, **backend_settings(backend))
    if loaded.backend == "llamacpp":
        floor_ms = loaded.gguf_path.stat().st_size / bandwidth * 1000
    else:  # the tensors the verified model holds: 4-bit ones under pack=int4, else the model's own
        model = verify_model(loaded) if pack_of(loaded) == "int4" else loaded.model
        tensors = {id(t): t for t in (*model.parameters(), *model.buffers())}.values()
        floor_ms = sum(t.numel() * t.element_size() for t in tensors) / bandwidth * 1000
    target = timing_target(loaded)
    vocab = loaded.model.config.vocab_size
    rows = []
    for context in args.contexts:
        target.prefill(torch.randint(0, vocab, (context,), generator=torch.Generator().manual_seed(context)))
        for size in args.sizes:
            tree = tree_of(size)
            time_pass(target, tree, 2)
            ms = time_pass(target, tree, args.repeats) * 1000
            row = {"pack": backend, "attn": "llama.cpp" if loaded.backend == "llamacpp" else "eager", "context": context, "nodes": size, "ms": round(ms, 2),
                   "floor_ms": round(floor_ms, 2), "ratio": round(ms / floor_ms, 2)}
            rows.append(row)
            print(json.dumps(row), file=sys.stderr)
    if hasattr(target, "close"):
        target.close()
    return rows


def print_table(rows: list[dict]) -> None:
    keys = [k for k in ("pack", "attn", "context", "nodes", "ms", "floor_ms", "ratio", "matmul", "attention", "cache", "other")
            if k in rows[0]]
    print("| " + " | ".join(keys) + " |")
    print("|" + "---|" * len(keys))
    for row in rows:
        print("| " + " | ".join(str(row[k]) for k in keys) + " |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--contexts", default="128,512,2048", type=lambda s: [int(x) for x in s.split(",")])
    parser.add_argument("--sizes", default="1,4,16,64", type=lambda s: [int(x) for x in s.split(",")])
    parser.add_argument("--attn", default="sdpa", type=lambda s: s.split(","), help="sdpa, eager, auto (the engine's per-shape plan); comma list")
    parser.add_argument("--pack", default="off", type=lambda s: s.split(","), help="off, on (specdec.backends.torch.packed); comma list")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--no-profile", action="store_true")
    parser.add_argument("--backend", default="torch", type=lambda s: s.split(","),
                        help="torch, compiled, llamacpp, llamacpp-exact, torch-int4, compiled-int4 (pack=int4) (its rows "
                             "say so in the pack column); comma list")
    args = parser.parse_args()
    rows = run(args) if "torch" in args.backend else []
    bandwidth = read_bandwidth()
    for backend in [b for b in args.backend if b != "torch"]:
        rows += run_backend(args, backend, bandwidth)
    print_table(rows)
    print(json.dumps({"rows": rows, "torch": torch.__version__, "threads": torch.get_num_threads()}))


if __name__ == "__main__":
    main()
