"""Cost-aware tree budgets: how many draft nodes are worth one forward pass *here*.

Why: a fixed tree budget is tuned for one machine. LogitSpec's paper uses 64
nodes, which is nearly free on a GPU, but on a CPU without AMX a 16-node tree
can cost about twice a one-token step and a 64-node tree several times. The right tree
size depends on the forward-pass cost curve of the model on the machine at hand
*and* on how often the drafts are actually accepted, so both are measured:

- `CostModel`: seconds per target forward pass as a function of the number of
  tree nodes, measured once per (model, dtype, device, machine, threads, torch
  version) on a throwaway target (`registry.timing_target`, its own KV cache: the generation's
  cache is never touched) and cached as JSON under `~/.cache/specdec/costs/`;
  a curve timed while other work took CPU time from ours
  (`timing_cache.contended`) serves its own run but is not cached, so one noisy
  moment does not make every later run timid;
- `AcceptanceStats`: online acceptance rates per node feature (e.g. "root
  branch, 3-gram match, depth 2"), Beta-prior smoothed and windowed so they
  follow the text at hand.

Which nodes pay for their cost is decided from these two by LogitSpec's planner
(`specdec.proposers.logitspec.plan`) and the batch planner.

Invariants: costs are non-decreasing in the tree size (fastest timings, then a
running maximum, so noise never makes a bigger tree look cheaper).
"""

from __future__ import annotations

import json
import time
from bisect import bisect_left
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from specdec.backends.registry import (
    Timed,
    contended,
    cost_file,
    cost_key,
    padded_sizes,
    sequence_runner,
    timing_target,
    write_json_atomic,
)
from specdec.models import LoadedModel, default_cache_dir

DEFAULT_SIZES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)
DEFAULT_REPEATS = 5
DEFAULT_CONTEXT = 384  # committed tokens in the throwaway cache while timing
COSTS_SUBDIR = "costs"


@dataclass(frozen=True)
class CostModel:
    """Forward-pass seconds at a few tree sizes; piecewise-linear in between, linear beyond. With `steps`
    (a GPU's graphs pad every pass to a bucket, and the sizes timed are the buckets), a size between two
    costs what the larger does."""

    sizes: tuple[int, ...]
    seconds: tuple[float, ...]
    steps: bool = False

    def __post_init__(self) -> None:
        if not self.sizes or len(self.sizes) != len(self.seconds):
            raise ValueError("a cost model needs as many timings as sizes, at least one")
        if list(self.sizes) != sorted(set(self.sizes)) or self.sizes[0] < 1:
            raise ValueError(f"sizes must be strictly increasing positive ints, got {self.sizes}")
        if any(not s > 0 for s in self.seconds):
            raise ValueError(f"timings must be positive, got {self.seconds}")

    def cost(self, num_nodes: int) -> float:
        sizes, secs = self.sizes, self.seconds
        if len(sizes) == 1 or num_nodes <= sizes[0]:
            return secs[0]
        if self.steps and num_nodes <= sizes[-1]:
            return secs[bisect_left(sizes, num_nodes)]
        for i in range(1, len(sizes)):
            if num_nodes <= sizes[i]:
                return _line(sizes[i - 1], secs[i - 1], sizes[i], secs[i], num_nodes)
        return _line(sizes[-2], secs[-2], sizes[-1], secs[-1], num_nodes)

    def table(self, max_nodes: int) -> list[float]:
        """[cost(0) = 0, cost(1), ..., cost(max_nodes)], non-decreasing."""
        out = [0.0]
        for n in range(1, max_nodes + 1):
            out.append(max(out[-1], self.cost(n)))
        return out


def _line(x0: int, y0: float, x1: int, y1: float, x: int) -> float:
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0)


# ------------------------------------------------------------------ measuring
def _probe_parents(num_nodes: int) -> torch.Tensor:
    """A star below the root (non-chain from 3 nodes on, like LogitSpec trees: the masked path)."""
    return torch.tensor([-1] + [0] * (num_nodes - 1), dtype=torch.int64)


def measure_costs(
    model: torch.nn.Module,
    sizes: Sequence[int] = DEFAULT_SIZES,
    repeats: int = DEFAULT_REPEATS,
    context_len: int = DEFAULT_CONTEXT,
) -> CostModel:
    """Fastest of `repeats` timings of `TargetModel.forward_tree` per tree size, on a cache of its own."""
    return _measure(sequence_runner(model), sizes, repeats, context_len)[0]


