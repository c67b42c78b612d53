"""In-process A/B of a step's host time (step less the pass): 'new' (this checkout) against 'old' (the top ids read by
the proposers themselves, the numpy recycle table, a fused tree pass's three key tensors), per generation in turn,
each with a fresh recycle table of its kind, so both decode the same trees (the outputs are checked equal).

Usage: python inprocess_ab.py METHOD ROUNDS old,new (bundled SmolLM2, bf16, three chat prompts, 128 tokens; the
first round dropped). Prints medians over generations, ms a step. 'mid': the new table and keys, the old tops."""
import dataclasses
import sys
import threading
import time

import numpy as np
import torch
from specdec.backends.torch import fused
from specdec.engine.generation import GenerationConfig
from specdec.engine.loop import Engine
from specdec.models import load_model
from specdec.prompts import encode_prompt
from specdec.proposers import parse_method
import specdec.engine.batch as B
from specdec.engine import verify as V
from specdec.backends.registry import top_tokens
class OldTable:
    def __init__(self, vocab_size, k):
        self.vocab_size, self.k = vocab_size, k
        self._successors = np.full((vocab_size, k), -1, dtype=np.int32)
        self._lock = threading.Lock()
    def update(self, tokens, logits, tops=None):
        rows = tokens.cpu().numpy() if isinstance(tokens, torch.Tensor) else np.asarray(tokens)
        if logits.dim() != 2 or logits.shape[0] != rows.shape[0]: raise ValueError
        width = min(self.k, self.vocab_size)
        if tops is not None and tops.shape == (rows.shape[0], tops.shape[1]) and tops.shape[1] >= width:
            top = tops[:, :width]
        else:
            top = top_tokens(logits, width).cpu().numpy()
        with self._lock:
            self._successors[rows, :width] = top
    def successors(self, token):
        with self._lock:
            row = self._successors[token].tolist()
        return [t for t in row if t >= 0]
class old_recycle: RecycleTable = OldTable
from specdec.proposers.recycle import RecycleTable as NewTable
new_of_trees = fused.KeySequences.of_trees.__func__
def old_of_trees(cls, trees, lengths, width):
    lines = [[[start + node for node in line] for line in tree.ancestor_lines]
             + [[start + pad] for pad in range(tree.num_nodes, width)]
             for tree, start in zip(trees, lengths, strict=True)]
    longest = max(len(line) for row in lines for line in row)
    tail = [[slot for line in row for slot in line + [0] * (longest - len(line))] for row in lines]
    counts = [[len(line) for line in row] for row in lines]
    starts = torch.tensor(lengths, dtype=torch.int64)[:, None].expand(-1, width).contiguous()
    return cls(starts, torch.tensor(tail, dtype=torch.int64), torch.tensor(counts, dtype=torch.int64))
new_verify = V.verify
def old_verify(target, trees, draws, one_transfer=None, tops=None, every_node=None):
    return new_verify(target, trees, draws, one_transfer, None)
passes = [0.0]
untimed = fused.FusedDecoder.run
def timed_run(self, *a, **k):
    s = time.perf_counter()
    try: return untimed(self, *a, **k)
    finally: passes[0] += time.perf_counter() - s
fused.FusedDecoder.run = timed_run
def use(variant):
    B.verify = old_verify if variant in ("old", "mid") else new_verify
    fused.KeySequences.of_trees = classmethod(old_of_trees if variant == "old" else new_of_trees)
PROMPTS = ("Write a short story about a robot who learns to paint.",
    "Summarize: the cat sat on the mat. The cat sat on the mat again, and then the cat slept. Then the dog came.",
    "Write a python function that returns the n-th fibonacci number, with a docstring and tests.")
loaded = load_model("smollm2-135m", dtype="bf16")
prompts = [encode_prompt(loaded.tokenizer, t, chat=True) for t in PROMPTS]
engine, config = Engine(loaded), GenerationConfig(max_new_tokens=128, ignore_eos=True)
method, rounds = sys.argv[1], int(sys.argv[2])
VARIANTS = sys.argv[3].split(",")
res = {v: [] for v in VARIANTS}
outs = {}
for r in range(rounds):
    for i, p in enumerate(prompts):
        order = VARIANTS if (r + i) % 2 == 0 else VARIANTS[::-1]
        for variant in order:
            use(variant)
            proposer = parse_method(method).build(loaded)
            if getattr(proposer, "sources", None) is not None and proposer.sources.recycle is not None:
                table = (old_recycle.RecycleTable if variant == "old" else NewTable)(49152, proposer.sources.recycle.k)
                proposer.sources = dataclasses.replace(proposer.sources, recycle=table)
            if hasattr(proposer, "table"):
                proposer.table = (old_recycle.RecycleTable if variant == "old" else NewTable)(49152, proposer.table.k)
            passes[0] = 0.0
            s = time.perf_counter()
            out = engine.generate(p, proposer, config)
            wall = time.perf_counter() - s
            n = len(out.stats.steps)
            key = (i, variant)
            if key in outs: assert outs[key] == out.token_ids
            outs[key] = out.token_ids
            if r: res[variant].append(((wall - passes[0]) / n, wall / n, sum(x.draft_s for x in out.stats.steps) / n))
    print("round", r, flush=True)
for i in range(len(prompts)): assert len({tuple(outs[(i, v)]) for v in VARIANTS}) == 1
for v, rows in res.items():
    host, step, prop = (sorted(c)[len(c) // 2] * 1000 for c in zip(*rows))
    print(f"{method} {v}: host {host:.3f} ms, step {step:.3f} ms, propose {prop:.3f} ms (medians of {len(rows)} generations)")
