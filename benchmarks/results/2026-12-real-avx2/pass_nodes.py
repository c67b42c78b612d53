"""A pass's time by tree size on the default path: the bundled model, 512 tokens of context, a star tree.

    [XDG_CACHE_HOME=...] .venv/bin/python benchmarks/results/2026-12-real-avx2/pass_nodes.py 1,2,4,8,16 [REPEATS]

Runs from a checkout's root (its `src` first on the path, so two checkouts can alternate, each with its own
XDG_CACHE_HOME and so its own extension build). Prints the fastest of REPEATS (default 10) per size, in ms.
"""

import sys
import time

sys.path.insert(0, "src")
import torch  # noqa: E402

from specdec.backends.registry import load_model  # noqa: E402
from specdec.backends.torch.rows import BatchedTarget  # noqa: E402
from specdec.engine.costs import _probe_parents  # noqa: E402
from specdec.engine.loop import Engine  # noqa: E402
from specdec.tree import DraftTree  # noqa: E402

CONTEXT = 512


def main(sizes: list[int], repeats: int) -> None:
    loaded = load_model("smollm2-135m")
    rows = BatchedTarget(Engine(loaded).target)
    vocab = loaded.model.config.vocab_size
    generator = torch.Generator().manual_seed(0)
    rows.add(torch.randint(0, vocab, (CONTEXT,), generator=generator).tolist())
    for n in sizes:
        tree = DraftTree(torch.randint(0, vocab, (n,), generator=generator), _probe_parents(n))
        best = float("inf")
        for _ in range(repeats):
            start = time.perf_counter()
            rows.verify_trees([tree])
            best = min(best, time.perf_counter() - start)
            rows.commit([[0]])
            rows.truncate(0, CONTEXT)
        print(n, round(best * 1e3, 2), "ms", flush=True)


if __name__ == "__main__":
    main([int(s) for s in sys.argv[1].split(",")], int(sys.argv[2]) if len(sys.argv) > 2 else 10)
