"""The 4-bit GEMM extension against PyTorch's int4 kernel and oneDNN bf16, over a SmolLM2-135M pass.

Why: a verification pass multiplies M = 1..64 rows by every weight; `specdec.kernels.q4_kernel`
reads and dequantizes each 4-bit block once per call and uses it for every row. This times the 210
decoder products of one SmolLM2-135M pass (30 layers of q 576x576, k and v 192x576, o 576x576, gate
and up 1536x576, down 576x1536) and the 49152x576 head, for each row count, with:
- q4: `torch.ops.specdec_q4.q4_linear` (Q4_1 blocks, bf16 activations);
- int4: `aten._weight_int4pack_mm_for_cpu` (what `--pack int4` runs, `specdec.backends.torch.int4`);
- bf16: oneDNN on a prepacked bf16 weight (`mkldnn._linear_pointwise`, what the packed view runs).
All three multiply the same quantized weights. The head also runs as Q8_0 blocks on the 8-bit kernel
(`head q8`: `torch.ops.specdec_q4.q8_linear`, what `--pack int4` runs for a GGUF's Q8_0 head). Every layer has its own buffers, so weights come from
memory as in a real pass, not from cache. Milliseconds per pass (median of --repeats), 2 threads
(--threads).

    .venv/bin/python benchmarks/q4_products.py [--repeats 15] [--rows 1,2,4,8,16,32,64] [--threads 2]

Run it alone: other work on the cores moves the numbers.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from specdec.kernels.q4_kernel import (
    BLOCK,
    dequantize_q4,
    load_extension,
    pack_q4,
    pack_q8,
    unavailable_reason,
    unpack_q4,
)

LAYERS = 30
LAYER_SHAPES = {"q": (576, 576), "k": (192, 576), "v": (192, 576), "o": (576, 576),
                "gate": (1536, 576), "up": (1536, 576), "down": (576, 1536)}  # [N, K]
HEAD_SHAPE = (49152, 576)
KERNELS = ("q4", "int4", "bf16")


def random_q4(rows: int, cols: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Random Q4_1 blocks with the spread of a small model's weights: (qs, scale, minimum)."""
    q = torch.randint(0, 16, (rows, cols))
    scale = torch.rand(rows, cols // BLOCK) * 0.01 + 0.002
    return pack_q4(q, scale, -7.5 * scale)


def products(qs: torch.Tensor, scale: torch.Tensor, minimum: torch.Tensor) -> dict[str, Callable]:
    """One weight, three kernels: name -> f(x [M, K] bf16) -> [M, N]."""
    weight = dequantize_q4(qs, scale, minimum)
    step, low = scale.float(), minimum.float()
    # PyTorch's int4 form: w = (q - 8) * scale + zero, zero = minimum + 8 * scale, [K/32, N, 2] in bf16
    scale_zero = torch.stack([step.T, (low + 8 * step).T], -1).to(torch.bfloat16).contiguous()
    int4 = torch._convert_weight_to_int4pack_for_cpu(unpack_q4(qs).to(torch.int32), 2)
    packed = torch.ops.mkldnn._reorder_linear_weight(weight, None)
    return {
        "q4": lambda x: torch.ops.specdec_q4.q4_linear(x, qs, scale, minimum),
        "int4": lambda x: torch._weight_int4pack_mm_for_cpu(x, int4, BLOCK, scale_zero),
        "bf16": lambda x: torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], ""),
    }


Pass = list[tuple[Callable, int]]  # (product, its input size K), in order


def pass_ms(calls: dict[tuple[str, str], Pass], inputs: dict[int, torch.Tensor],
            repeats: int) -> dict[tuple[str, str], float]:
    """Median milliseconds of running each list of calls once, in order. The lists take turns within
    every repeat (after two warm-up rounds), so a burst of other work on the cores hits them alike."""
    times: dict[tuple[str, str], list[float]] = {name: [] for name in calls}
    for index in range(repeats + 2):
        for name, sequence in calls.items():
            start = time.perf_counter()
            for call, cols in sequence:
                call(inputs[cols])
            if index >= 2:
                times[name].append(time.perf_counter() - start)
    return {name: statistics.median(seconds) * 1e3 for name, seconds in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15, help="timed passes per cell (median)")
    parser.add_argument("--rows", default="1,2,4,8,16,32,64", help="comma-separated row counts")
    parser.add_argument("--threads", type=int, default=2, help="torch.set_num_threads")
    args = parser.parse_args()
    if not load_extension():
        raise SystemExit(unavailable_reason())
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    passes: dict[tuple[str, str], Pass] = {("decoder", name): [] for name in KERNELS}
    for _ in range(LAYERS):
        for rows, cols in LAYER_SHAPES.values():
            for name, call in products(*random_q4(rows, cols)).items():
                passes["decoder", name].append((call, cols))
    for name, call in products(*random_q4(*HEAD_SHAPE)).items():
        passes["head", name] = [(call, HEAD_SHAPE[1])]
    q8, scale8 = pack_q8(torch.randint(-128, 128, HEAD_SHAPE), torch.rand(HEAD_SHAPE[0], HEAD_SHAPE[1] // BLOCK) * 1e-3)
    passes["head", "q8"] = [(lambda x: torch.ops.specdec_q4.q8_linear(x, q8, scale8), HEAD_SHAPE[1])]
    print(f"path {torch.ops.specdec_q4.q4_linear_path()}, {torch.get_num_threads()} threads, "
          f"{len(passes['decoder', 'q4'])} decoder products + head, ms per pass (median of {args.repeats})\n")
    print("| rows | " + " | ".join(f"{part} {name}" for part, name in passes) + " |")
    print("|---:|" + "---:|" * len(passes))
    for rows in [int(r) for r in args.rows.split(",")]:
        inputs = {cols: torch.randn(rows, cols).to(torch.bfloat16) for cols in (576, 1536)}
        ms = pass_ms(passes, inputs, args.repeats)
        print(f"| {rows} | " + " | ".join(f"{ms[cell]:.2f}" for cell in passes) + " |")


if __name__ == "__main__":
    main()
