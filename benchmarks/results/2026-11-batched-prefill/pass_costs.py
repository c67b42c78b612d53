"""A pass's cost by tree size and context length: the cost probe's own runner and star trees, at three contexts.

    .venv/bin/python benchmarks/results/2026-11-batched-prefill/pass_costs.py

SmolLM2-135M on the default path (the exact fused 4-bit pass where the machine has it); per size the fastest of
7 passes, sizes interleaved (`specdec.engine.costs._measure`, what `load_or_measure` caches at 384 tokens).
"""

import sys

sys.path.insert(0, "src")
from specdec.backends.registry import timing_target  # noqa: E402
from specdec.engine.costs import _measure  # noqa: E402
from specdec.models import load_model  # noqa: E402

SIZES = (1, 2, 4, 8, 16)

if __name__ == "__main__":
    loaded = load_model("smollm2-135m")
    print("context " + " ".join(f"{n:>6d}" for n in SIZES) + "  (ms a pass, n nodes)")
    for context in (16, 384, 1024):
        costs, share = _measure(timing_target(loaded), SIZES, 7, context)
        print(f"{context:7d} " + " ".join(f"{1e3 * s:6.2f}" for s in costs.seconds) + f"  cpu share {share:.2f}",
              flush=True)
