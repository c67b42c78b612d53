"""Milliseconds per decode step through the whole engine, at batch size one.

`benchmarks/step_cost.py` times the model's pass alone; this times what a user
waits for per step: `Engine.generate` with a proposer that drafts a fixed tree
(plain decoding for one node), so proposal, verification, acceptance, commit and
emission are all in. For each context length and tree size: the median over
repeats of (decode wall time) / (decode steps), prefill excluded.

    .venv/bin/python benchmarks/decode_step.py --dtype bf16
    .venv/bin/python benchmarks/decode_step.py --src ../other-worktree/src   # another commit's engine

Run it alone: every number is a wall-clock time. The last stdout line is one
JSON document with every row.
"""

from __future__ import annotations

import argparse
import inspect
import json
import statistics
import sys
from pathlib import Path

import torch

DEFAULT_SRC = Path(__file__).resolve().parents[1] / "src"


class FixedTree:
    """Drafts the same `size`-node tree below every root (a chain of up to 8, then branches off the root)."""

    prunable = True

    def __init__(self, size: int, draft_tree: type) -> None:
        self.size, self.draft_tree = size, draft_tree

    def begin(self, prompt_ids: list[int]) -> None:
        pass

    def propose(self, ctx: object) -> object:
        size = min(self.size, ctx.max_depth + 1)
        parents = [-1] + [node - 1 if node < 9 else 0 for node in range(1, size)]
        tokens = [ctx.token_ids[-1]] + [100 + node for node in range(1, size)]
        return self.draft_tree(torch.tensor(tokens), torch.tensor(parents))

    def observe(self, result: object) -> None:
        pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--src", type=Path, default=DEFAULT_SRC, help="the specdec sources to time")
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--dtype", default="bf16")
    parser.add_argument("--contexts", default="128,512,2048", type=lambda s: [int(x) for x in s.split(",")])
    parser.add_argument("--sizes", default="1,16", type=lambda s: [int(x) for x in s.split(",")])
    parser.add_argument("--steps", type=int, default=32, help="decode steps per generation")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--exact", default="off", help="batch-invariant verification: off, on (newer sources)")
    args = parser.parse_args()
    sys.path.insert(0, str(args.src.resolve()))
    from specdec.engine.loop import Engine
    from specdec.models import load_model, machine_fingerprint
    from specdec.tree import DraftTree

    try:
        from specdec.engine.generation import GenerationConfig
    except ImportError:  # sources from before the generation types had a module of their own
        from specdec.engine.loop import GenerationConfig

    exact = {"exact": args.exact} if "exact" in inspect.signature(load_model).parameters else {}
    engine = Engine(load_model(args.model, dtype=args.dtype, **exact))
    print(f"{args.src}; {machine_fingerprint(engine.target.device)}; threads {torch.get_num_threads()}",
          file=sys.stderr)
    vocab = engine.target.config.vocab_size
    config = GenerationConfig(max_new_tokens=args.steps + 1, ignore_eos=True)
    rows = []
    for context in args.contexts:
        prompt = torch.randint(0, vocab, (context,), generator=torch.Generator().manual_seed(context)).tolist()
        for size in args.sizes:
            per_step = []
            for _ in range(args.repeats + 1):  # the first is a warm-up
                stats = engine.generate(prompt, FixedTree(size, DraftTree), config).stats
                per_step.append((stats.wall_time_s - stats.prefill_s) / stats.num_decode_steps)
            ms = statistics.median(per_step[1:]) * 1000
            rows.append({"context": context, "nodes": size, "ms_per_step": round(ms, 2)})
            print(json.dumps(rows[-1]), file=sys.stderr)
    print("| context | nodes | ms per step |\n|---|---|---|")
    for row in rows:
        print(f"| {row['context']} | {row['nodes']} | {row['ms_per_step']} |")
    print(json.dumps({"src": str(args.src), "rows": rows, "torch": torch.__version__}))


if __name__ == "__main__":
    main()