def _measure(target: Timed, sizes: Sequence[int], repeats: int, context_len: int) -> tuple[CostModel, float]:
    """The cost model, and the share of its threads' CPU time the timed passes got (1.0: the cores were ours).

    The minimum, not the median: on a shared machine other processes only ever add
    time, and what the budget needs is the machine's own cost curve. Sizes are
    interleaved within each repetition so that load drifting during the
    measurement spreads over all sizes instead of skewing a few, ascending and
    descending in turn so that every size is also timed right after a size next
    to it, as decoding's steps follow steps of about their size: a one-node pass
    right after a 64-node one runs slower (docs/benchmarks.md), which made 2-3
    nodes look free.
    """
    vocab = int(target.config.vocab_size)  # target: a cache of its own, nobody's generation is touched
    generator = torch.Generator().manual_seed(0)
    context_len = max(1, min(context_len, (target.max_length or context_len + 128) - max(sizes) - 1))
    target.prefill(torch.randint(0, vocab, (context_len,), generator=generator))
    probes = {n: (torch.randint(0, vocab, (n,), generator=generator), _probe_parents(n)) for n in sizes}
    sync = torch.cuda.synchronize if target.device.type == "cuda" else (lambda: None)

    def timed(n: int) -> float:
        sync()
        start = time.perf_counter()
        target.forward_tree(*probes[n])
        sync()
        elapsed = time.perf_counter() - start
        target.trim(context_len)
        return elapsed

    for n in sizes:  # warm-up: first calls pay for allocations
        timed(n)
    samples: dict[int, list[float]] = {n: [] for n in sizes}
    wall, cpu = time.perf_counter(), time.process_time()
    for repeat in range(repeats):
        for n in (sizes if repeat % 2 == 0 else sizes[::-1]):
            samples[n].append(timed(n))
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    seconds, floor = [], 0.0
    for n in sizes:
        floor = max(floor, min(samples[n]))
        seconds.append(floor)
    return CostModel(tuple(sizes), tuple(seconds)), cpu / max(wall * torch.get_num_threads(), 1e-9)


def load_or_measure(
    loaded: LoadedModel,
    costs_dir: str | Path | None = None,
    sizes: Sequence[int] = DEFAULT_SIZES,
    repeats: int = DEFAULT_REPEATS,
    context_len: int = DEFAULT_CONTEXT,
    remeasure: bool = False,
    is_busy: Callable[[float], bool] = contended,
) -> CostModel:
    """The cached cost model for this model and machine, measuring (and caching) it when absent.

    A curve measured while `is_busy(cpu_share)` (see `contended`) is not cached: it serves
    this run only (CPU only; a GPU is not shared that way).
    """
    folder = costs_folder(costs_dir)
    sizes, steps = curve_sizes(loaded, sizes)
    key = cost_key(loaded, sizes, context_len)
    cached = None if remeasure else load_costs(folder, key)
    if cached is not None:
        return cached
    target = timing_target(loaded)
    try:
        costs, cpu_share = _measure(target, sizes, repeats, context_len)
        costs = replace(costs, steps=steps)
    finally:  # a target on batch rows holds a sequence (llama.cpp: its id and KV cells) until closed
        if hasattr(target, "close"):
            target.close()
    if loaded.device.type == "cpu" and is_busy(cpu_share):
        return costs  # timed while other work held the cores: good for this run, not for every later one
    save_costs(folder, key, costs)
    return costs


def curve_sizes(loaded: LoadedModel, sizes: Sequence[int] = DEFAULT_SIZES) -> tuple[tuple[int, ...], bool]:
    """The tree sizes `loaded`'s cost curve is timed at, and whether it is a staircase (`CostModel.steps`):
    where every pass runs padded to a bucket (a GPU's graphs), the buckets `sizes` fall in."""
    buckets = padded_sizes(loaded, sizes)
    return (tuple(sizes), False) if buckets is None else (buckets, True)


def costs_folder(costs_dir: str | Path | None = None) -> Path:
    return Path(costs_dir).expanduser() if costs_dir else default_cache_dir() / COSTS_SUBDIR


def load_costs(folder: Path, key: dict) -> CostModel | None:
    """The curve cached under `key`, or None when absent, unreadable or recorded for another key."""
    try:
        saved = json.loads(cost_file(folder, key).read_text())
        if saved.get("key") == key:
            return CostModel(tuple(saved["sizes"]), tuple(saved["seconds"]), bool(saved.get("steps", False)))
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return None


def save_costs(folder: Path, key: dict, costs: CostModel) -> None:
    record = {"key": key, "sizes": list(costs.sizes), "seconds": list(costs.seconds), "steps": costs.steps,
              "measured_at": time.time()}
    write_json_atomic(cost_file(folder, key), record)


# ------------------------------------------------------------------ acceptance
class AcceptanceStats:
    """Acceptance rate per feature key: (accepted + prior) / (offered + prior strength), windowed.

    `prior(key) -> (mean, strength)` seeds a key the first time it is seen. Once a
    key's offered count passes `window`, both counts are scaled back to `window`,
    which keeps the mean and makes older observations fade geometrically.
    """

    __slots__ = ("_counts", "_prior", "window")

    def __init__(self, prior: Callable[[Hashable], tuple[float, float]], window: float = 200.0) -> None:
        if window <= 0:
            raise ValueError(f"window must be > 0, got {window}")
        self._counts: dict[Hashable, list[float]] = {}
        self._prior = prior
        self.window = window

    def _entry(self, key: Hashable) -> list[float]:
        entry = self._counts.get(key)
        if entry is None:
            mean, strength = self._prior(key)
            entry = self._counts[key] = [mean * strength, strength]
        return entry

    def rate(self, key: Hashable) -> float:
        accepted, offered = self._entry(key)
        return accepted / offered

    def update(self, key: Hashable, offered: float, accepted: float) -> None:
        entry = self._entry(key)
        entry[0] += accepted
        entry[1] += offered
        if entry[1] > self.window:
            scale = self.window / entry[1]
            entry[0] *= scale
            entry[1] = self.window

    def snapshot(self) -> dict[Hashable, tuple[float, float]]:
        """key -> (rate, effective number of observations incl. the prior), for reports and tuning."""
        return {key: (acc / off, off) for key, (acc, off) in self._counts.items()}
