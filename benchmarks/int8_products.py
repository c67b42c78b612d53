"""Weight-only int8 and int4 against prepacked bf16, per SmolLM2-135M product shape and row count.

Why: a decode step on the torch backend spends about half its time in 211 small products; an int8
weight halves the bytes each reads. PyTorch's own CPU kernel for it (`aten._weight_int8pack_mm`,
bf16 activations, per-channel scales) against the oneDNN product the packed view runs
(`mkldnn._linear_pointwise` on a prepacked weight), and `specdec.backends.torch.int4.Int4Linear` (4-bit groups of 32,
`aten._weight_int4pack_mm_for_cpu`: what `--pack int4` runs). Microseconds per call, best of 5 x 200 calls on
one random weight per shape (in cache, except the 57 MB head): a lower bound for both.

    .venv/bin/python benchmarks/int8_products.py [--rows 1,2,4,16]

Run it alone.
"""

from __future__ import annotations

import argparse
import functools
import time

import torch

from specdec.backends.torch.int4 import Int4Linear

SHAPES = {"qkv": (960, 576), "o": (576, 576), "gate": (1536, 576), "down": (576, 1536), "head": (49152, 576)}


def best_us(fn, calls: int = 200) -> float:
    for _ in range(10):
        fn()
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - start) / calls)
    return best * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="1,2,4,16", help="comma-separated row counts")
    row_counts = [int(r) for r in parser.parse_args().rows.split(",")]
    torch.manual_seed(0)
    print("| rows | " + " | ".join(f"{name} bf16 | {name} int8 | {name} int4" for name in SHAPES) + " |")
    print("|---:|" + "---:|" * (3 * len(SHAPES)))
    for rows in row_counts:
        cells = []
        for out_features, in_features in SHAPES.values():
            weight = torch.randn(out_features, in_features, dtype=torch.bfloat16) / 30
            x = torch.randn(rows, in_features, dtype=torch.bfloat16)
            packed = torch.ops.mkldnn._reorder_linear_weight(weight, None)
            scales = weight.float().abs().amax(1) / 127
            quantized = (weight.float() / scales[:, None]).round().to(torch.int8)
            scales = scales.to(torch.bfloat16)
            bf16 = functools.partial(torch.ops.mkldnn._linear_pointwise, x, packed, None, "none", [], "")
            cells.append(best_us(bf16))
            cells.append(best_us(functools.partial(torch.ops.aten._weight_int8pack_mm, x, quantized, scales)))
            linear = torch.nn.Linear(in_features, out_features, bias=False, dtype=torch.bfloat16)
            linear.weight.data = weight
            cells.append(best_us(functools.partial(Int4Linear(linear), x)))
        print(f"| {rows} | " + " | ".join(f"{us:.0f}" for us in cells) + " |")


if __name__ == "__main__":
    main()
