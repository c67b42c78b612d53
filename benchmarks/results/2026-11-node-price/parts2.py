# ruff: noqa: E402
"""Exclusive wall time a step of the logitspec proposer's parts (held-out turns, floor on)."""

import collections
import os
import sys
import time

sys.path.insert(0, os.environ.get("SRC", "src"))
sys.path.insert(0, "benchmarks")
from batch_steps import held_out_prompts

from specdec.kernels.q4_kernel import load_extension

load_extension()
from specdec.engine import loop
from specdec.engine.floor import Floor
from specdec.engine.generation import GenerationConfig
from specdec.models import load_model
from specdec.proposers import ngram_index as NI
from specdec.proposers import parse_method
from specdec.proposers import pld as PLD
from specdec.proposers import recycle as RC
from specdec.proposers.logitspec import plan as PL
from specdec.proposers.logitspec import proposer as P
from specdec.proposers.logitspec import retrieval as R

spent = collections.Counter()
inner = []


def timed(name, function):
    def wrapper(*a, **k):
        start = time.perf_counter()
        inner.append(0.0)
        try:
            return function(*a, **k)
        finally:
            took, nested = time.perf_counter() - start, inner.pop()
            spent[name] += took - nested
            if inner:
                inner[-1] += took

    return wrapper


for owner, names in [
    (
        P.LogitSpecProposer,
        ["propose", "_adaptive", "_add_floor", "_add_candidates", "_add_other_sources", "observe", "_chain"],
    ),
    (PL.NodePool, ["plan", "tree", "__init__"]),
    (NI.NGramIndex, ["find_next", "extend"]),
    (PLD.PLDProposer, ["draft"]),
    (RC.RecycleTable, ["update"]),
]:
    for n in names:
        setattr(owner, n, timed(f"{owner.__name__}.{n}", getattr(owner, n)))
for mod, n in [
    (P, "retrieve"),
    (P, "learn_step"),
    (P, "add_recycled"),
    (P, "synced_index"),
    (P, "store_branches"),
    (R, "continue_match"),
    (R, "top_tokens"),
]:
    setattr(mod, n, timed(n, getattr(mod, n)))
loaded = load_model("smollm2-135m")
engine = loop.Engine(loaded, floor=Floor())
prompts = held_out_prompts(loaded, 1000)
for rnd in range(2):
    engine.generate(prompts[0], parse_method("logitspec").build(loaded), GenerationConfig(max_new_tokens=16))
    spent.clear()
    steps = 0
    for p in prompts:
        out = engine.generate(
            p, parse_method("logitspec").build(loaded), GenerationConfig(max_new_tokens=128)
        )
        steps += out.stats.num_decode_steps
    total = sum(spent.values())
    print(
        f"round {rnd}: {steps} steps, proposer {1e3 * total / steps:.3f} ms a step: "
        + ", ".join(f"{k} {1e3 * v / steps:.3f}" for k, v in spent.most_common()),
        flush=True,
    )
