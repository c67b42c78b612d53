"""The 4-bit block products alone, as the fused pass runs them (8-bit activations), by rows: 60 random [3072, 576]
Q4_1 weights in the interleaved layout (66 MB with their scales, the size of SmolLM2's layer weights), each product
called in turn, row counts alternated (ascending and descending in turn). What a row costs where nothing else runs.

Usage: python products_alone.py REPEATS. Prints the fastest and median of the 60 calls by row count."""

import sys
import time

import torch

from specdec.kernels import q4_i8, q4_kernel

ROWS = (1, 2, 4, 8, 16)


def main(repeats: int) -> None:
    assert q4_kernel.load_extension(), q4_kernel.unavailable_reason()
    torch.manual_seed(0)
    N, K = 3072, 576
    weights = []
    for _ in range(60):
        q = torch.randint(0, 16, (N, K), dtype=torch.uint8)
        scale, minimum = (torch.rand(N, K // 32) * 0.01).half(), (-torch.rand(N, K // 32) * 0.05).half()
        weights.append(q4_i8.interleave(q, scale, minimum))
    total = sum(qs.numel() + 2 * scale.numel() + 2 * minimum.numel() for qs, scale, minimum in weights)
    inputs = {m: torch.randn(m, K).bfloat16() for m in ROWS}
    samples = {m: [] for m in ROWS}
    for repeat in range(repeats):
        for m in ROWS if repeat % 2 == 0 else ROWS[::-1]:
            start = time.perf_counter()
            for qs, scale, minimum in weights:
                torch.ops.specdec_q4.q4_linear(inputs[m], qs, scale, minimum, None)
            if repeat:
                samples[m].append(time.perf_counter() - start)
    print(f"{total / 1e6:.1f} MB of weights, 60 products, {torch.get_num_threads()} threads")
    fastest_one = min(samples[1])
    for m in ROWS:
        s = sorted(samples[m])
        print(f"{m:2d} rows: fastest {s[0] * 1e3:.3f} ms (median {s[len(s) // 2] * 1e3:.3f}), {total / s[0] / 1e9:.1f} GB/s, "
              f"{(s[0] - fastest_one) * 1e3 / max(m - 1, 1):.3f} ms a row beyond the first")


if __name__ == "__main__":
    main(int(sys.argv[1]))
