"""Which attention implementation to run, chosen per pass shape from measurements on this machine.

Why: no one implementation is fastest everywhere. On a CPU in bf16
(`benchmarks/step_cost.py`), PyTorch's SDPA kernel was slightly faster for
short contexts, but for one query over a long cache it took about half the step
where transformers' eager attention (two matrix products and a softmax) took a
small part of it. So each shape (context length, tree
nodes) gets the implementation that measured fastest, timed once per (model,
dtype, device, machine, threads, torch) on a throwaway `TargetModel` and cached
as JSON beside the cost curves (`~/.cache/specdec/attention/`).

The choice is applied between passes (`TargetModel.attention_as`: transformers'
public `set_attn_implementation` checks it once, then the config's attribute is
set, which its setter carries to sub-configs); both implementations take the
same explicit 4-D tree mask, so the choice changes speed, never which tokens are
accepted (up to float rounding, as between any two kernels).

An implementation other than SDPA is chosen only where it measured at least
MIN_GAIN faster: on the first machine, eager won from ~1,000 cached tokens on,
and a tie at 512 had made our bf16 text drift from transformers' own for no gain.

The plan itself (`AttentionPlan`, what the target reads per pass) is in
`attention_plan`; this module measures, caches and resolves it.

Invariants: a plan covers every shape (the nearest measured bucket above, else
the largest); passes larger than the largest measured tree (prefills) use SDPA,
which never materializes a [T, T] score matrix; a plan timed on a busy machine
serves its run but is not cached (see `specdec.backends.timing_cache.contended`).
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from specdec.backends.timing_cache import contended, cost_file, cost_key, write_json_atomic
from specdec.backends.torch.attention_plan import DEFAULT, IMPLEMENTATIONS, AttentionPlan
from specdec.backends.torch.packed import is_invariant
from specdec.backends.torch.target import TargetModel
from specdec.models import LoadedModel, default_cache_dir

CONTEXTS = (128, 512, 1024, 2048)
SIZES = (1, 4, 16, 64)
REPEATS = 5
# Switching costs time each way and a near-tie is noise: another implementation must beat
# SDPA by this factor at a shape to be chosen there.
MIN_GAIN = 1.05
SUBDIR = "attention"


def measure_plan(
    loaded: LoadedModel, contexts: Sequence[int] = CONTEXTS, sizes: Sequence[int] = SIZES, repeats: int = REPEATS
) -> tuple[AttentionPlan, float]:
    """(plan, CPU share of the timing) from timing every implementation at every shape (chains of `size`)."""
    model = loaded.model
    limit = int(getattr(model.config, "max_position_embeddings", 0) or 0)
    target = TargetModel(model)
    generator = torch.Generator().manual_seed(0)
    wall = cpu = 0.0
    rows = []
    try:
        for context in contexts:
            usable = min(context, limit - max(sizes) - 1) if limit else context
            target.prefill(torch.randint(0, model.config.vocab_size, (max(usable, 1),), generator=generator))
            row = []
            for size in sizes:
                tokens, parents = torch.arange(size) % model.config.vocab_size, torch.arange(-1, size - 1)
                timings = dict.fromkeys(IMPLEMENTATIONS, float("inf"))
                w0, c0 = time.perf_counter(), time.process_time()
                for attempt in range(repeats + 1):  # interleaved, so drift hits both alike; 0 warms up
                    for impl in IMPLEMENTATIONS:
                        model.set_attn_implementation(impl)
                        seconds = _timed_pass(target, tokens, parents)
                        timings[impl] = min(timings[impl], seconds) if attempt else timings[impl]
                wall, cpu = wall + time.perf_counter() - w0, cpu + time.process_time() - c0
                best = min(timings, key=timings.get)
                row.append(best if timings[best] * MIN_GAIN < timings[DEFAULT] else DEFAULT)
            rows.append(tuple(row))
    finally:
        model.set_attn_implementation(DEFAULT)
    share = cpu / (wall * torch.get_num_threads()) if wall else 1.0
    return AttentionPlan(tuple(contexts), tuple(sizes), tuple(rows)), share


def _timed_pass(target: TargetModel, tokens: torch.Tensor, parents: torch.Tensor) -> float:
    past = target.num_cached
    start = time.perf_counter()
    target.forward_tree(tokens, parents)
    target.trim(past)
    return time.perf_counter() - start


def plan_file(loaded: LoadedModel, folder: Path | None = None) -> tuple[Path, dict]:
    key = {**cost_key(loaded, SIZES, max(CONTEXTS)), "contexts": list(CONTEXTS), "kind": "attention"}
    return cost_file(folder or default_cache_dir() / SUBDIR, key), key


def save_plan(loaded: LoadedModel, plan: AttentionPlan, folder: Path | None = None) -> None:
    path, key = plan_file(loaded, folder)
    record = {"key": key, "contexts": plan.contexts, "sizes": plan.sizes, "choices": plan.choices}
    write_json_atomic(path, record)


def load_or_measure_plan(
    loaded: LoadedModel, folder: Path | None = None, is_busy: Callable[[float], bool] | None = None
) -> AttentionPlan:
    """The cached plan for this model and machine, measuring (and caching, unless busy) it when absent."""
    path, key = plan_file(loaded, folder)
    try:
        saved = json.loads(path.read_text())
        if saved.get("key") == key:
            return AttentionPlan(tuple(saved["contexts"]), tuple(saved["sizes"]), tuple(map(tuple, saved["choices"])))
    except (OSError, ValueError, KeyError, TypeError):
        pass
    print(f"specdec: timing attention implementations for {loaded.name} once on this machine "
          f"(cache: {path.parent})", file=sys.stderr)
    plan, share = measure_plan(loaded)
    if loaded.device.type != "cpu" or not (is_busy or contended)(share):
        save_plan(loaded, plan, folder)
    return plan


def resolve_plan(loaded: LoadedModel, attention: str | AttentionPlan) -> AttentionPlan:
    """"auto" -> the measured plan; an implementation name -> a plan that always picks it. Where
    verification is batch-invariant (`specdec.backends.torch.packed.is_invariant`), every choice gives way to the
    invariant plan: a node's bits must not depend on the pass's shape."""
    if is_invariant(loaded):
        return AttentionPlan.invariant()
    if isinstance(attention, AttentionPlan):
        return attention
    if attention == "auto":
        return load_or_measure_plan(loaded)
    if attention not in IMPLEMENTATIONS:
        raise ValueError(f"attention must be auto, {', '.join(IMPLEMENTATIONS)} or an AttentionPlan, got {attention!r}")
    return AttentionPlan((max(CONTEXTS),), (max(SIZES),), ((attention,),))
