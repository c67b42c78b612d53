"""The 8-bit-activation block products per path: AVX2 against AVX-VNNI (avx512_vnni for reference).

SmolLM2-135M's layer products (qkv, o, gate+up, down), 4-bit blocks (the layers) and 8-bit blocks (Q8_0's form),
at 1 / 4 / 8 rows; microseconds summed over the shapes, each the best of 7 rounds x 100 calls, the paths
interleaved in every round; one thread. Run it alone, on a CPU that has every path named in PATHS:

    .venv/bin/python benchmarks/results/2026-11-avx2-kernels/avx_vnni_products.py
"""

from __future__ import annotations

import time

import torch

from specdec.kernels import q4_i8, q4_kernel

SHAPES = {"qkv": (960, 576), "o": (576, 576), "gate+up": (3072, 576), "down": (576, 1536)}
PATHS = ["avx2", "avx_vnni", "avx512_vnni"]


def best_us(product, x: torch.Tensor, form: tuple, path: str, best: float) -> float:  # noqa: ANN001 - a torch op
    for _ in range(5):
        product(x, *form, path)
    start = time.perf_counter()
    for _ in range(100):
        product(x, *form, path)
    return min(best, (time.perf_counter() - start) / 100 * 1e6)


def main() -> None:
    assert q4_kernel.load_extension(), q4_kernel.unavailable_reason()
    torch.set_num_threads(1)
    generator = torch.Generator().manual_seed(0)
    for bits in (4, 8):
        product = torch.ops.specdec_q4.q4_linear if bits == 4 else torch.ops.specdec_q4.q8_linear
        for rows in (1, 4, 8):
            total = dict.fromkeys(PATHS, 0.0)
            for n, k in SHAPES.values():
                if bits == 4:
                    q = torch.randint(0, 16, (n, k), generator=generator)
                    form = q4_i8.interleave(q, torch.rand(n, k // 32).half(), torch.rand(n, k // 32).half())
                else:
                    form = q4_i8.interleave8(torch.randint(-128, 128, (n, k), generator=generator),
                                             torch.rand(n, k // 32).half())
                x = torch.randn(rows, k).to(torch.bfloat16)
                best = dict.fromkeys(PATHS, float("inf"))
                for _ in range(7):
                    for path in PATHS:
                        best[path] = best_us(product, x, form, path, best[path])
                for path in PATHS:
                    total[path] += best[path]
            times = "  ".join(f"{path} {total[path]:.1f} us" for path in PATHS)
            print(f"{bits}-bit rows={rows}: {times}  avx2/avx_vnni {total['avx2'] / total['avx_vnni']:.2f}x", flush=True)


if __name__ == "__main__":
    main()
