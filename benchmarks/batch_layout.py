"""Padded rows or packed tokens? The cost of one batched verification pass, both ways, on this machine.

    .venv/bin/python benchmarks/batch_layout.py [--rows 8] [--width 4] [--context 512] [--dtype auto]

padded (what specdec.backends.torch.rows does): B rows x W tokens, each row attending over its own `context`
entries (one [B, W] forward). packed (the alternative): the same B*W tokens as one sequence over
one cache holding all rows' entries (B*context), a block mask keeping each token on its own row's
entries, i.e. every query scores every row's keys. Reports the median of --repeats passes each,
interleaved; last stdout line one JSON document.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch

from specdec.backends.torch.kv_cache import preallocated_cache
from specdec.backends.torch.rows import BatchedTarget
from specdec.backends.torch.target import TargetModel
from specdec.models import load_model
from specdec.tree import DraftTree


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--rows", type=int, default=8)
    p.add_argument("--width", type=int, default=4)
    p.add_argument("--context", type=int, default=512)
    p.add_argument("--repeats", type=int, default=15)
    args = p.parse_args(argv)
    loaded = load_model(args.model, dtype=args.dtype)
    single = TargetModel(loaded.model, attention=None)
    rows, width, context = args.rows, args.width, args.context
    prompt = [int(t) % 1000 + 100 for t in range(context)]
    padded = BatchedTarget(single)
    for _ in range(rows):
        padded.add(prompt)
    trees = [DraftTree.chain(5, [6] * (width - 1)) for _ in range(rows)]
    packed_cache = preallocated_cache(single.num_layers)
    with torch.inference_mode():
        single.run(torch.tensor([prompt * rows]), None, None, packed_cache, 0)  # fills B*context entries
    total = rows * context
    allowed = torch.zeros(rows * width, total + rows * width, dtype=torch.bool)
    for b in range(rows):  # row b's tokens see row b's context and their own causal chain
        allowed[b * width : (b + 1) * width, b * context : (b + 1) * context] = True
        chain = torch.tril(torch.ones(width, width, dtype=torch.bool))
        allowed[b * width : (b + 1) * width, total + b * width : total + (b + 1) * width] = chain
    mask = torch.zeros(allowed.shape, dtype=single.dtype).masked_fill_(~allowed, torch.finfo(single.dtype).min)
    ids = torch.full((1, rows * width), 7)
    positions = torch.arange(context, context + width).repeat(rows)[None]

    def run_padded() -> None:
        padded.verify_trees(trees)
        padded.commit([[0]] * rows)
        padded.lengths = [context] * rows  # back to the same state every repeat

    def run_packed() -> None:
        with torch.inference_mode():
            single.run(ids, positions, mask[None, None], packed_cache, total)
        for layer in packed_cache.layers:
            layer.truncate(total)

    times: dict[str, list[float]] = {"padded": [], "packed": []}
    for _ in range(args.repeats + 2):
        for name, fn in (("padded", run_padded), ("packed", run_packed)):
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    result = {name: statistics.median(values[2:]) for name, values in times.items()}
    result.update(rows=rows, width=width, context=context, dtype=str(loaded.model.dtype))
    print(f"padded {1000 * result['padded']:.1f} ms, packed {1000 * result['packed']:.1f} ms", file=sys.stderr)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
